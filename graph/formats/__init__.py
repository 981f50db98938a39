"""Workflow files: the accepted formats (API, envelope, ComfyUI UI-format) read into graph.prompt's types, UI-format export and subgraph expansion."""
