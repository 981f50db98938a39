"""Qwen-Image and its Edit models: the MMDiT reading Qwen2.5-VL 7B text, sampling in the Wan 2.1 latent."""
