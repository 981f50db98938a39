"""Every way a person uses mixgraph: the CLI, the Python API, the demo and the memory estimate here; the server, ComfyUI compatibility, Ray and benchmarks in subpackages."""
