"""Node declarations, one folder per concept; nodes/library.py imports every module."""
