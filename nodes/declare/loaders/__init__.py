"""Nodes that load, save and place model files: checkpoints, diffusion models, text encoders, VAEs, LoRAs, ControlNets."""
