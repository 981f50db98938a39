"""Sampler nodes: KSampler and the custom-sampling group (samplers, sigmas, guiders, noise)."""
