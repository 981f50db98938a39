"""Model families: the seam (``base.py``), the registry (``registry.py``), the table of families
mixgraph does not run (``refused.py``) and one folder per family (``sd/``). Kept empty so that
importing a family's model file does not load every registered family."""
