"""ComfyUI's `comfy_api` for custom node packs: `comfy_api.latest` (the V3 node schema `io`, `ui`
outputs, `ComfyExtension`, and the progress API `ComfyAPI` / `ComfyAPISync`)."""
