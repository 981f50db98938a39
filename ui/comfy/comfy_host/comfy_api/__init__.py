"""ComfyUI's `comfy_api` for custom node packs: `comfy_api.latest` (the V3 node schema `io`, `ui`
outputs, `ComfyExtension`, the value types `Input` / `InputImpl` / `Types`, and the progress API
`ComfyAPI` / `ComfyAPISync`), and the versions a pack may pin (`v0_0_1`, `v0_0_2`, `v0_0_3`,
listed in `version_list`), each a thin layer over `latest`."""
