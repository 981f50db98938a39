"""ComfyUI 0.38.1's `ColorTransfer` (nodes_post_processing.py): match an image's colours to a
reference by Reinhard's mean/std transfer in CIE Lab, the Monge-Kantorovich linear map (MKL) of
the Lab covariances, or per-channel histogram matching (256 bins, in RGB).

`source_stats` says whose statistics the transform starts from: each target frame's own
(`per_frame`, each matched to the reference frame of the same index, or to the one reference),
the pooled statistics of all target frames (`uniform`), or one chosen frame's (`target_frame`),
the last two giving one transform for every frame. `strength` blends the source (in Lab, or in
RGB for histograms) toward the result; 0 or no reference returns the target unchanged.

The Lab conversion is kornia's (sRGB, D65 white, its matrices and thresholds), written here so
that mixgraph needs no kornia."""

from __future__ import annotations

import torch

METHODS = ("reinhard_lab", "mkl_lab", "histogram")
SOURCE_STATS = ("per_frame", "uniform", "target_frame")
EPS = 1e-6
BINS = 256

_RGB_TO_XYZ = torch.tensor([[0.412453, 0.357580, 0.180423],
                            [0.212671, 0.715160, 0.072169],
                            [0.019334, 0.119193, 0.950227]])
_XYZ_TO_RGB = torch.tensor([[3.2404813432005266, -1.5371515162713185, -0.4985363261688878],
                            [-0.9692549499965682, 1.8759900014898907, 0.0415559265582928],
                            [0.0556466391351772, -0.2040413383665112, 1.0572251624579287]])
_WHITE = torch.tensor([0.95047, 1.0, 1.08883]).view(3, 1)


def rgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """[3, N] sRGB in [0, 1] -> [3, N] Lab (L in 0..100)."""
    lin = torch.where(rgb > 0.04045, ((rgb + 0.055) / 1.055).pow(2.4), rgb / 12.92)
    xyz = (_RGB_TO_XYZ.to(rgb) @ lin) / _WHITE.to(rgb)
    f = torch.where(xyz > 0.008856, xyz.clamp(min=0.008856).pow(1 / 3), 7.787 * xyz + 4 / 29)
    return torch.stack((116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])))


def lab_to_rgb(lab: torch.Tensor) -> torch.Tensor:
    """[3, N] Lab -> [3, N] sRGB, linear values clipped to [0, 1] before the gamma."""
    fy = (lab[0] + 16) / 116
    f = torch.stack((lab[1] / 500 + fy, fy, (fy - lab[2] / 200).clamp(min=0)))
    xyz = torch.where(f > 0.2068966, f.pow(3), (f - 4 / 29) / 7.787) * _WHITE.to(lab)
    lin = (_XYZ_TO_RGB.to(lab) @ xyz).clamp(0, 1)
    return torch.where(lin > 0.0031308, 1.055 * lin.clamp(min=0.0031308).pow(1 / 2.4) - 0.055,
                       12.92 * lin)


def _flat(frame: torch.Tensor) -> torch.Tensor:
    """[H, W, C] -> [C, H*W] float32."""
    return frame.to(torch.float32).permute(2, 0, 1).reshape(frame.shape[-1], -1)


