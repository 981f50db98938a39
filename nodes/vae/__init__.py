"""Autoencoders between pixels and latents (the KL VAE, TAESD) and the latent formats that relate a VAE's latent to a model's."""
