"""`mixgraph bench`: the engine-overhead and precision benchmarks."""
