"""SDPose (Liang et al. 2025, "SDPose: Exploiting Diffusion Priors for Out-of-Domain and Robust
Pose Estimation"): a Lotus-style SD2 UNet whose decoder feature feeds an MMPose-style heatmap head
that predicts COCO-WholeBody keypoints (133 of them).

Facts carried over from ComfyUI (Comfy-Org/ComfyUI; code not copied):

* detection (``comfy/model_detection.py`` 0b61ce5): a UNet state dict holding
  ``heatmap_head.conv_layers.0.weight`` gets ``heatmap_head=True`` in its UNet config; the rest
  of the UNet is detected as usual (the Comfy-Org/SDPose checkpoints are Lotus-D UNets: SD2 with
  the 4-wide task input, so they run as Lotus, ``lotus.py``);
* the head (``HeatmapHead`` of ComfyUI's SDPose module, built by ``openaimodel.UNetModel`` when
  ``heatmap_head`` is set): stride-2 transposed convs (kernel 4: padding 1, kernel 3: padding 1
  and output padding 1, kernel 2: no padding; no bias) each followed by InstanceNorm2d (no affine)
  and SiLU; then convs (padding (k−1)/2, with bias) each followed by InstanceNorm2d and SiLU; then
  a final conv (padding k//2). ComfyUI builds it with fixed sizes (640 in, one 640 deconv k4, one
  640 conv k1, final k1, 133 out, input size 768 × 1024 and heatmap scale 4); mixgraph reads the
  same sizes from the tensor shapes, and keeps ComfyUI's input size (it is in no tensor);
* decoding per keypoint: the heatmap's argmax (x, y) and its value as the score, a score ≤ 0
  marks the keypoint invalid (−1); then DARK/UDP sub-pixel refinement: each heatmap is zero-padded
  by 5, Gaussian-blurred (σ 2, SciPy's ``gaussian_filter``), cropped back and rescaled so its max
  is the unblurred max; clipped to [1e-3, 50] and log-taken; edge-padded by 1; gradient and
  Hessian by central differences at the argmax; the keypoint moves by −H⁻¹·g (H + ε·I, ε float32's
  machine epsilon); finally scaled by (input − 1)/(heatmap − 1) per axis and invalid ones set to −1;
* the extractor's OpenPose output (``comfy_extras/nodes_sdpose.py`` 47e4a90): a neck keypoint
  inserted at index 17 (mean of 5 and 6; score min(s5, s6) if both > 0.3, else 0), the MMPose body
  order remapped to OpenPose's, and the 134 keypoints split into body / feet / face (+ both eyes) /
  right hand / left hand flat [x, y, score, ...] lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from mixgraph.nodes.weights import store
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.weights.safetensors_io import WeightSource

__all__ = ["HEAD_PREFIX", "HeatmapHeadConfig", "HeatmapHead", "HeatmapHeadWeights", "FeatureCapture",
           "decode_heatmaps", "has_heatmap_head", "preprocess_keypoints", "to_openpose_frames"]

HEAD_PREFIX = "heatmap_head."
DETECT_KEY = HEAD_PREFIX + "conv_layers.0.weight"  # ComfyUI's detection key
INPUT_SIZE = (768, 1024)  # (width, height) ComfyUI's HeatmapHead default
HEATMAP_SCALE = 4
_DECONV_PADDING = {4: (1, 0), 3: (1, 1), 2: (0, 0)}  # kernel -> (padding, output_padding), stride 2
BLUR_BORDER = 5
BLUR_SIGMA = 2.0


def has_heatmap_head(info: Mapping) -> bool:
    return DETECT_KEY in info


@dataclass(frozen=True)
class HeatmapHeadConfig:
    in_channels: int
    out_channels: int  # keypoints (133 for whole-body)
    deconv: tuple[tuple[int, int], ...]  # (out channels, kernel) per transposed conv
    conv: tuple[tuple[int, int], ...]  # (out channels, kernel) per conv
    final_kernel: int
    input_size: tuple[int, int] = INPUT_SIZE  # (width, height) of the image the model sees
    heatmap_scale: int = HEATMAP_SCALE

    @property
    def heatmap_size(self) -> tuple[int, int]:
        return (self.input_size[0] // self.heatmap_scale, self.input_size[1] // self.heatmap_scale)


def _shape(info: Mapping, key: str) -> tuple[int, ...]:
    v = info[key]
    return tuple(getattr(v, "shape", v))


def head_config_from_info(info: Mapping, prefix: str = HEAD_PREFIX, where: str = "SDPose") -> HeatmapHeadConfig:
    """Sizes from the tensor shapes under ``prefix`` (layers at Sequential indices 0, 3, 6, ...)."""
    def layers(group: str) -> list[tuple[int, ...]]:
        out, i = [], 0
        while f"{prefix}{group}.{i}.weight" in info:
            out.append(_shape(info, f"{prefix}{group}.{i}.weight"))
            i += 3
        return out

    deconvs, convs = layers("deconv_layers"), layers("conv_layers")
    final_key = f"{prefix}final_layer.weight"
    if final_key not in info:
        raise ValueError(f"{where}: heatmap head without {final_key}")
    final = _shape(info, final_key)
    for s in deconvs:
        if len(s) != 4 or s[2] not in _DECONV_PADDING:
            raise ValueError(f"{where}: heatmap head deconv weight {list(s)}: kernel must be 2, 3 or 4")
    if deconvs:
        in_channels = deconvs[0][0]
    elif convs:
        in_channels = convs[0][1]
    else:
        in_channels = final[1]
    return HeatmapHeadConfig(
        in_channels=in_channels, out_channels=final[0],
        deconv=tuple((s[1], s[2]) for s in deconvs), conv=tuple((s[0], s[2]) for s in convs),
        final_kernel=final[2])


class HeatmapHead(nn.Module):
    """Feature [B, C, h, w] -> heatmaps [B, K, h·2^deconvs, w·2^deconvs] (keys as ComfyUI's)."""

    def __init__(self, cfg: HeatmapHeadConfig):
        super().__init__()
        ch = cfg.in_channels
        layers: list[nn.Module] = []
        for out, k in cfg.deconv:
            pad, out_pad = _DECONV_PADDING[k]
            layers += [nn.ConvTranspose2d(ch, out, k, stride=2, padding=pad, output_padding=out_pad, bias=False),
                       nn.InstanceNorm2d(out), nn.SiLU()]
            ch = out
        self.deconv_layers = nn.Sequential(*layers) if layers else nn.Identity()
        layers = []
        for out, k in cfg.conv:
            layers += [nn.Conv2d(ch, out, k, padding=(k - 1) // 2), nn.InstanceNorm2d(out), nn.SiLU()]
            ch = out
        self.conv_layers = nn.Sequential(*layers) if layers else nn.Identity()
        self.final_layer = nn.Conv2d(ch, cfg.out_channels, cfg.final_kernel, padding=cfg.final_kernel // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.final_layer(self.conv_layers(self.deconv_layers(x)))


@dataclass(frozen=True)
class HeatmapHeadWeights:
    """Where the head's weights are (``<unet prefix>heatmap_head.``) and its sizes."""

    source: WeightSource
    config: HeatmapHeadConfig

    @classmethod
    def from_unet(cls, unet_source: WeightSource, unet_info: Mapping, where: str) -> "HeatmapHeadWeights | None":
        """The head next to a UNet (``unet_info``: keys without the UNet prefix), or None."""
        if not has_heatmap_head(unet_info):
            return None
        source = dataclasses.replace(unet_source, prefix=unet_source.prefix + HEAD_PREFIX)
        return cls(source, head_config_from_info(unet_info, HEAD_PREFIX, where))

    def module(self, policy: PolicyLike) -> nn.Module:
        m = store.materialize("sdpose_head", self.source, self.config, policy.storage, (), HeatmapHead)
        return apply_precision(m, policy)

    def keypoints(self, module: nn.Module, feature: Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Head + decoding: per image keypoints [K, 2] in model-input pixels and scores [K]."""
        if feature.shape[1] != self.config.in_channels:
            raise ValueError(f"SDPose heatmap head takes {self.config.in_channels}-channel features, "
                             f"got {feature.shape[1]}")
        p = next(module.parameters())
        with torch.inference_mode():
            heatmaps = module(feature.to(p.device, p.dtype)).float().cpu().numpy()
        return decode_heatmaps(heatmaps, self.config)


def _blur(hm: np.ndarray) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    padded = np.pad(hm, BLUR_BORDER, mode="constant")
    b = BLUR_BORDER
    return gaussian_filter(padded, sigma=BLUR_SIGMA)[b:-b, b:-b]


def decode_heatmaps(heatmaps: np.ndarray, cfg: HeatmapHeadConfig | None = None,
                    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """[B, K, H, W] heatmaps -> per image (keypoints [K, 2] float32, scores [K]); coordinates in
    the model input's pixels, invalid (score ≤ 0) keypoints at −1 (see the module docstring)."""
    heatmaps = np.asarray(heatmaps, dtype=np.float32)
    b_n, k_n, h, w = heatmaps.shape
    if cfg is None:
        scale = np.float32(1.0)
    else:
        size = np.array(cfg.input_size, dtype=np.float64)
        hm_size = np.array(cfg.heatmap_size, dtype=np.float64)
        scale = ((size - 1) / (hm_size - 1)).astype(np.float32)
    all_kp, all_sc = [], []
    for b in range(b_n):
        hm = heatmaps[b].copy()
        flat = hm.reshape(k_n, -1)
        arg = flat.argmax(axis=1)
        scores = flat[np.arange(k_n), arg].copy()
        ys, xs = np.unravel_index(arg, (h, w))
        kp = np.stack([xs, ys], axis=-1).astype(np.float32)
        invalid = scores <= 0.0
        kp[invalid] = -1
        for k in range(k_n):  # blur, keeping each map's max
            peak = hm[k].max()
            hm[k] = _blur(hm[k])
            now = hm[k].max()
            if now > 0:
                hm[k] *= peak / now
        hm = np.log(np.clip(hm, 1e-3, 50.0))
        padded = np.pad(hm, ((0, 0), (1, 1), (1, 1)), mode="edge")  # [K, H+2, W+2]
        pw = w + 2
        flat_p = padded.reshape(-1)
        idx = (kp[:, 0] + 1 + (kp[:, 1] + 1) * pw + np.arange(k_n) * pw * (h + 2)).astype(int)
        c = flat_p[idx]
        right, left = flat_p[idx + 1], flat_p[idx - 1]
        down, up = flat_p[idx + pw], flat_p[idx - pw]
        down_right, up_left = flat_p[idx + pw + 1], flat_p[idx - pw - 1]
        grad = np.stack([0.5 * (right - left), 0.5 * (down - up)], axis=-1)[..., None]  # [K, 2, 1]
        dxx = right - 2 * c + left
        dyy = down - 2 * c + up
        dxy = 0.5 * (down_right - right - down + 2 * c - left - up + up_left)
        hess = np.stack([np.stack([dxx, dxy], -1), np.stack([dxy, dyy], -1)], axis=-2)  # [K, 2, 2]
        hess_inv = np.linalg.inv(hess + np.finfo(np.float32).eps * np.eye(2))
        kp = kp - (hess_inv @ grad)[..., 0]
        kp = (kp * scale).astype(np.float32)
        kp[invalid] = -1
        all_kp.append(kp)
        all_sc.append(scores)
    return all_kp, all_sc


@dataclass(frozen=True)
class FeatureCapture:
    """A UNet output-block patch (``unet_patches.py``) that keeps the last main-path feature of
    ``channels`` width entering an output block (ComfyUI's extractor: the last 640-channel one).
    Made per extraction; the sink is excluded from equality and hashing."""

    channels: int
    sink: list = field(default_factory=list, compare=False, hash=False, repr=False)

    def output_block(self, h: Tensor, skip: Tensor, index: int) -> tuple[Tensor, Tensor]:
        if h.shape[1] == self.channels:
            self.sink[:] = [h.detach().clone()]
        return h, skip


MMPOSE_BODY = (17, 6, 8, 10, 7, 9, 12, 14, 16, 13, 15, 2, 1, 4, 3)
OPENPOSE_BODY = (1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17)
NECK_THRESHOLD = 0.3


def preprocess_keypoints(kp: Sequence, sc: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """133 MMPose keypoints [133, 2] + scores -> 134 with the neck at 17, body in OpenPose order
    (fewer than 17 keypoints pass unchanged, as ComfyUI)."""
    kp = np.array(kp, dtype=np.float32)
    sc = np.array(sc, dtype=np.float32)
    if len(kp) < 17:
        return kp, sc
    neck = (kp[5] + kp[6]) / 2
    neck_score = min(sc[5], sc[6]) if sc[5] > NECK_THRESHOLD and sc[6] > NECK_THRESHOLD else 0.0
    kp = np.insert(kp, 17, neck, axis=0)
    sc = np.insert(sc, 17, neck_score)
    out_kp, out_sc = kp.copy(), sc.copy()
    out_kp[list(OPENPOSE_BODY)] = kp[list(MMPOSE_BODY)]
    out_sc[list(OPENPOSE_BODY)] = sc[list(MMPOSE_BODY)]
    return out_kp, out_sc


def _flat(kp: np.ndarray, sc: np.ndarray) -> list[float]:
    return np.stack([kp[:, 0], kp[:, 1], sc], axis=1).reshape(-1).tolist()


def to_openpose_frames(all_kp: Sequence[Sequence], all_sc: Sequence[Sequence], height: int, width: int) -> list[dict]:
    """Per image, per person raw keypoints -> ComfyUI's OpenPose frames (POSE_KEYPOINT)."""
    frames = []
    for kps, scs in zip(all_kp, all_sc):
        people = []
        for kp_raw, sc_raw in zip(kps, scs):
            kp, sc = preprocess_keypoints(kp_raw, sc_raw)
            face = [*range(24, 92), 14, 15]  # 68 landmarks + right eye + left eye
            people.append({
                "pose_keypoints_2d": _flat(kp[0:18], sc[0:18]),
                "foot_keypoints_2d": _flat(kp[18:24], sc[18:24]),
                "face_keypoints_2d": _flat(kp[face], sc[face]),
                "hand_right_keypoints_2d": _flat(kp[92:113], sc[92:113]),
                "hand_left_keypoints_2d": _flat(kp[113:134], sc[113:134]),
            })
        frames.append({"canvas_width": width, "canvas_height": height, "people": people})
    return frames
