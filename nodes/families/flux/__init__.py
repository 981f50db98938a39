"""The Flux.1 family (dev, schnell, Kontext, Fill, Canny / Depth) and Chroma: model, detection, runner, nodes' helpers."""