def _stats(lab: torch.Tensor, reinhard: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [C, 1] and std [C, 1] (Reinhard) or covariance [C, C] (MKL) of one frame."""
    mean = lab.mean(dim=1, keepdim=True)
    centred = lab - mean
    if reinhard:
        return mean, centred.pow(2).mean(dim=1, keepdim=True).sqrt().clamp_min(EPS)
    return mean, centred @ centred.T / lab.shape[1]


def _pooled(images: torch.Tensor, reinhard: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std / covariance over all frames: the mean of the frame means, then the mean of
    each frame's spread around that pooled mean."""
    labs = [rgb_to_lab(_flat(f)) for f in images]
    mean = sum(lab.mean(dim=1, keepdim=True) for lab in labs) / len(labs)
    acc = 0
    for lab in labs:
        c = lab - mean
        acc = acc + (c.pow(2).mean(dim=1, keepdim=True) if reinhard else c @ c.T / lab.shape[1])
    acc = acc / len(labs)
    return (mean, acc.sqrt().clamp_min(EPS)) if reinhard else (mean, acc)


def mkl_matrix(cov_s: torch.Tensor, cov_r: torch.Tensor) -> torch.Tensor:
    """The linear map T with T cov_s T^T = cov_r closest to the identity (Pitie's MKL)."""
    val_s, vec_s = torch.linalg.eigh(cov_s)
    root_s = val_s.clamp_min(0).sqrt().clamp_min(EPS)
    scaled = vec_s * root_s
    val_m, vec_m = torch.linalg.eigh(scaled.T @ cov_r @ scaled)
    half = (vec_m * val_m.clamp_min(0).sqrt()) @ vec_m.T
    inv = vec_s / root_s
    return inv @ half @ inv.T


def _cdf(images: torch.Tensor) -> torch.Tensor:
    """Per-channel cumulative histogram [C, BINS] of the frames, normalised to end at 1."""
    hist = torch.zeros(images.shape[-1], BINS)
    for f in images:
        flat = _flat(f)
        hist.scatter_add_(1, (flat * (BINS - 1)).long().clamp(0, BINS - 1), torch.ones_like(flat))
    cdf = hist.cumsum(1)
    return cdf / cdf[:, -1:]


def _lut(s_cdf: torch.Tensor, r_cdf: torch.Tensor) -> torch.Tensor:
    """Each source bin -> the first reference bin whose CDF reaches the source bin's CDF."""
    return torch.searchsorted(r_cdf.contiguous(), s_cdf.contiguous()).clamp_max(BINS - 1).float() / (BINS - 1)


def color_transfer(target: torch.Tensor, ref: torch.Tensor | None, method: str, stats: str,
                   target_index: int = 0, strength: float = 1.0) -> torch.Tensor:
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {list(METHODS)}")
    if stats not in SOURCE_STATS:
        raise ValueError(f"source_stats {stats!r} is not one of {list(SOURCE_STATS)}")
    if strength == 0 or ref is None:
        return target
    if target.shape[-1] != 3 or ref.shape[-1] != 3:
        raise ValueError(f"ColorTransfer needs RGB images (3 channels); got {target.shape[-1]} "
                         f"(image_target) and {ref.shape[-1]} (image_ref)")
    b, h, w, c = target.shape
    ti = min(target_index, b - 1)
    out = torch.empty(b, h, w, c, dtype=torch.float32)
    if method == "histogram":
        uniform = None
        if stats != "per_frame":
            uniform = _lut(_cdf(target[ti:ti + 1] if stats == "target_frame" else target), _cdf(ref))
        for i in range(b):
            src = _flat(target[i])
            lut = uniform if uniform is not None else _lut(_cdf(target[i:i + 1]),
                                                           _cdf(ref[min(i, ref.shape[0] - 1)][None]))
            matched = lut.gather(1, (src * (BINS - 1)).long().clamp(0, BINS - 1))
            res = matched if strength == 1.0 else torch.lerp(src, matched, strength)
            out[i] = res.view(c, h, w).permute(1, 2, 0).clamp(0, 1)
        return out.to(target.dtype)
    reinhard = method == "reinhard_lab"
    fixed = None
    if ref.shape[0] == 1 or stats != "per_frame":
        r_mean, r_sc = _pooled(ref, reinhard)
    if stats != "per_frame":
        s_mean, s_sc = (_stats(rgb_to_lab(_flat(target[ti])), reinhard) if stats == "target_frame"
                        else _pooled(target, reinhard))
        if reinhard:
            scale = r_sc / s_sc
            fixed = (lambda x: x * scale + (r_mean - scale * s_mean))
        else:
            t = mkl_matrix(s_sc, r_sc)
            fixed = (lambda x: t @ x + (r_mean - t @ s_mean))
    for i in range(b):
        lab = rgb_to_lab(_flat(target[i]))
        if fixed is not None:
            new = fixed(lab)
        else:
            s_mean, s_sc = _stats(lab, reinhard)
            if ref.shape[0] > 1:
                r_mean, r_sc = _stats(rgb_to_lab(_flat(ref[min(i, ref.shape[0] - 1)])), reinhard)
            centred = lab - s_mean
            new = (centred * (r_sc / s_sc) if reinhard else mkl_matrix(s_sc, r_sc) @ centred) + r_mean
        if strength != 1.0:
            new = torch.lerp(lab, new, strength)
        out[i] = lab_to_rgb(new).view(c, h, w).permute(1, 2, 0).clamp(0, 1)
    return out.to(target.dtype)
