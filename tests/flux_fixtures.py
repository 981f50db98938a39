"""Tiny Flux.1 / Chroma weights in the real key layouts, for tests (seeded default init)."""

from __future__ import annotations

import torch
from torch import Tensor

from mixgraph.nodes.families.flux.model import Flux, FluxConfig, default_axes_dim

# context and pooled widths equal the tiny SD CLIP fixture's (tests/fixtures/tiny_clip.py: 32), so
# CLIPLoader type stable_diffusion can condition it until the T5 encoder lands
TINY = FluxConfig(in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=64, num_heads=2,
                  depth=2, depth_single_blocks=2, axes_dim=default_axes_dim(32), guidance_embed=True)


def flux_state_dict(cfg: FluxConfig = TINY, seed: int = 0) -> dict[str, Tensor]:
    """Random weights; RMS scales and the zero-initialised-in-training output layer made non-trivial."""
    torch.manual_seed(seed)
    model = Flux(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".scale"):
                p.uniform_(0.5, 1.5)
        model.final_layer.linear.weight.mul_(0.5)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def tiny_vae16_state_dict(seed: int = 0) -> dict[str, Tensor]:
    """A tiny 16-channel KL autoencoder (the Flux / SD3 shape: no quant convs), LDM keys."""
    from mixgraph.nodes.vae.vae import AutoencoderKL, VAEConfig
    from mixgraph.nodes.weights.synthetic import module_shapes, random_state_dict

    cfg = VAEConfig(ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1, z_channels=16, embed_dim=16, use_quant_conv=False)
    return random_state_dict(module_shapes(lambda: AutoencoderKL(cfg)), seed)


def write_flux_models(root, seed: int = 3) -> dict[str, Tensor]:
    """models/diffusion_models/flux_tiny.safetensors (ComfyUI layout), flux_tiny_diffusers.safetensors
    (diffusers' keys, one file), flux_tiny_diffusers/transformer/ (a diffusers folder), the tiny SD
    CLIP-L in text_encoders/, a 16-channel VAE in vae/. Returns the BFL state dict."""
    from pathlib import Path

    from safetensors.torch import save_file

    from mixgraph.nodes.families.flux import diffusers_keys
    from tests.fixtures.checkpoints import write_clip_l

    root = Path(root)
    sd = flux_state_dict(TINY, seed=seed)
    for sub in ("diffusion_models", "text_encoders", "vae", "diffusion_models/flux_tiny_diffusers/transformer"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    save_file(sd, str(root / "diffusion_models" / "flux_tiny.safetensors"))
    diff = {k: v.contiguous() for k, v in diffusers_keys.to_diffusers(sd, diffusers_flux_keys(TINY)).items()}
    save_file(diff, str(root / "diffusion_models" / "flux_tiny_diffusers.safetensors"))
    save_file(diff, str(root / "diffusion_models" / "flux_tiny_diffusers" / "transformer"
                      / "diffusion_pytorch_model.safetensors"))
    write_clip_l(root / "text_encoders" / "clip_l_tiny.safetensors", seed=4)
    save_file({k: v.contiguous() for k, v in tiny_vae16_state_dict(5).items()}, str(root / "vae" / "vae16.safetensors"))
    return sd


def diffusers_flux_keys(cfg: FluxConfig) -> list[str]:
    """The state-dict keys of diffusers' FluxTransformer2DModel for ``cfg`` (built on the meta device)."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        ref = FluxTransformer2DModel(patch_size=1, in_channels=cfg.in_channels * 4, out_channels=cfg.out_channels * 4,
                                     num_layers=cfg.depth, num_single_layers=cfg.depth_single_blocks,
                                     attention_head_dim=cfg.head_dim, num_attention_heads=cfg.num_heads,
                                     joint_attention_dim=cfg.context_in_dim, pooled_projection_dim=cfg.vec_in_dim,
                                     guidance_embeds=cfg.guidance_embed, axes_dims_rope=cfg.axes_dim)
    return list(ref.state_dict().keys())


def chroma_tiny_config():
    from mixgraph.nodes.families.flux.chroma import ChromaConfig

    return ChromaConfig(in_channels=16, out_channels=16, context_in_dim=32, hidden_size=64, num_heads=2, depth=2,
                        depth_single_blocks=2, axes_dim=default_axes_dim(32), approximator_hidden=48,
                        approximator_layers=2)


def chroma_state_dict(cfg=None, seed: int = 0) -> dict[str, Tensor]:
    from mixgraph.nodes.families.flux.chroma import Chroma

    torch.manual_seed(seed)
    model = Chroma(cfg or chroma_tiny_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".scale"):
                p.uniform_(0.5, 1.5)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def diffusers_chroma(cfg, device=None):
    from diffusers import ChromaTransformer2DModel

    return ChromaTransformer2DModel(patch_size=1, in_channels=cfg.in_channels * 4, out_channels=cfg.out_channels * 4,
                                    num_layers=cfg.depth, num_single_layers=cfg.depth_single_blocks,
                                    attention_head_dim=cfg.head_dim, num_attention_heads=cfg.num_heads,
                                    joint_attention_dim=cfg.context_in_dim, axes_dims_rope=cfg.axes_dim,
                                    approximator_num_channels=64, approximator_hidden_dim=cfg.approximator_hidden,
                                    approximator_layers=cfg.approximator_layers)
