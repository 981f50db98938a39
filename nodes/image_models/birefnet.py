"""BiRefNet background removal (ComfyUI ``comfy/background_removal/birefnet.py``, read at
comfyanonymous/ComfyUI 2974cffe; the loader and ``encode_image`` of ``comfy/bg_removal_model.py``
at Comfy-Org/ComfyUI 9f3cd158; ``birefnet.json`` at 2e40f31f): a Swin Transformer backbone run
at full and half resolution, a squeeze block, and BiRefNet's decoder (deformable-ASPP decoder
blocks, gradient attention, input patches re-injected at every scale) giving one logit map.

The state-dict key layout is ComfyUI's (``bb.*``, ``squeeze_module.0.*``, ``decoder.*``).
ComfyUI fixes the sizes (Swin-L: embed 192, depths 2/2/18/2, heads 6/12/24/48, window 12); here
they are read from the tensor shapes (``BiRefNetConfig.from_shapes``), so BiRefNet variants and
the tiny test models load with the same code. The decoder's constants (64-channel decoder and
input blocks, 256-channel ASPP branches with kernels 1/3/7, 16-channel gradient convs) are read
from shapes too. The deformable convolution is ``deform_conv.deform_conv2d`` (plain torch).

Preprocessing and output, as ``encode_image``: the image is stretched to ``resolution`` ×
``resolution`` (bicubic, antialiased), quantised to 8 bits, normalised with ImageNet's mean/std;
each image runs on its own; the logits are resized back to the image's size (bicubic, no
antialias) and passed through a sigmoid: a MASK [B, H, W]."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.image_models.deform_conv import deform_conv2d
from mixgraph.nodes.weights.safetensors_io import WeightFileError, inspect_file, read_tensors
from mixgraph.nodes.image_models.swin import SwinTransformer

__all__ = ["BiRefNet", "BiRefNetConfig", "BackgroundRemovalError", "BackgroundRemovalModel",
           "DETECTION_KEY", "INVALID_MESSAGE", "load_background_removal_model", "detect"]

#: ComfyUI's detection key (``load_background_removal_model``): a BiRefNet file has it.
DETECTION_KEY = "bb.layers.1.blocks.0.attn.relative_position_index"
#: ComfyUI's LoadBackgroundRemovalModel error for a file that is not a background removal model.
INVALID_MESSAGE = "ERROR: background model file is invalid and does not contain a valid background removal model."
#: birefnet.json
IMAGE_SIZE = 1024
IMAGE_MEAN = (0.485, 0.456, 0.406)
IMAGE_STD = (0.229, 0.224, 0.225)


class BackgroundRemovalError(ValueError):
    pass


# --- configuration from shapes ------------------------------------------------------------------

@dataclass(frozen=True)
class BiRefNetConfig:
    embed_dim: int = 192
    depths: tuple[int, ...] = (2, 2, 18, 2)
    num_heads: tuple[int, ...] = (6, 12, 24, 48)
    window_size: int = 12
    patch_size: int = 4
    in_channels: int = 3
    mlp_hidden: tuple[int, ...] = (768, 1536, 3072, 6144)
    patch_norm: bool = True
    dec_inter: int = 64            # BasicDecBlk's inter channels
    aspp_planes: int = 256         # ASPPDeformable's branch channels
    aspp_kernels: tuple[int, ...] = (1, 3, 7)
    ipt_inter: int = 64            # SimpleConvs' inter channels
    gdt_channels: int = 16         # the gradient convs' channels

    @property
    def channels(self) -> tuple[int, int, int, int]:
        """ComfyUI's ``channels``: the backbone's feature widths, deepest first, doubled (the
        full- and half-resolution features are concatenated)."""
        e = self.embed_dim
        return (16 * e, 8 * e, 4 * e, 2 * e)

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], name: str = "model") -> "BiRefNetConfig":
        def need(key: str) -> tuple[int, ...]:
            if key not in shapes:
                raise BackgroundRemovalError(f"{name}: BiRefNet tensor {key!r} is missing")
            return tuple(shapes[key])

        proj = need("bb.patch_embed.proj.weight")
        embed_dim, in_channels, patch = proj[0], proj[1], proj[2]
        layer_ids = sorted({int(m.group(1)) for k in shapes if (m := re.match(r"bb\.layers\.(\d+)\.", k))})
        if layer_ids != [0, 1, 2, 3]:
            raise BackgroundRemovalError(f"{name}: the Swin backbone has stages {layer_ids}; BiRefNet "
                                         f"needs 4 (0..3)")
        depths, heads, hidden, windows = [], [], [], set()
        for i in layer_ids:
            blocks = {int(m.group(1)) for k in shapes
                      if (m := re.match(rf"bb\.layers\.{i}\.blocks\.(\d+)\.", k))}
            if not blocks or blocks != set(range(len(blocks))):
                raise BackgroundRemovalError(f"{name}: Swin stage {i} has blocks {sorted(blocks)}")
            depths.append(len(blocks))
            table = need(f"bb.layers.{i}.blocks.0.attn.relative_position_bias_table")
            heads.append(table[1])
            side = math.isqrt(table[0])
            if side * side != table[0] or side % 2 == 0:
                raise BackgroundRemovalError(f"{name}: relative_position_bias_table of stage {i} has "
                                             f"{table[0]} rows, not (2 * window - 1) ** 2")
            windows.add((side + 1) // 2)
            hidden.append(need(f"bb.layers.{i}.blocks.0.mlp.fc1.weight")[0])
            dim = embed_dim * 2 ** i
            if need(f"bb.layers.{i}.blocks.0.attn.qkv.weight") != (3 * dim, dim):
                raise BackgroundRemovalError(f"{name}: Swin stage {i} is not {dim} wide (embed "
                                             f"{embed_dim} doubled per stage)")
        if len(windows) != 1:
            raise BackgroundRemovalError(f"{name}: Swin stages use different window sizes {sorted(windows)}")
        dec = "squeeze_module.0.dec_att."
        kernels = []
        while f"{dec}aspp_deforms.{len(kernels)}.atrous_conv.regular_conv.weight" in shapes:
            kernels.append(shapes[f"{dec}aspp_deforms.{len(kernels)}.atrous_conv.regular_conv.weight"][-1])
        return cls(
            embed_dim=embed_dim, depths=tuple(depths), num_heads=tuple(heads), window_size=windows.pop(),
            patch_size=patch, in_channels=in_channels, mlp_hidden=tuple(hidden),
            patch_norm="bb.patch_embed.norm.weight" in shapes,
            dec_inter=need("squeeze_module.0.conv_in.weight")[0],
            aspp_planes=need(f"{dec}aspp1.atrous_conv.regular_conv.weight")[0],
            aspp_kernels=tuple(kernels),
            ipt_inter=need("decoder.ipt_blk5.conv1.weight")[0],
            gdt_channels=need("decoder.gdt_convs_4.0.weight")[0])


# --- decoder ------------------------------------------------------------------------------------

def _up(x: Tensor, size) -> Tensor:
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=True)


class DeformableConv2d(nn.Module):
    """BiRefNet's DCNv2 layer: offsets and a modulator (2 * sigmoid) from plain convs."""

    def __init__(self, cin: int, cout: int, k: int, padding: int):
        super().__init__()
        self.padding = padding
        self.offset_conv = nn.Conv2d(cin, 2 * k * k, k, 1, padding)
        self.modulator_conv = nn.Conv2d(cin, k * k, k, 1, padding)
        self.regular_conv = nn.Conv2d(cin, cout, k, 1, padding, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        offset = self.offset_conv(x)
        modulator = 2.0 * torch.sigmoid(self.modulator_conv(x))
        return deform_conv2d(x, offset, self.regular_conv.weight, None, padding=self.padding, mask=modulator)


class _ASPPBranch(nn.Module):
    def __init__(self, cin: int, planes: int, k: int):
        super().__init__()
        self.atrous_conv = DeformableConv2d(cin, planes, k, k // 2)
        self.bn = nn.BatchNorm2d(planes)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.atrous_conv(x)))


