"""Seeded random checkpoints in real layouts: for the demo, tests and benchmarks, never downloaded.

Weights are built from our own modules' state-dict shapes (attribute names equal checkpoint keys),
so a file written here has exactly the layout of a real single-file SD1.x checkpoint:
`model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.transformer.text_model.*`.
`size="full"` gives the real SD 1.5 architecture (about 1.07 B parameters); "tiny" a few MB.

`sdxl_checkpoint` / `write_sdxl_checkpoint` do the same for SDXL base in its single-file layout:
`model.diffusion_model.*`, `first_stage_model.*`, CLIP-L under
`conditioner.embedders.0.transformer.text_model.*` and OpenCLIP ViT-bigG under
`conditioner.embedders.1.model.*` (fused `in_proj`, `text_projection` stored [width, proj]). Full
size is about 3.5 B parameters (UNet 2.57 B, CLIP-G 695 M, CLIP-L 123 M, VAE 84 M), 13.9 GB in
f32, so the writer streams: the header is computed from shapes, then each tensor is drawn and
written in turn (peak memory: one tensor, at most the 253 MB bigG token table in f32).

`module_shapes` + `random_state_dict` are the one seeded-weight generator: the test fixtures
(tests/fixtures) build their tiny UNets, VAEs, CLIPs and ControlNets with them too.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import save_file
from torch import nn

from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel
from mixgraph.nodes.families.sd.unet import UNetConfig, UNetModel
from mixgraph.nodes.vae.vae import AutoencoderKL, VAEConfig

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


SDXL_UNET = UNetConfig(
    model_channels=320, channel_mult=(1, 2, 4), num_res_blocks=(2, 2, 2),
    transformer_depth=(0, 0, 2, 2, 10, 10), transformer_depth_output=(10, 10, 10, 2, 2, 2, 0, 0, 0),
    transformer_depth_middle=10, context_dim=2048, use_linear_in_transformer=True,
    adm_in_channels=2816, num_heads=-1, num_head_channels=64)
SDXL_CLIP_L = CLIPTextConfig(vocab_size=49408, width=768, layers=12, heads=12, max_positions=77,
                             intermediate=3072, projection_dim=None, activation="quick_gelu")
SDXL_CLIP_G = CLIPTextConfig(vocab_size=49408, width=1280, layers=32, heads=20, max_positions=77,
                             intermediate=5120, projection_dim=1280, activation="gelu")

# the tiny SDXL: the UNet's context is the two text widths side by side, its vector input the
# pooled CLIP-G projection + 6 size embeddings of 256, as in the full model
TINY_SDXL_CLIP_L = CLIPTextConfig(vocab_size=49408, width=32, layers=2, heads=2, max_positions=77,
                                  intermediate=128, projection_dim=None, activation="quick_gelu")
TINY_SDXL_CLIP_G = CLIPTextConfig(vocab_size=49408, width=32, layers=2, heads=2, max_positions=77,
                                  intermediate=128, projection_dim=32, activation="gelu")
TINY_SDXL_UNET = UNetConfig(
    model_channels=64, channel_mult=(1, 2), num_res_blocks=(1, 1), transformer_depth=(0, 2),
    transformer_depth_output=(2, 2, 0, 0), transformer_depth_middle=2, context_dim=64,
    use_linear_in_transformer=True, adm_in_channels=32 + 6 * 256, num_heads=-1, num_head_channels=64)

SDXL_PREFIXES = ("model.diffusion_model.", "first_stage_model.",
                 "conditioner.embedders.0.transformer.", "conditioner.embedders.1.model.")


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
    return dict(_random_tensors(shapes, seed, dtype))


def _random_tensors(shapes: dict[str, tuple[int, ...]], seed: int,
                    dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """`random_state_dict`'s tensors one at a time, in its (sorted key) order."""
    gen = torch.Generator().manual_seed(seed)
    for key in sorted(shapes):
        shape = shapes[key]
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if len(shape) >= 2:
            t = t * math.prod(shape[1:]) ** -0.5
        elif key.endswith("weight"):
            t = 1.0 + 0.1 * t
        else:
            t = 0.05 * t
        yield key, t.to(dtype)


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


# --------------------------------------------------------------------------------------------
# SDXL base


