"""LoRA names of diffusers' Wan layout (``WanTransformer3DModel``: diffusers / PEFT trainers,
musubi-tuner's diffusers exports) onto the Wan DiT's own weights (``base.LoraTarget``).

ComfyUI's own names (``diffusion_model.blocks.N.self_attn.q``: lightx2v's distill LoRAs, most
Wan LoRAs) and kohya's (``lora_unet_blocks_N_self_attn_q``) are the model's keys and need no map
(``adapters/lora_keys.py``). The diffusers names are the inverse of diffusers'
``convert_wan_transformer_to_diffusers`` table: attn1 / attn2 = self / cross attention, to_q /
to_k / to_v / to_out.0 = q / k / v / o, add_k_proj / add_v_proj = k_img / v_img, ffn.net.0.proj /
ffn.net.2 = ffn.0 / ffn.2, the condition embedder's layers = the time / text / image embeddings,
proj_out = head.head. Alibaba's Wan Fun LoRAs write kohya names with a doubled underscore
(``lora_unet__blocks_0_cross_attn_k``, ComfyUI's ``convert_lora_wan_fun``): mapped here too.
"""

from __future__ import annotations

import torch
from torch import nn

from mixgraph.nodes.families.base import LoraTarget
from mixgraph.nodes.families.wan.model import WanConfig, WanModel

__all__ = ["lora_targets"]

_ATTN = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o"}
_IMAGE = {"add_k_proj": "k_img", "add_v_proj": "v_img"}
_TOP = {
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "proj_out": "head.head",
    "patch_embedding": "patch_embedding",
}
_IMAGE_TOP = {
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
}


def lora_targets(config: WanConfig) -> dict[str, LoraTarget]:
    """diffusers module name (no prefix) -> the Wan weight it adapts, for every Linear."""
    out = {name: LoraTarget(f"{key}.weight") for name, key in _TOP.items()}
    if config.image:
        out |= {name: LoraTarget(f"{key}.weight") for name, key in _IMAGE_TOP.items()}
    for i in range(config.num_layers):
        for diff, wan in (("attn1", "self_attn"), ("attn2", "cross_attn")):
            for a, b in _ATTN.items():
                out[f"blocks.{i}.{diff}.{a}"] = LoraTarget(f"blocks.{i}.{wan}.{b}.weight")
        if config.image:
            for a, b in _IMAGE.items():
                out[f"blocks.{i}.attn2.{a}"] = LoraTarget(f"blocks.{i}.cross_attn.{b}.weight")
        out[f"blocks.{i}.ffn.net.0.proj"] = LoraTarget(f"blocks.{i}.ffn.0.weight")
        out[f"blocks.{i}.ffn.net.2"] = LoraTarget(f"blocks.{i}.ffn.2.weight")
    with torch.device("meta"):  # the module names without allocating weights
        model = WanModel(config)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            out["lora_unet__" + name.replace(".", "_")] = LoraTarget(f"{name}.weight")  # Wan Fun
    return out
