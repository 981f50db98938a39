"""Qwen-Image (and Qwen-Image-Edit): the MMDiT that reads Qwen2.5-VL 7B text features and samples in the Wan 2.1 latent."""