def open_clip_shapes(config: CLIPTextConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of an OpenCLIP text tower (SD2 / SDXL layout, no prefix) with our CLIP module's
    sizes: its HF-layout state dict renamed by the checkpoint saver's own mapping, on meta
    tensors (q/k/v fused into `attn.in_proj_*`, `text_projection` transposed to [width, proj])."""
    from mixgraph.nodes.weights.save import hf_to_open_clip

    with torch.device("meta"):
        sd = CLIPTextModel(config).state_dict()
    sd = {k: v for k, v in sd.items() if not k.endswith("position_ids")}
    return {k: tuple(v.shape) for k, v in hf_to_open_clip(sd).items()}


def sdxl_parts(size: str, seed: int) -> list[tuple[str, dict[str, tuple[int, ...]], int]]:
    """(key prefix, shapes, seed) of each component of an SDXL base checkpoint."""
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', not {size!r}")
    full = size == "full"
    unet, vae = (SDXL_UNET, SD15_VAE) if full else (TINY_SDXL_UNET, TINY_VAE)
    clip_l, clip_g = (SDXL_CLIP_L, SDXL_CLIP_G) if full else (TINY_SDXL_CLIP_L, TINY_SDXL_CLIP_G)
    shapes = [module_shapes(lambda: UNetModel(unet)), module_shapes(lambda: AutoencoderKL(vae)),
              module_shapes(lambda: CLIPTextModel(clip_l)), open_clip_shapes(clip_g)]
    return [(prefix, sh, seed + i) for i, (prefix, sh) in enumerate(zip(SDXL_PREFIXES, shapes))]


def _logit_scale(dtype: torch.dtype) -> torch.Tensor:
    # ln(100), as in real files; the text tower does not use it
    return torch.tensor(math.log(100.0), dtype=dtype)


def sdxl_checkpoint(size: str = "tiny", seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A single-file SDXL base checkpoint state dict in memory ("tiny"; "full" is 13.9 GB in
    f32: use `write_sdxl_checkpoint`, which streams). The same tensors as the file it writes."""
    sd: dict[str, torch.Tensor] = {}
    for prefix, shapes, s in sdxl_parts(size, seed):
        sd |= _prefixed(prefix, random_state_dict(shapes, s, dtype))
    sd[SDXL_PREFIXES[3] + "logit_scale"] = _logit_scale(dtype)
    return sd


_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def write_sdxl_checkpoint(path: str | Path, size: str = "tiny", seed: int = 0,
                          dtype: torch.dtype = torch.float32) -> Path:
    """Write `sdxl_checkpoint(size, seed, dtype)` as a safetensors file, one tensor at a time
    (the header first, from shapes), atomically (a `.partial` name, then renamed)."""
    if dtype not in _ST_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(map(str, _ST_DTYPES))}, not {dtype}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = sdxl_parts(size, seed)
    item = torch.empty((), dtype=dtype).element_size()
    header: dict[str, dict] = {}
    offset = 0

    def entry(key: str, shape: tuple[int, ...]) -> None:
        nonlocal offset
        n = math.prod(shape) * item
        header[key] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape),
                       "data_offsets": [offset, offset + n]}
        offset += n

    for prefix, shapes, _ in parts:
        for key in sorted(shapes):
            entry(prefix + key, shapes[key])
    entry(SDXL_PREFIXES[3] + "logit_scale", ())
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            tensors = [(prefix, _random_tensors(shapes, s, dtype)) for prefix, shapes, s in parts]
            tensors.append((SDXL_PREFIXES[3], iter([("logit_scale", _logit_scale(dtype))])))
            for prefix, stream in tensors:
                for name, t in stream:
                    key = prefix + name
                    data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
                    if len(data) != header[key]["data_offsets"][1] - header[key]["data_offsets"][0]:
                        raise AssertionError(f"{key}: {len(data)} bytes, header says otherwise")
                    f.write(data.data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_header_only(path: str | Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> None:
    """A safetensors file with these tensor shapes whose data is a hole (a sparse file): loaders
    and the memory estimate read only the header, so a full-size model costs no disk (tests of the
    estimate and of refusals on 14B-class models)."""
    import struct

    header, offset = {}, 0
    item = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    for k, s in shapes.items():
        n = item * math.prod(s)
        header[k] = {"dtype": dtype, "shape": list(s), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)
