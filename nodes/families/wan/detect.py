"""Which Wan DiT a diffusion model is, and its config, from tensor names and shapes only.

ComfyUI (``model_detection.py``) recognises Wan by ``head.modulation`` and reads the width from
it, the heads as width // 128, the MLP width, depth and input channels from shapes, and the kind
from marker keys: ``img_emb.*`` (image-to-video, CLIP image tokens), ``img_emb.emb_pos``
(first-last-frame), ``vace_patch_embedding`` (VACE). Its model classes then follow from the
channel counts (``supported_models.WAN21_*`` / ``WAN22_T2V``):

=============  ==========================  ===========================================  =======
variant        keys / shapes               what it is                                   latent
=============  ==========================  ===========================================  =======
``t2v``        16 in, 16 out               Wan 2.1 t2v 1.3B / 14B, Wan 2.2 A14B t2v      Wan 2.1
``i2v``        ``img_emb``, 36 in          Wan 2.1 i2v 480p / 720p                       Wan 2.1
``flf2v``      ``img_emb.emb_pos``         Wan 2.1 first-last-frame 14B                  Wan 2.1
``i2v_a14b``   36 in, no ``img_emb``       Wan 2.2 A14B i2v experts (no CLIP tokens)     Wan 2.1
``ti2v_5b``    48 out                      Wan 2.2 TI2V 5B (one timestep per frame;      Wan 2.2
                                           Fun InP 5B: 100 in, the i2v concat)
``vace``       ``vace_blocks``             Wan 2.1 VACE 1.3B / 14B                       Wan 2.1
``fun``        48 in, 16 out               Wan 2.1 Fun Control                           Wan 2.1
=============  ==========================  ===========================================  =======

The other Wan variants (camera control, S2V, HuMo, Animate, reference-conv models) carry marker
keys this module does not build; they stay refused by name (``refused.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.families.wan.model import WanConfig

__all__ = ["SIGNATURE", "OTHER_VARIANTS", "wan_config", "variant_of", "VARIANTS", "IMAGE_TO_VIDEO"]

SIGNATURE = ("head.modulation", "patch_embedding.weight", "blocks.0.ffn.0.weight", "text_embedding.0.weight")
# marker keys of Wan variants with parts not built here (ComfyUI's camera, s2v, humo, animate, ref_conv)
OTHER_VARIANTS = ("control_adapter.conv.weight", "casual_audio_encoder.encoder.final_linear.weight",
                  "audio_proj.audio_proj_glob_1.layer.bias", "face_adapter.fuser_blocks.0.k_norm.weight",
                  "ref_conv.weight")
VARIANTS = ("t2v", "i2v", "flf2v", "i2v_a14b", "ti2v_5b", "vace", "fun")
# ComfyUI's ``image_to_video`` flag of the model class (WAN21 i2v, WAN22): how its concat treats
# a latent with no image
IMAGE_TO_VIDEO = frozenset({"i2v", "flf2v", "ti2v_5b"})


def _shape(info: Mapping[str, Any], key: str) -> tuple[int, ...]:
    return tuple(getattr(info[key], "shape", info[key]))


def _count(info: Mapping[str, Any], prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in info if k.startswith(prefix)})


def wan_config(info: Mapping[str, Any]) -> WanConfig | None:
    """The config of the Wan DiT whose keys (no prefix) and shapes are ``info``, or None when it
    is no Wan DiT of a kind this family builds."""
    if any(k not in info for k in SIGNATURE) or any(k in info for k in OTHER_VARIANTS):
        return None
    dim = _shape(info, "head.modulation")[-1]
    patch = _shape(info, "patch_embedding.weight")  # [dim, in_dim, 1, 2, 2]
    if len(patch) != 5 or tuple(patch[2:]) != (1, 2, 2):
        return None
    image = "img_emb.proj.0.weight" in info
    flf = _shape(info, "img_emb.emb_pos")[1] if "img_emb.emb_pos" in info else None
    vace_layers: tuple[int, ...] = ()
    vace_in = 0
    layers = _count(info, "blocks.")
    if "vace_patch_embedding.weight" in info:
        count = _count(info, "vace_blocks.")
        step = max(1, layers // max(1, count))
        vace_layers = tuple(range(0, layers, step))[:count]  # ComfyUI's vace_layers_mapping
        vace_in = _shape(info, "vace_patch_embedding.weight")[1]
    return WanConfig(
        in_dim=patch[1], out_dim=_shape(info, "head.head.weight")[0] // 4, dim=dim,
        ffn_dim=_shape(info, "blocks.0.ffn.0.weight")[0], num_layers=layers,
        text_dim=_shape(info, "text_embedding.0.weight")[1],
        freq_dim=_shape(info, "time_embedding.0.weight")[1],
        image=image, image_dim=_shape(info, "img_emb.proj.0.weight")[0] if image else 1280,
        flf_tokens=flf, vace_layers=vace_layers, vace_in_dim=vace_in)


def variant_of(cfg: WanConfig) -> str:
    """The variant name (module docstring table) of a config."""
    if cfg.vace_layers:
        return "vace"
    if cfg.out_dim == 48:
        return "ti2v_5b"
    if cfg.flf_tokens is not None:
        return "flf2v"
    if cfg.image:
        return "i2v" if cfg.in_dim == 36 else "fun"
    if cfg.in_dim == 36:
        return "i2v_a14b"
    if cfg.in_dim == 48:
        return "fun"
    return "t2v"
