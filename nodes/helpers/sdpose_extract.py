"""`SDPoseKeypointExtractor`'s pipeline (ComfyUI ``comfy_extras/nodes_sdpose.py`` 47e4a90, facts
carried over): images (or bbox crops) stretched to the head's input size (area when shrinking
both ways, else bilinear), VAE-encoded, one Euler step ("simple", cfg 1, noise disabled) with
LotusConditioning's null prompt as positive and negative, while an output-block patch keeps the
last UNet feature as wide as the head's input (640 in the real checkpoints); the heatmap head
decodes keypoints (``families/sd/sdpose.py``), which are mapped back to image pixels (÷ scale + crop
offset; x < 0 stays −1) and turned into OpenPose frames.

As ComfyUI, the capture patch replaces the model's other forward-time UNet patches for this run
(ComfyUI overwrites ``transformer_options``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from mixgraph.nodes.families.sd.parts import parts_of
from mixgraph.nodes.families.sd import lotus, sdpose
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.sampling import ksampler

NO_HEAD = ("The provided model does not have a heatmap_head. Please use SDPose model from here "
           "https://huggingface.co/Comfy-Org/SDPose/tree/main/checkpoints.")


def resize_to_model(images: torch.Tensor, model_w: int, model_h: int) -> tuple[torch.Tensor, float, float]:
    """Stretch [B, H, W, C] to model_h × model_w (no aspect kept); (images, sx, sy)."""
    h, w = images.shape[-3], images.shape[-2]
    method = "area" if (model_h <= h and model_w <= w) else "bilinear"
    chw = images.permute(0, 3, 1, 2).float()
    out = upscale(chw, model_w, model_h, method, "disabled")
    return out.permute(0, 2, 3, 1), model_w / w, model_h / h


def remap_keypoints(kp: np.ndarray, sx: float, sy: float, ox: float = 0, oy: float = 0) -> np.ndarray:
    """Model-input pixels -> image pixels; a keypoint with x < 0 (invalid) becomes (−1, −1)."""
    kp = np.array(kp, dtype=np.float32, copy=True)
    invalid = kp[..., 0] < 0
    kp[..., 0] = kp[..., 0] / sx + ox
    kp[..., 1] = kp[..., 1] / sy + oy
    kp[invalid] = -1
    return kp


def extract(model, vae, image: torch.Tensor, batch_size: int, bboxes: Any, model_policy, vae_policy,
            on_image=None) -> list[dict]:
    """The node's run; ``on_image(n)`` reports n more images done."""
    weights = parts_of(model).heatmap_head
    if weights is None:
        raise ValueError(NO_HEAD)
    head_cfg = weights.config
    model_w, model_h = head_cfg.input_size
    height, width = int(image.shape[-3]), int(image.shape[-2])
    cond = lotus.lotus_conditioning()
    capture = sdpose.FeatureCapture(head_cfg.in_channels)
    runner = dataclasses.replace(model, unet_patches=(capture,)).runner(model_policy)
    head = weights.module(model_policy)

    def run(pixels: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
        latent = vae.encode(pixels[..., :3], vae_policy)
        capture.sink.clear()
        ksampler.sample(runner, seed=0, steps=1, cfg=1.0, sampler_name="euler", scheduler="simple",
                        positive=cond, negative=cond, latent=Latent(latent), add_noise=False)
        if not capture.sink:
            raise ValueError(f"SDPoseKeypointExtractor: the UNet has no output-block feature "
                             f"{head_cfg.in_channels} channels wide for the heatmap head")
        return weights.keypoints(head, capture.sink[0])

    all_kp: list[list[np.ndarray]] = []
    all_sc: list[list[np.ndarray]] = []
    total = int(image.shape[0])
    if bboxes is not None:
        if not isinstance(bboxes, list):
            bboxes = [[bboxes]]
        elif len(bboxes) == 0:
            bboxes = [None] * total
        for i in range(total):
            img = image[i:i + 1]
            boxes = bboxes[min(i, len(bboxes) - 1)] if bboxes else None
            if isinstance(boxes, dict):
                boxes = [boxes]
            kps, scs = [], []
            if boxes:
                for box in boxes:
                    x1, y1 = max(0, int(box["x"])), max(0, int(box["y"]))
                    x2 = min(width, int(box["x"] + box["width"]))
                    y2 = min(height, int(box["y"] + box["height"]))
                    if x2 <= x1 or y2 <= y1:
                        continue
                    crop, sx, sy = resize_to_model(img[:, y1:y2, x1:x2, :], model_w, model_h)
                    kp, sc = run(crop)
                    kps.append(remap_keypoints(kp[0], sx, sy, x1, y1))
                    scs.append(sc[0])
            else:
                resized, sx, sy = resize_to_model(img, model_w, model_h)
                kp, sc = run(resized)
                kps.append(remap_keypoints(kp[0], sx, sy))
                scs.append(sc[0])
            all_kp.append(kps)
            all_sc.append(scs)
            if on_image is not None:
                on_image(1)
    else:
        for start in range(0, total, batch_size):
            resized, sx, sy = resize_to_model(image[start:start + batch_size], model_w, model_h)
            kp_batch, sc_batch = run(resized)
            for kp, sc in zip(kp_batch, sc_batch):
                all_kp.append([remap_keypoints(kp, sx, sy)])
                all_sc.append([sc])
            if on_image is not None:
                on_image(len(kp_batch))
    return sdpose.to_openpose_frames(all_kp, all_sc, height, width)
