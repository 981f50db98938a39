"""Seeded random checkpoints in real layouts: for the demo, tests and benchmarks, never downloaded.

Weights are built from our own modules' state-dict shapes (attribute names equal checkpoint keys),
so a file written here has exactly the layout of a real single-file SD1.x checkpoint:
`model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.transformer.text_model.*`.
`size="full"` gives the real SD 1.5 architecture (about 1.07 B parameters); "tiny" a few MB.

`module_shapes` + `random_state_dict` are the one seeded-weight generator: the test fixtures
(tests/fixtures) build their tiny UNets, VAEs, CLIPs and ControlNets with them too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file
from torch import nn

from mixgraph.nodes.models.clip import CLIPTextConfig, CLIPTextModel
from mixgraph.nodes.models.unet import UNetConfig, UNetModel
from mixgraph.nodes.models.vae import AutoencoderKL, VAEConfig

SD15_UNET = UNetConfig()  # the defaults are SD 1.5's
SD15_VAE = VAEConfig()
SD15_CLIP = CLIPTextConfig(vocab_size=49408, width=768, layers=12, heads=12, max_positions=77,
                           intermediate=3072, projection_dim=None, activation="quick_gelu")

TINY_UNET = UNetConfig(model_channels=32, channel_mult=(1, 2), num_res_blocks=(1, 1),
                       transformer_depth=(1, 1), transformer_depth_output=(1, 1, 1, 1),
                       transformer_depth_middle=1, context_dim=64, num_heads=8)
TINY_VAE = VAEConfig(ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1)
TINY_CLIP = CLIPTextConfig(vocab_size=49408, width=64, layers=2, heads=4, max_positions=77,
                           intermediate=128, projection_dim=None, activation="quick_gelu")


def module_shapes(factory: Callable[[], nn.Module]) -> dict[str, tuple[int, ...]]:
    """State-dict shapes of a module built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        module = factory()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int,
                      dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Seeded weights with sane activation scales, drawn in sorted key order (so the result depends
    only on the key set): matrices ~ N(0, 1/fan_in), norm scales ~ 1 + 0.1 N, biases ~ 0.05 N.
    Layers that training zero-initialises get random values too, so miswiring changes outputs."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key in sorted(shapes):
        shape = shapes[key]
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if len(shape) >= 2:
            t = t * math.prod(shape[1:]) ** -0.5
        elif key.endswith("weight"):
            t = 1.0 + 0.1 * t
        else:
            t = 0.05 * t
        out[key] = t.to(dtype)
    return out


def _prefixed(prefix: str, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in sd.items()}


def sd15_checkpoint(size: str = "tiny", seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A single-file SD1.x checkpoint state dict ("tiny" or "full" architecture)."""
    unet, vae, clip = (SD15_UNET, SD15_VAE, SD15_CLIP) if size == "full" else (TINY_UNET, TINY_VAE, TINY_CLIP)
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', not {size!r}")
    sd = _prefixed("model.diffusion_model.",
                   random_state_dict(module_shapes(lambda: UNetModel(unet)), seed, dtype))
    sd |= _prefixed("first_stage_model.",
                    random_state_dict(module_shapes(lambda: AutoencoderKL(vae)), seed + 1, dtype))
    text = random_state_dict(module_shapes(lambda: CLIPTextModel(clip)), seed + 2, dtype)
    # position ids are a buffer in some exporters; real SD1 files carry them, harmless either way
    sd |= _prefixed("cond_stage_model.transformer.", text)
    return sd


def write_sd15_checkpoint(path: str | Path, size: str = "tiny", seed: int = 0,
                          dtype: torch.dtype = torch.float32) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd15_checkpoint(size, seed, dtype), str(path))
    return path
