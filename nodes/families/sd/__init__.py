"""SD 1.x / 2.x / SDXL behind the family seam (``family.SD``; ``detect.py``, ``runner.py``)."""
