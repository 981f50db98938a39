"""IMAGE and MASK nodes: load, save, transform, filter, crop, upscale, pose and background removal."""
