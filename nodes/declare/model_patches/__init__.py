"""Nodes that return a patched MODEL: guidance, attention, speed and context-window patches, merges, precision pins, SUPIR."""
