"""T2I-Adapters (Mou et al. 2023, "T2I-Adapter", arXiv:2302.08453), loaded by ControlNetLoader
as ComfyUI does (``comfy/controlnet.py: load_t2i_adapter``, ``comfy/t2i_adapter/adapter.py``).

The hint image (resized to the latent × 8, rounded up to the pixel-unshuffle factor; 1-channel
adapters get the channel mean) is pixel-unshuffled (8, or 16 for SDXL adapters) and run once per
size through ResNet stages, one feature map per UNet level. Unlike a ControlNet's residuals
(added to the skip connections), the features are added to the UNet's main path after input
block k (``Control.input_path``; ComfyUI's ``control["input"]``): SD1/SD2 adapters give one map
every third block (after each level's last ResBlock), SDXL adapters 3 maps into the input blocks
and the last one after the middle block. Every map is multiplied by the strength; the
start/end percent gate the adapter as a ControlNet's.

Layouts: the original ``conv_in`` + ``body.N.{in_conv, block1, block2, down_opt.op}`` (full),
the light ``body.N.{in_conv, body.M.block1/2, out_conv}`` and diffusers'
``adapter.body.I.resnets.J.*`` (renamed to body.(2I+J)). Sizes come from shapes; SDXL adapters
are those whose unshuffled input has 256 or 768 channels (ComfyUI's rule).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.nodes.payloads.conditioning import Control

__all__ = ["T2IConfig", "T2IAdapter", "T2IAdapterHandle", "T2IAdapterChain", "t2i_config_from_shapes",
           "diffusers_t2i_rename", "is_t2i_adapter", "load_t2i_adapter"]


@dataclass(frozen=True)
class T2IConfig:
    kind: str                    # "full" | "light"
    cin: int                     # channels after pixel-unshuffle
    channels: tuple[int, ...]    # per level
    nums_rb: int
    ksize: int = 3
    use_conv: bool = False       # full: stride-2 conv downsampling (else 2x2 average pooling)
    xl: bool = False

    @property
    def unshuffle(self) -> int:
        return 16 if self.xl else 8

    @property
    def input_channels(self) -> int:
        return self.cin // (self.unshuffle * self.unshuffle)


class _Down(nn.Module):
    def __init__(self, channels: int, use_conv: bool):
        super().__init__()
        self.use_conv = use_conv
        if use_conv:
            self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        if self.use_conv:
            return self.op(x)
        # 2x2 average pooling padded by one row/column on odd sizes (ComfyUI's Downsample)
        return F.avg_pool2d(x, 2, 2, padding=(x.shape[2] % 2, x.shape[3] % 2))


class ResnetBlock(nn.Module):
    """T2I-Adapter's residual block (sk=True: identity skip, 1x1/ksize in_conv when widths differ)."""

    def __init__(self, in_c: int, out_c: int, down: bool, ksize: int, use_conv: bool):
        super().__init__()
        if down:
            self.down_opt = _Down(in_c, use_conv)
        self.in_conv = nn.Conv2d(in_c, out_c, ksize, 1, ksize // 2) if in_c != out_c else None
        self.block1 = nn.Conv2d(out_c, out_c, 3, 1, 1)
        self.block2 = nn.Conv2d(out_c, out_c, ksize, 1, ksize // 2)

    def forward(self, x: Tensor) -> Tensor:
        if hasattr(self, "down_opt"):
            x = self.down_opt(x)
        if self.in_conv is not None:
            x = self.in_conv(x)
        return x + self.block2(F.relu(self.block1(x)))


class _LightBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block1 = nn.Conv2d(c, c, 3, 1, 1)
        self.block2 = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block2(F.relu(self.block1(x)))


class _Extractor(nn.Module):
    def __init__(self, in_c: int, inter_c: int, out_c: int, nums_rb: int, down: bool):
        super().__init__()
        self.down = down
        self.in_conv = nn.Conv2d(in_c, inter_c, 1)
        self.body = nn.Sequential(*[_LightBlock(inter_c) for _ in range(nums_rb)])
        self.out_conv = nn.Conv2d(inter_c, out_c, 1)

    def forward(self, x: Tensor) -> Tensor:
        if self.down:
            x = F.avg_pool2d(x, 2, 2, padding=(x.shape[2] % 2, x.shape[3] % 2))
        return self.out_conv(self.body(self.in_conv(x)))


class T2IAdapter(nn.Module):
    """``forward(hint [B, c, H, W]) -> (features, middle)``: ``features`` one entry per UNet input
    block in call order (None where nothing is added), ``middle`` the SDXL adapters' last map."""

    keep_f32: tuple[str, ...] = ()

    def __init__(self, config: T2IConfig):
        super().__init__()
        c = config
        self.config = c
        ch = c.channels
        if c.kind == "light":
            self.body = nn.ModuleList(
                _Extractor(c.cin if i == 0 else ch[i - 1], ch[i] // 4, ch[i], c.nums_rb, down=i > 0)
                for i in range(len(ch)))
            return
        down_levels, widen_levels = ({2}, {1}) if c.xl else ({1, 2, 3}, set())
        blocks = []
        for i in range(len(ch)):
            for j in range(c.nums_rb):
                first = j == 0 and (i in down_levels or i in widen_levels)
                blocks.append(ResnetBlock(ch[i - 1] if first else ch[i], ch[i], first and i in down_levels,
                                          c.ksize, c.use_conv))
        self.body = nn.ModuleList(blocks)
        self.conv_in = nn.Conv2d(c.cin, ch[0], 3, 1, 1)

    def forward(self, hint: Tensor) -> tuple[list[Tensor | None], Tensor | None]:
        c = self.config
        x = F.pixel_unshuffle(hint, c.unshuffle)  # [B, c·u², H/u, W/u]
        features: list[Tensor | None] = []
        if c.kind == "light":
            for stage in self.body:
                x = stage(x)
                features += [None, None, x]
            return features, None
        x = self.conv_in(x)
        for i in range(len(c.channels)):
            for j in range(c.nums_rb):
                x = self.body[i * c.nums_rb + j](x)
            if c.xl:
                features += [None] * {0: 3, 2: 2}.get(i, 1)
            else:
                features += [None, None]
            features.append(x)
        if c.xl:
            return features[:-1], features[-1]
        return features, None


def diffusers_t2i_rename(key: str) -> str:
    """diffusers' ``adapter.body.I.resnets.J.`` -> ``body.(2I+J).``; ``adapter.`` dropped."""
    m = re.match(r"adapter\.body\.(\d+)\.resnets\.(\d+)\.(.*)$", key)
    if m:
        return f"body.{int(m.group(1)) * 2 + int(m.group(2))}.{m.group(3)}"
    m = re.match(r"adapter\.body\.(\d+)\.(.*)$", key)
    if m:
        return f"body.{int(m.group(1)) * 2}.{m.group(2)}"
    return key[len("adapter."):] if key.startswith("adapter.") else key


def is_t2i_adapter(keys) -> bool:
    keys = set(keys)
    return ("adapter.body.0.resnets.0.block1.weight" in keys or "body.0.in_conv.weight" in keys
            or ("conv_in.weight" in keys and "body.0.block2.weight" in keys))


def t2i_config_from_shapes(shapes: dict[str, tuple[int, ...]]) -> T2IConfig:
    """Shapes in the original layout (after ``diffusers_t2i_rename``)."""
    n_body = 0
    while any(k.startswith(f"body.{n_body}.") for k in shapes):
        n_body += 1
    if "body.0.in_conv.weight" in shapes and "conv_in.weight" not in shapes:  # light
        levels = n_body
        rb = 0
        while f"body.0.body.{rb}.block1.weight" in shapes:
            rb += 1
        return T2IConfig("light", cin=shapes["body.0.in_conv.weight"][1],
                         channels=tuple(shapes[f"body.{i}.out_conv.weight"][0] for i in range(levels)), nums_rb=rb)
    cin, channel = shapes["conv_in.weight"][1], shapes["conv_in.weight"][0]
    xl = cin in (256, 768)
    use_conv = any(k.endswith("down_opt.op.weight") for k in shapes)
    return T2IConfig("full", cin=cin, channels=(channel, channel * 2, channel * 4, channel * 4),
                     nums_rb=max(1, n_body // 4), ksize=shapes["body.0.block2.weight"][2], use_conv=use_conv, xl=xl)


@dataclass(frozen=True)
class T2IAdapterHandle:
    """CONTROL_NET holding a T2I-Adapter (ControlNetLoader gives either kind)."""

    source: WeightSource
    config: T2IConfig
    diffusers: bool = False
    precision: PolicyLike | None = None

    @property
    def chain_type(self):
        """What ``controlnet.apply_controlnet`` chains onto a cond for this net."""
        return T2IAdapterChain

    def runner(self, policy: PolicyLike) -> T2IAdapter:
        rename = diffusers_t2i_rename if self.diffusers else None
        m = store.materialize("t2i_adapter", self.source, self.config, policy.storage, (), T2IAdapter, rename)
        return apply_precision(m, policy)

    def with_precision(self, policy: PolicyLike | None) -> "T2IAdapterHandle":
        return dataclasses.replace(self, precision=policy)


def load_t2i_adapter(path: str | os.PathLike, info=None) -> T2IAdapterHandle:
    info = inspect_file(path) if info is None else info
    diffusers = "adapter.body.0.resnets.0.block1.weight" in info
    shapes = {(diffusers_t2i_rename(k) if diffusers else k): tuple(v.shape) for k, v in info.items()}
    return T2IAdapterHandle(WeightSource.from_file(path), t2i_config_from_shapes(shapes), diffusers)


def _hint_size(h: int, w: int, unshuffle: int) -> tuple[int, int]:
    return math.ceil(h * 8 / unshuffle) * unshuffle, math.ceil(w * 8 / unshuffle) * unshuffle


@dataclass(frozen=True, eq=False)
class T2IAdapterChain:
    """One applied T2I-Adapter on top of the previous chain (a ControlNet's or another adapter's).
    Same contract as ``controlnet.ControlNetChain.residuals``. The features of a latent size are
    computed once and kept (ComfyUI computes them once per size too)."""

    runner: T2IAdapter
    hint: Tensor
    strength: float = 1.0
    start_percent: float = 0.0
    end_percent: float = 1.0
    previous: object | None = None
    cache: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def _features(self, h: int, w: int, batch: int, device) -> tuple[list, Tensor | None]:
        key = (h, w, batch)
        if key not in self.cache:
            cfg = self.runner.config
            hh, ww = _hint_size(h, w, cfg.unshuffle)
            hint = upscale(self.hint.float().movedim(-1, 1), ww, hh, "nearest-exact", "center")  # [B, C, H, W]
            if cfg.input_channels == 1 and hint.shape[1] > 1:
                hint = hint.mean(1, keepdim=True)
            if hint.shape[0] != batch:
                hint = hint[torch.arange(batch) % hint.shape[0]]
            with torch.inference_mode():
                feats, mid = self.runner(hint.to(device))
            self.cache.clear()
            self.cache[key] = ([None if f is None else f.float() for f in feats], None if mid is None else mid.float())
        return self.cache[key]

    def residuals(self, x_in: Tensor, timesteps: Tensor, context: Tensor, y: Tensor | None,
                  sigma: Tensor, percent: float) -> Control | None:
        prev = None
        if self.previous is not None:
            prev = self.previous.residuals(x_in, timesteps, context, y, sigma, percent)
        if not (self.start_percent <= percent <= self.end_percent) or self.strength == 0.0:
            return prev
        feats, mid = self._features(x_in.shape[-2], x_in.shape[-1], x_in.shape[0], x_in.device)
        own = Control(input=[], middle=None if mid is None else mid * self.strength,
                      input_path=[None if f is None else f * self.strength for f in feats])
        return own if prev is None else prev + own
