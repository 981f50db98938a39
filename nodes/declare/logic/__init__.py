"""Value and control-flow nodes: primitives, switches, loops, preview as text."""
