"""Lumina Image 2.0 and Z-Image: one NextDiT model (``nextdit.py``), two families (``family.py``)."""
