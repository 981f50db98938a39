"""ESRGAN's RRDBNet (Wang et al. 2018, "ESRGAN: Enhanced Super-Resolution Generative
Adversarial Networks"; Real-ESRGAN, Wang et al. 2021), the upscaler family of ComfyUI's
``UpscaleModelLoader``.

Written here rather than taken from ``spandrel`` (ComfyUI's loader library): spandrel imports
torchvision at import time, and PyPI has no torchvision wheel that loads with a CPU build of
torch 2.13 (its ops fail to register), so spandrel cannot be imported in such an environment.
Other architectures spandrel knows (SwinIR, HAT, DAT, ...) are not supported yet.

Attribute names equal Real-ESRGAN's keys (``conv_first``, ``body.N.rdb1.conv1``, ``conv_body``,
``conv_up1``, ``conv_hr``, ``conv_last``); the original ESRGAN layout (``model.0``,
``model.1.sub.N.RDB1.conv1.0``, ...) is renamed on load (``old_layout_rename``). Sizes come from
tensor shapes (``RRDBConfig.from_shapes``): feature width, growth channels, block count, upsample
convs (scale 2 each), and Real-ESRGAN's pixel-unshuffle input for its ×2 / ×1 models (12 or 48
input channels for RGB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["RRDBConfig", "RRDBNet", "UpscaleModelError", "detect_layout"]


class UpscaleModelError(ValueError):
    """A file that is no supported upscale model; the message names the file and why."""


@dataclass(frozen=True)
class RRDBConfig:
    in_channels: int = 3
    out_channels: int = 3
    features: int = 64
    growth: int = 32
    blocks: int = 23
    upsamples: int = 2          # each: nearest ×2 then a conv
    unshuffle: int = 1          # Real-ESRGAN ×2 / ×1: pixel-unshuffle the input by 2 / 4
    old_layout: bool = False

    @property
    def scale(self) -> float:
        return 2 ** self.upsamples / self.unshuffle

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], where: str = "state dict") -> "RRDBConfig":
        """The config of a state dict in either layout, from its key names and shapes."""
        old = "model.0.weight" in shapes
        rename = old_layout_rename(shapes) if old else (lambda k: k)
        new = {rename(k): v for k, v in shapes.items()}
        new.pop(None, None)
        need = ("conv_first.weight", "body.0.rdb1.conv1.weight", "conv_body.weight",
                "conv_hr.weight", "conv_last.weight")
        missing = [k for k in need if k not in new]
        if missing:
            raise UpscaleModelError(
                f"{where}: not an ESRGAN/Real-ESRGAN (RRDBNet) model (missing {', '.join(missing)}); "
                f"other upscaler architectures are not supported yet")
        first = new["conv_first.weight"]                  # [features, in·unshuffle², 3, 3]
        out_channels = new["conv_last.weight"][0]
        blocks = 1 + max(int(m.group(1)) for k in new if (m := re.match(r"body\.(\d+)\.", k)))
        upsamples = sum(1 for k in new if re.fullmatch(r"conv_up\d+\.weight", k))
        unshuffle = 1
        in_channels = first[1]
        if not old and first[1] in (out_channels * 4, out_channels * 16):
            unshuffle = 2 if first[1] == out_channels * 4 else 4
            in_channels = out_channels
        return cls(in_channels=in_channels, out_channels=out_channels, features=first[0],
                   growth=new["body.0.rdb1.conv1.weight"][0], blocks=blocks, upsamples=upsamples,
                   unshuffle=unshuffle, old_layout=old)


def old_layout_rename(keys) -> Callable[[str], str | None]:
    """Original ESRGAN keys → ours. ``model.0`` is conv_first, ``model.1.sub.N`` the RRDB trunk
    (its last entry conv_body); the later top-level convs are the upsample convs, then conv_hr
    and conv_last (the last two)."""
    top = sorted({int(m.group(1)) for k in keys if (m := re.fullmatch(r"model\.(\d+)\.weight", k))})
    tail = [i for i in top if i > 1]
    names = {0: "conv_first"}
    if len(tail) >= 2:
        *ups, hr, last = tail
        names.update({i: f"conv_up{n + 1}" for n, i in enumerate(ups)})
        names.update({hr: "conv_hr", last: "conv_last"})
    trunk = [int(m.group(1)) for k in keys if (m := re.fullmatch(r"model\.1\.sub\.(\d+)\.weight", k))]
    body_conv = max(trunk) if trunk else None

    def rename(key: str) -> str | None:
        if m := re.fullmatch(r"model\.(\d+)\.(weight|bias)", key):
            name = names.get(int(m.group(1)))
            return f"{name}.{m.group(2)}" if name else None
        if m := re.fullmatch(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0\.(weight|bias)", key):
            return f"body.{m.group(1)}.rdb{m.group(2)}.conv{m.group(3)}.{m.group(4)}"
        if m := re.fullmatch(r"model\.1\.sub\.(\d+)\.(weight|bias)", key):
            if int(m.group(1)) == body_conv:
                return f"conv_body.{m.group(2)}"
        return None

    return rename


def detect_layout(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return "esrgan_old" if "model.0.weight" in shapes else "esrgan"


def _conv(n_in: int, n_out: int) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1)


class ResidualDenseBlock(nn.Module):
    """Five densely connected convs; the output is scaled by 0.2 and added to the input."""

    def __init__(self, nf: int, gc: int):
        super().__init__()
        self.conv1 = _conv(nf, gc)
        self.conv2 = _conv(nf + gc, gc)
        self.conv3 = _conv(nf + 2 * gc, gc)
        self.conv4 = _conv(nf + 3 * gc, gc)
        self.conv5 = _conv(nf + 4 * gc, nf)

    def forward(self, x: Tensor) -> Tensor:
        act = lambda t: F.leaky_relu(t, 0.2)  # noqa: E731
        x1 = act(self.conv1(x))
        x2 = act(self.conv2(torch.cat((x, x1), 1)))             # [B, nf+gc, H, W] in
        x3 = act(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = act(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))      # back to nf channels
        return x5 * 0.2 + x


class RRDB(nn.Module):
    """Residual-in-residual dense block: three dense blocks, scaled residual."""

    def __init__(self, nf: int, gc: int):
        super().__init__()
        self.rdb1 = ResidualDenseBlock(nf, gc)
        self.rdb2 = ResidualDenseBlock(nf, gc)
        self.rdb3 = ResidualDenseBlock(nf, gc)

    def forward(self, x: Tensor) -> Tensor:
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    """Image [B, C, H, W] in [0, 1] → [B, C, H·scale, W·scale]."""

    def __init__(self, config: RRDBConfig = RRDBConfig()):
        super().__init__()
        c = config
        self.config = c
        self.conv_first = _conv(c.in_channels * c.unshuffle ** 2, c.features)
        self.body = nn.Sequential(*(RRDB(c.features, c.growth) for _ in range(c.blocks)))
        self.conv_body = _conv(c.features, c.features)
        for i in range(c.upsamples):
            setattr(self, f"conv_up{i + 1}", _conv(c.features, c.features))
        self.conv_hr = _conv(c.features, c.features)
        self.conv_last = _conv(c.features, c.out_channels)

    def forward(self, x: Tensor) -> Tensor:
        c = self.config
        h, w = x.shape[-2:]
        if c.unshuffle > 1:
            s = c.unshuffle                                      # pad to a multiple, as Real-ESRGAN
            x = F.pad(x, (0, -w % s, 0, -h % s), mode="reflect")
            x = F.pixel_unshuffle(x, s)                          # [B, C·s², H/s, W/s]
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        for i in range(c.upsamples):
            up = getattr(self, f"conv_up{i + 1}")
            feat = F.leaky_relu(up(F.interpolate(feat, scale_factor=2, mode="nearest")), 0.2)
        out = self.conv_last(F.leaky_relu(self.conv_hr(feat), 0.2))
        return out[..., : round(h * c.scale), : round(w * c.scale)]
