"""LATENT nodes: empty latents, batches, composites, transforms, latent files."""
