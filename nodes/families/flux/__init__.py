"""The Flux.1 family (dev, schnell, Kontext, Fill, Canny / Depth) and Chroma: models, detection, runner."""
