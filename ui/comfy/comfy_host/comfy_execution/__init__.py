"""ComfyUI's `comfy_execution` for custom node packs: `graph_utils` (GraphBuilder, is_link,
ExecutionBlocker), `graph` (ExecutionBlocker), `utils` (the executing context)."""
