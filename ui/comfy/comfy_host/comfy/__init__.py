"""ComfyUI's `comfy` package as mixgraph provides it to custom node packs: `comfy.utils`,
`comfy.model_management`, `comfy.comfy_types`, `comfy.cli_args`. Other `comfy.*` modules (model
classes, samplers, ModelPatcher) are ComfyUI internals mixgraph does not have; importing one
fails with a message naming the pack and the module."""
