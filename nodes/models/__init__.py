"""Model handles and the loader that makes them, and what every family shares: attention, resize, model-call patches, weight hooks, the embedded model."""