class ASPPDeformable(nn.Module):
    def __init__(self, cin: int, planes: int, kernels: tuple[int, ...]):
        super().__init__()
        self.aspp1 = _ASPPBranch(cin, planes, 1)
        self.aspp_deforms = nn.ModuleList(_ASPPBranch(cin, planes, k) for k in kernels)
        self.global_avg_pool = nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Conv2d(cin, planes, 1, bias=False),
                                             nn.BatchNorm2d(planes), nn.ReLU())
        self.conv1 = nn.Conv2d(planes * (2 + len(kernels)), cin, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.aspp1(x)
        pooled = _up(self.global_avg_pool(x), x1.shape[2:])
        x = torch.cat([x1, *(branch(x) for branch in self.aspp_deforms), pooled], dim=1)
        return F.relu(self.bn1(self.conv1(x)))


class BasicDecBlk(nn.Module):
    def __init__(self, cin: int, cout: int, cfg: BiRefNetConfig):
        super().__init__()
        inter = cfg.dec_inter
        self.conv_in = nn.Conv2d(cin, inter, 3, 1, 1)
        self.bn_in = nn.BatchNorm2d(inter)
        self.dec_att = ASPPDeformable(inter, cfg.aspp_planes, cfg.aspp_kernels)
        self.conv_out = nn.Conv2d(inter, cout, 3, 1, 1)
        self.bn_out = nn.BatchNorm2d(cout)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn_in(self.conv_in(x)))
        return self.bn_out(self.conv_out(self.dec_att(x)))


