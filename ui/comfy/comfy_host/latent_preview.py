"""ComfyUI's `latent_preview` for custom node packs: the sampler step callback that reports
progress for the running node (and honours interrupts) and, when `--preview-method` asks for
previews and the model is one of ours (a MODEL handle whose latent format has preview factors), a
preview image of each step's x0 (latent2rgb or TAESD, `nodes/sampling/preview.py`). `get_previewer(device,
latent_format)` gives None: ComfyUI's latent_format objects are not provided here."""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from mixgraph.nodes.helpers.previews import previewer_for
import mixgraph.ui.comfy.comfy_runtime as _rt

MAX_PREVIEW_RESOLUTION = 512


class LatentPreviewer:
    def decode_latent_to_preview(self, x0: torch.Tensor) -> Image.Image:
        raise _rt.missing("latent_preview.LatentPreviewer.decode_latent_to_preview")

    def decode_latent_to_preview_image(self, preview_format: str, x0: torch.Tensor):
        return preview_format, self.decode_latent_to_preview(x0), MAX_PREVIEW_RESOLUTION


def preview_to_image(latent_image: torch.Tensor) -> Image.Image:
    """[H, W, 3] in -1..1 -> an RGB image."""
    rgb = ((latent_image + 1.0) / 2.0).clamp(0, 1).mul(255.0).byte().cpu().numpy()
    return Image.fromarray(rgb)


def get_previewer(device: Any, latent_format: Any) -> None:
    return None


def set_preview_method(method: Any) -> None:
    """Previews of custom samplers are not rendered; the method is accepted and ignored."""


def prepare_callback(model: Any, steps: int, x0_output_dict: dict | None = None):
    """callback(step, x0, x, total_steps): progress `step + 1` of `total_steps` for the running
    node; `x0_output_dict["x0"]` gets the latest x0 prediction."""
    now = _rt.running()
    previewer = previewer_for(now.ctx, model) if now is not None else None

    def callback(step: int, x0: torch.Tensor, x: torch.Tensor, total_steps: int) -> None:
        if x0_output_dict is not None:
            x0_output_dict["x0"] = x0
        if now is not None:
            image = previewer(x0) if previewer is not None and x0 is not None else None
            now.ctx.progress(step + 1, total_steps, preview=image)

    return callback
