"""The HTTP/WebSocket server: ComfyUI's API, the web editor and our extension (web/), the prompt queue and the job store."""
