"""Wan's text encoder: umT5-XXL (encoder architecture "umt5") and the "wan" set's join.

ComfyUI facts (``comfy/text_encoders/wan.py``, ``t5.py``, ``umt5_config_xxl.json``,
``comfy/sd1_clip.py``, ``comfy/sd.py``, ``comfy/supported_models.py`` ``WAN21_T2V``):

* umT5-XXL is T5 v1.1's encoder (``t5.T5EncoderModel``) with a relative-position bias table in
  every block (ComfyUI's ``model_type: umt5``), vocabulary 256,384, width 4096, 64 heads of 64,
  feed-forward 10240, 24 blocks. A file shows it by the table of block 1
  (``encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight``) or, for a one-block
  test file, by the vocabulary. ComfyUI's files (``umt5_xxl_fp16``, ``umt5_xxl_fp8_e4m3fn_scaled``:
  the quantised layout is read by ``weights/quantized.py`` for every model) keep the keys bare,
  with the SentencePiece model as ``spiece_model`` (``umt5_tokenizer``); Wan's single-file
  checkpoints under ``text_encoders.umt5xxl.transformer.``.
* ``UMT5XXlModel``: end 1, pad 0, the last layer normed, ``enable_attention_masks=True`` (padding
  after the end token is masked out of attention) and ``zero_out_masked=True`` (its hidden
  states are then zeroed); no attention mask is returned (``return_attention_masks`` False), so
  the cond carries none. The tokenizer pads every prompt to 512 tokens (``WAN_RULES``).
* The "wan" set (CLIPLoader type "wan") is umT5 alone; its cond is the hidden states
  ``[1, T, 4096]`` (T = 512 for a short prompt) with the zeroed padding kept, no pooled vector.
  ComfyUI's Wan model (``comfy/ldm/wan/model.py``) embeds the padded context as it comes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule, register_join
from mixgraph.nodes.encoders.t5 import T5Config, T5Rule, has_per_layer_bias, is_t5
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = ["WAN", "UMT5XXL", "UMT5_VOCAB", "UMT5_PREFIXES", "WAN_RULES", "is_umt5", "umt5_config", "wan_join"]

WAN = "wan"  # the set's name (ClipHandle.kind, TextEncoderSlot.encoding) and CLIPLoader's type
UMT5XXL = "umt5xxl"  # the encoder (slot) name, also the embedding key
UMT5_VOCAB = 256384
#: where files keep it: ComfyUI's standalone files (bare keys), Wan's single-file checkpoints
UMT5_PREFIXES = ("", f"text_encoders.{UMT5XXL}.transformer.")

WAN_RULES: dict[str, OutputRule] = {
    UMT5XXL: T5Rule(min_length=512, attention_mask=True, zero_masked=True),
}


def is_umt5(info: Mapping[str, Any], prefix: str = "") -> bool:
    """Whether ``info`` holds a umT5 encoder under ``prefix``: T5 v1.1's keys with a bias table
    in block 1, or (one block) umT5's vocabulary."""
    if not is_t5(info, prefix):
        return False
    if has_per_layer_bias(info, prefix):
        return True
    vocab = tuple(getattr(info[prefix + "shared.weight"], "shape", info[prefix + "shared.weight"]))[0]
    return vocab == UMT5_VOCAB and prefix + "encoder.block.1.layer.0.SelfAttention.q.weight" not in info


def umt5_config(info: Mapping[str, Any]) -> T5Config:
    """The config from the prefix-stripped keys; a one-block file has no block 1 to show the
    per-block tables, so it is umT5 by being asked for."""
    cfg = T5Config.from_state_dict(info)
    return cfg if cfg.per_layer_bias else dataclasses.replace(cfg, per_layer_bias=True)


def wan_join(outputs: Mapping[str, EncodedText]) -> Cond:
    """Wan: umT5's tokens [1, T, 4096] (padding zeroed by the rule), no pooled vector, no mask."""
    if UMT5XXL not in outputs:
        raise ValueError(f"wan text encoding needs {UMT5XXL}; this CLIP gave {', '.join(outputs) or 'nothing'}")
    return Cond(cross_attn=outputs[UMT5XXL].hidden.float())


register_join(WAN, wan_join)