class BasicLatBlk(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, 1, 0)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class SimpleConvs(nn.Module):
    def __init__(self, cin: int, cout: int, inter: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, inter, 3, 1, 1)
        self.conv_out = nn.Conv2d(inter, cout, 3, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_out(self.conv1(x))


def _patches(x: Tensor, like: Tensor) -> Tensor:
    """ComfyUI's ``get_patches_batch``: the input cut into tiles of ``like``'s spatial size,
    stacked on the channel axis, column by column (left to right), each column top to bottom."""
    th, tw = like.shape[2:]
    tiles = [t for col in torch.split(x, tw, dim=-1) for t in torch.split(col, th, dim=-2)]
    return torch.cat(tiles, dim=1)


class Decoder(nn.Module):
    def __init__(self, cfg: BiRefNetConfig):
        super().__init__()
        c = cfg.channels
        ic, n = cfg.ipt_inter, cfg.gdt_channels
        p = cfg.patch_size
        # input patches: tiles of each scale's size; the scales are 1/(p*8), 1/(p*4), 1/(p*2), 1/p, 1
        self.ipt_blk5 = SimpleConvs((p * 8) ** 2 * 3, c[0] // 8, ic)
        self.ipt_blk4 = SimpleConvs((p * 4) ** 2 * 3, c[0] // 8, ic)
        self.ipt_blk3 = SimpleConvs((p * 2) ** 2 * 3, c[1] // 8, ic)
        self.ipt_blk2 = SimpleConvs(p ** 2 * 3, c[2] // 8, ic)
        self.ipt_blk1 = SimpleConvs(3, c[3] // 8, ic)
        self.decoder_block4 = BasicDecBlk(c[0] + c[0] // 8, c[1], cfg)
        self.decoder_block3 = BasicDecBlk(c[1] + c[0] // 8, c[2], cfg)
        self.decoder_block2 = BasicDecBlk(c[2] + c[1] // 8, c[3], cfg)
        self.decoder_block1 = BasicDecBlk(c[3] + c[2] // 8, c[3] // 2, cfg)
        self.conv_out1 = nn.Sequential(nn.Conv2d(c[3] // 2 + c[3] // 8, 1, 1, 1, 0))
        self.lateral_block4 = BasicLatBlk(c[1], c[1])
        self.lateral_block3 = BasicLatBlk(c[2], c[2])
        self.lateral_block2 = BasicLatBlk(c[3], c[3])
        # multi-scale supervision heads: trained, unused at inference (kept for the key layout)
        self.conv_ms_spvn_4 = nn.Conv2d(c[1], 1, 1, 1, 0)
        self.conv_ms_spvn_3 = nn.Conv2d(c[2], 1, 1, 1, 0)
        self.conv_ms_spvn_2 = nn.Conv2d(c[3], 1, 1, 1, 0)
        for i, cin in ((4, c[0] // 2), (3, c[1] // 2), (2, c[2] // 2)):
            self.add_module(f"gdt_convs_{i}", nn.Sequential(nn.Conv2d(cin, n, 3, 1, 1), nn.BatchNorm2d(n), nn.ReLU()))
        for i in (2, 3, 4):
            self.add_module(f"gdt_convs_pred_{i}", nn.Sequential(nn.Conv2d(n, 1, 1, 1, 0)))
            self.add_module(f"gdt_convs_attn_{i}", nn.Sequential(nn.Conv2d(n, 1, 1, 1, 0)))

    def _stage(self, i: int, p: Tensor) -> Tensor:
        attn = getattr(self, f"gdt_convs_attn_{i}")(getattr(self, f"gdt_convs_{i}")(p)).sigmoid()
        return p * attn

    def forward(self, x: Tensor, x1: Tensor, x2: Tensor, x3: Tensor, x4: Tensor) -> Tensor:
        def inject(feat: Tensor, blk: nn.Module) -> Tensor:
            return torch.cat((feat, blk(_up(_patches(x, feat), feat.shape[2:]))), 1)

        p4 = self._stage(4, self.decoder_block4(inject(x4, self.ipt_blk5)))
        p3 = _up(p4, x3.shape[2:]) + self.lateral_block4(x3)
        p3 = self._stage(3, self.decoder_block3(inject(p3, self.ipt_blk4)))
        p2 = _up(p3, x2.shape[2:]) + self.lateral_block3(x2)
        p2 = self._stage(2, self.decoder_block2(inject(p2, self.ipt_blk3)))
        p1 = _up(p2, x1.shape[2:]) + self.lateral_block2(x1)
        p1 = _up(self.decoder_block1(inject(p1, self.ipt_blk2)), x.shape[2:])
        return self.conv_out1(inject(p1, self.ipt_blk1))


class BiRefNet(nn.Module):
    """[B, 3, S, S] normalised pixels -> [B, 1, S, S] logits."""

    def __init__(self, cfg: BiRefNetConfig):
        super().__init__()
        self.cfg = cfg
        self.bb = SwinTransformer(cfg.embed_dim, cfg.depths, cfg.num_heads, cfg.window_size, cfg.mlp_hidden,
                                  cfg.patch_size, cfg.in_channels, cfg.patch_norm)
        c = cfg.channels
        self.squeeze_module = nn.Sequential(BasicDecBlk(c[0] + c[1] + c[2] + c[3], c[0], cfg))
        self.decoder = Decoder(cfg)

    def encode(self, x: Tensor) -> list[Tensor]:
        full = self.bb(x)
        half = self.bb(_up(x, (x.shape[2] // 2, x.shape[3] // 2)))
        feats = [torch.cat((f, _up(g, f.shape[2:])), dim=1) for f, g in zip(full, half)]
        x4 = feats[3]
        feats[3] = torch.cat([_up(f, x4.shape[2:]) for f in feats[:3]] + [x4], dim=1)
        return feats

    def forward(self, x: Tensor) -> Tensor:
        x1, x2, x3, x4 = self.encode(x)
        return self.decoder(x, x1, x2, x3, self.squeeze_module(x4))


# --- the BACKGROUND_REMOVAL value and its loader ------------------------------------------------

def preprocess(image: Tensor, size: int, mean=IMAGE_MEAN, std=IMAGE_STD) -> Tensor:
    """ComfyUI's ``clip_preprocess(..., crop=False)``: IMAGE [B, H, W, C] -> [B, 3, size, size],
    stretched (bicubic, antialiased) unless already that size, 8-bit quantised, normalised."""
    x = image[..., :3].movedim(-1, 1).float()
    if tuple(x.shape[2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True)
    x = torch.clamp(torch.round(x * 255.0), 0, 255) / 255.0
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - m) / s


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class BackgroundRemovalModel:
    """BACKGROUND_REMOVAL: a loaded BiRefNet (float32, on the GPU when there is one)."""

    def __init__(self, model: BiRefNet, name: str = "model"):
        self.model = model.eval()
        self.name = name
        self.image_size = IMAGE_SIZE

    @torch.no_grad()
    def encode_image(self, image: Tensor, image_size: int | None = None) -> Tensor:
        """IMAGE [B, H, W, C] -> MASK [B, H, W] in 0..1 (foreground probability)."""
        if image.ndim != 4 or image.shape[-1] < 3:
            raise BackgroundRemovalError(f"RemoveBackground: image must be [B, H, W, 3], got {tuple(image.shape)}")
        size = int(image_size or self.image_size)
        device = next(self.model.parameters()).device
        h, w = image.shape[1], image.shape[2]
        pixels = preprocess(image.to(device), size)
        logits = torch.cat([self.model(pixels[i:i + 1]) for i in range(pixels.shape[0])], dim=0)
        logits = F.interpolate(logits, size=(h, w), mode="bicubic", antialias=False)
        return logits.sigmoid().squeeze(1).float().cpu()


def detect(keys) -> bool:
    """ComfyUI's test: a background removal (BiRefNet) state dict has ``DETECTION_KEY``."""
    return DETECTION_KEY in keys


def load_background_removal_model(path: str | os.PathLike | None = None, *,
                                  state_dict: Mapping[str, Tensor] | None = None,
                                  device: torch.device | str | None = None) -> BackgroundRemovalModel:
    """LoadBackgroundRemovalModel: a BiRefNet file (or state dict), sizes from its shapes.
    A file without ComfyUI's detection key raises ComfyUI's error message."""
    name = os.path.basename(os.fspath(path)) if path is not None else "state dict"
    if state_dict is None:
        try:
            shapes = {k: tuple(v.shape) for k, v in inspect_file(path).items()}
        except WeightFileError as e:
            raise BackgroundRemovalError(str(e)) from e
    else:
        shapes = {k: tuple(v.shape) for k, v in state_dict.items()}
    if not detect(shapes):
        raise BackgroundRemovalError(f"{INVALID_MESSAGE} ({name} has no {DETECTION_KEY!r}; only BiRefNet "
                                     f"models are supported)")
    cfg = BiRefNetConfig.from_shapes(shapes, name)
    sd = dict(state_dict) if state_dict is not None else read_tensors(path)
    model = BiRefNet(cfg)
    own = model.state_dict()
    missing = [k for k in own if k not in sd and not k.endswith("num_batches_tracked")]
    if missing:
        raise BackgroundRemovalError(f"{name}: BiRefNet tensors missing: {', '.join(missing[:8])}"
                                     + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    wrong = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if wrong:
        k = wrong[0]
        raise BackgroundRemovalError(f"{name}: tensor {k!r} has shape {tuple(sd[k].shape)}, expected "
                                     f"{tuple(own[k].shape)}")
    model.load_state_dict({k: sd[k] for k in own if k in sd}, strict=False)
    model = model.float().to(device if device is not None else _device())
    return BackgroundRemovalModel(model, name)
