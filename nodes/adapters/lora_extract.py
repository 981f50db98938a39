"""Extract a LoRA from a weight difference (ComfyUI's comfy_extras/nodes_lora_extract.py, LoraSave).

The input is a model whose weights *are* a difference (ModelMergeSubtract / CLIPMergeSubtract of
a fine-tune and its base). Per weight key, ComfyUI's rules:

- lora_type "standard": a weight of 2+ dims becomes ``lora_up`` / ``lora_down`` from a truncated
  SVD (Eckart–Young: the best rank-r approximation): ΔW ≈ (U_r · diag(S_r)) @ Vh_r, conv kernels
  flattened to [out, in·kh·kw]; both factors are clamped to ±(0.99-quantile of their joined
  values). 1-D weights (norms) are stored whole as ``.diff`` when ``bias_diff`` is on.
- lora_type "full_diff": every weight stored whole as ``.diff``.
- ``bias_diff``: biases stored whole as ``.diff_b``.

Keys use ComfyUI's generic LoRA names: ``diffusion_model.<LDM key>`` for the UNet and
``text_encoders.<clip_l|clip_g|clip_h>.transformer.<HF key>`` for text encoders, which the LoRA
loader reads back. Tensors are written in float16, as ComfyUI does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["CLAMP_QUANTILE", "LORA_TYPES", "extract_lora", "lora_from_diff"]

log = logging.getLogger(__name__)

CLAMP_QUANTILE = 0.99
LORA_TYPES = ("standard", "full_diff")


def quantile(values: Tensor, q: float) -> Tensor:
    """Linear-interpolation quantile (``torch.quantile``'s default) without its input size limit."""
    s = torch.sort(values.flatten()).values
    pos = q * (s.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, s.numel() - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def extract_lora(diff: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """(up, down) with up @ down ≈ diff at rank ``min(rank, out, in)``, clamped as ComfyUI.

    diff [out, in] → up [out, r], down [r, in]; diff [out, in, kh, kw] → up [out, r, 1, 1],
    down [r, in, kh, kw]."""
    out_dim, in_dim = diff.shape[0], diff.shape[1]
    rank = min(rank, in_dim, out_dim)
    flat = diff.float().flatten(1)  # [out, in·kh·kw]
    u, s, vh = torch.linalg.svd(flat, full_matrices=False)
    up = u[:, :rank] @ torch.diag(s[:rank])  # [out, r]
    down = vh[:rank, :]  # [r, in·kh·kw]
    hi = quantile(torch.cat([up.flatten(), down.flatten()]), CLAMP_QUANTILE)
    up, down = up.clamp(-hi, hi), down.clamp(-hi, hi)
    if diff.ndim == 4:
        up = up.reshape(out_dim, rank, 1, 1)
        down = down.reshape(rank, in_dim, diff.shape[2], diff.shape[3])
    return up, down


def lora_from_diff(sd: Mapping[str, Tensor], rank: int, lora_type: str, bias_diff: bool, prefix: str,
                   out_dtype: torch.dtype = torch.float16) -> dict[str, Tensor]:
    """The LoRA tensors for one difference state dict, keys prefixed with ``prefix``."""
    if lora_type not in LORA_TYPES:
        raise ValueError(f"lora_type must be one of {LORA_TYPES}, got {lora_type!r}")
    out: dict[str, Tensor] = {}

    def put(key: str, t: Tensor) -> None:
        out[prefix + key] = t.detach().to("cpu", out_dtype).contiguous()

    for k, w in sd.items():
        if k.endswith(".weight"):
            module = k[: -len(".weight")]
            if lora_type == "full_diff":
                put(f"{module}.diff", w)
            elif w.ndim < 2:
                if bias_diff:
                    put(f"{module}.diff", w)
            else:
                try:
                    up, down = extract_lora(w, rank)
                except (RuntimeError, torch.linalg.LinAlgError) as e:
                    log.warning("could not extract LoRA weights for %s (is the difference zero?): %s", k, e)
                    continue
                put(f"{module}.lora_up.weight", up)
                put(f"{module}.lora_down.weight", down)
        elif bias_diff and k.endswith(".bias"):
            put(f"{k[: -len('.bias')]}.diff_b", w)
    return out
