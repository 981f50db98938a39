"""How the text encoders of Flux.1, SD3/3.5 and Chroma make one cond (the sets' joins).

ComfyUI facts (``comfy/text_encoders/flux.py``, ``sd3_clip.py``, ``pixart_t5.py``):

* "flux" (clip_l + t5xxl): the tokens are T5's hidden states, the pooled vector CLIP-L's
  (unprojected, its last layer's end token).
* "sd3" (clip_l, clip_g, t5xxl, each optional): CLIP-L's and CLIP-G's penultimate hidden states
  join along features (768 + 1280), cut to the shorter, then zero-padded to the T5 width (4096)
  and put before T5's tokens along the token axis; the pooled vector is cat(CLIP-L pooled,
  CLIP-G projected pooled). A missing CLIP is zeros of its width (CLIP-L 768, CLIP-G 1280, which
  ComfyUI fixes) in the pooled vector, and CLIP-G alone is padded in front by 768; without T5 the
  CLIP tokens are padded to 4096; with no encoder output at all the tokens are zeros
  [1, 77, 4096]. CLIPs given no tokens at all (CLIPTextEncodeSD3's "none" with empty prompts,
  ``EncodedText.empty``) count as missing; a T5 given none still adds its one-token encoding of
  the end token, as in ComfyUI.
* "chroma" (t5xxl): T5's hidden states alone, no pooled vector.

The encoders' output rules of each set (``FLUX_RULES``, ``SD3_RULES``, ``CHROMA_RULES``: encoder
name -> rule, for the families' ``TextEncoderSlot``s): Flux's CLIP-L gives its last layer, normed,
and its unprojected pooled vector, its T5 pads prompts to 256 tokens; SD3's CLIP-L its penultimate
layer raw with the unprojected pooled vector, CLIP-G (pad 0) its penultimate layer raw with the
projected pooled vector, T5 pads to 77; Chroma's T5 (ComfyUI's PixArt encoder) pads to 1 token,
i.e. not at all, and weights interpolate against an all-pad empty prompt. None of them masks T5's
attention (ComfyUI's default for these sets).

Where the T5 ran with an attention mask (its rule's ``attention_mask``), the mask travels as
``model_inputs["attention_mask"]`` [1, T] (ComfyUI's ``extra["attention_mask"]``). The padding
width is the loaded T5's (4096 at full size) when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule, register_join
from mixgraph.nodes.encoders.t5 import T5Rule
from mixgraph.nodes.encoders.tokenizer import END_TOKEN
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = ["flux_join", "sd3_join", "chroma_join", "CLIP_L_WIDTH", "CLIP_G_WIDTH", "T5_WIDTH",
           "FLUX_RULES", "SD3_RULES", "CHROMA_RULES"]

CLIP_L_WIDTH, CLIP_G_WIDTH, T5_WIDTH = 768, 1280, 4096  # ComfyUI's widths for missing encoders

FLUX_RULES: dict[str, OutputRule] = {
    "clip_l": OutputRule(END_TOKEN, None, True, False, pooled=True),
    "t5xxl": T5Rule(min_length=256),
}
SD3_RULES: dict[str, OutputRule] = {
    "clip_l": OutputRule(END_TOKEN, -2, False, False, pooled=True),
    "clip_g": OutputRule(0, -2, False, True, pooled=True),
    "t5xxl": T5Rule(min_length=77),
}
CHROMA_RULES: dict[str, OutputRule] = {"t5xxl": T5Rule(min_length=1, empty_end=False)}


def _needs(outputs: Mapping[str, EncodedText], set_name: str, *names: str) -> None:
    missing = [n for n in names if n not in outputs]
    if missing:
        raise ValueError(f"{set_name} text encoding needs {', '.join(missing)}; this CLIP gave "
                         f"{', '.join(outputs) or 'nothing'}")


def _mask_inputs(t5: EncodedText | None) -> dict[str, Tensor]:
    return {} if t5 is None or t5.mask is None else {"attention_mask": t5.mask.float()}


def flux_join(outputs: Mapping[str, EncodedText]) -> Cond:
    """Flux.1: T5's tokens [1, T, 4096], CLIP-L's pooled vector [1, 768]."""
    _needs(outputs, "flux", "t5xxl", "clip_l")
    t5, clip_l = outputs["t5xxl"], outputs["clip_l"]
    return Cond(cross_attn=t5.hidden.float(), pooled=clip_l.pooled.float(), model_inputs=_mask_inputs(t5))


def sd3_join(outputs: Mapping[str, EncodedText]) -> Cond:
    """SD3 / SD3.5 (module docstring): tokens [1, 77 + T, W], pooled [1, 768 + 1280]."""
    clip_l, clip_g, t5 = outputs.get("clip_l"), outputs.get("clip_g"), outputs.get("t5xxl")
    width = T5_WIDTH if t5 is None else t5.hidden.shape[-1]
    lg = pooled = None
    if any(o is not None and not o.empty for o in (clip_l, clip_g)):  # ComfyUI: CLIP tokens given
        l_pooled = clip_l.pooled if clip_l is not None else torch.zeros(1, CLIP_L_WIDTH)
        if clip_g is not None:
            g_pooled = clip_g.pooled
            if clip_l is not None:
                cut = min(clip_l.hidden.shape[1], clip_g.hidden.shape[1])
                lg = torch.cat([clip_l.hidden[:, :cut], clip_g.hidden[:, :cut]], dim=-1)  # [1, T, Dl + Dg]
            else:
                lg = F.pad(clip_g.hidden, (CLIP_L_WIDTH, 0))  # [1, T, 768 + Dg]
        else:
            g_pooled = torch.zeros(1, CLIP_G_WIDTH)
            lg = clip_l.hidden
        if lg.shape[-1] > width:
            raise ValueError(f"sd3 text encoding: the CLIP features ({lg.shape[-1]} wide) are wider than "
                             f"the T5's {width}; these encoders do not make one SD3 set")
        lg = F.pad(lg, (0, width - lg.shape[-1]))  # [1, T, W], zeros after the CLIP features
        pooled = torch.cat([l_pooled.float(), g_pooled.float()], dim=-1)  # [1, Pl + Pg]
    out = lg
    if t5 is not None:
        out = t5.hidden if lg is None else torch.cat([lg, t5.hidden], dim=-2)  # [1, T_clip + T_t5, W]
    if out is None:
        out = torch.zeros(1, 77, width)
    if pooled is None:
        pooled = torch.zeros(1, CLIP_L_WIDTH + CLIP_G_WIDTH)
    return Cond(cross_attn=out.float(), pooled=pooled.float(), model_inputs=_mask_inputs(t5))


def chroma_join(outputs: Mapping[str, EncodedText]) -> Cond:
    """Chroma: T5's tokens [1, T, 4096], no pooled vector."""
    _needs(outputs, "chroma", "t5xxl")
    t5 = outputs["t5xxl"]
    return Cond(cross_attn=t5.hidden.float(), model_inputs=_mask_inputs(t5))


register_join("flux", flux_join)
register_join("sd3", sd3_join)
register_join("chroma", chroma_join)
