"""The text encoders of each SD variant, in the order their features join (ComfyUI ``sd1_clip`` /
``sd2_clip`` / ``sdxl_clip``): name -> output rule. All read the "clip" tokenizer in role "text".
``family.SD.text_encoders`` hands the rules to the loaders on each ``TextEncoderSlot``."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from mixgraph.nodes.encoders.clip import CLIPTextModel
from mixgraph.nodes.encoders.encoder_set import OutputRule
from mixgraph.nodes.encoders.text_encode import TextEncoder
from mixgraph.nodes.encoders.tokenizer import END_TOKEN
from mixgraph.nodes.families.sd.detect import CHECKPOINT_ENCODERS

__all__ = ["SD_ENCODERS", "sd_rules", "sd_text_encoders", "text_encoders_from_checkpoint"]

SD_ENCODERS: dict[str, tuple[tuple[str, OutputRule], ...]] = {
    "sd1": (("clip_l", OutputRule(END_TOKEN, None, True, False, pooled=True)),),
    "sd2": (("clip_h", OutputRule(0, -2, True, True, pooled=True)),),
    "sdxl": (("clip_l", OutputRule(END_TOKEN, -2, False, True)),
             ("clip_g", OutputRule(0, -2, False, True, pooled=True))),
    "sdxl_refiner": (("clip_g", OutputRule(0, -2, False, True, pooled=True)),),
}


def sd_rules(kind: str) -> tuple[tuple[str, OutputRule], ...]:
    rules = SD_ENCODERS.get(kind)
    if rules is None:
        raise ValueError(f"unknown text encoder kind {kind!r}; expected one of {tuple(SD_ENCODERS)}")
    return rules


def sd_text_encoders(kind: str, **models: nn.Module) -> tuple[TextEncoder, ...]:
    """The encoders of an SD variant from in-memory modules (``clip_l=...``, ``clip_g=...``)."""
    rules = sd_rules(kind)
    missing = [name for name, _ in rules if models.get(name) is None]
    if missing:
        raise ValueError(f"{kind} text encoding needs {', '.join(missing)}, which is not loaded")
    return tuple(TextEncoder(name, rule, models[name]) for name, rule in rules)


def text_encoders_from_checkpoint(sd: Mapping[str, Tensor], kind: str) -> tuple[TextEncoder, ...]:
    """The encoders of SD variant ``kind`` from a single-file checkpoint's state dict."""
    models = {name: CLIPTextModel.from_state_dict(sd, prefix=prefix)
              for name, (prefix, _) in CHECKPOINT_ENCODERS[kind].items()}
    return sd_text_encoders(kind, **models)
