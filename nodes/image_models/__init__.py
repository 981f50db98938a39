"""Pixel-space models: ESRGAN-family upscalers and BiRefNet background removal."""
