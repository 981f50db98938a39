"""What adapts a diffusion model without being one: LoRA (merged and bypass), ControlNets, T2I-Adapters, GLIGEN, style models, PhotoMaker, hypernetworks, SUPIR."""
