"""A pack that needs a ComfyUI internal mixgraph does not provide."""

import comfy.sd  # noqa: F401

NODE_CLASS_MAPPINGS = {}
