"""LoRA module names → model weight keys: every naming scheme LoRA files use, matched by lookup.

Naming schemes understood (``<m>`` a module name with dots):
  kohya, LDM names        ``lora_unet_<ldm m, . → _>`` (SDXL files), ``lora_te_`` / ``lora_te1_``
                          (clip_l) / ``lora_te2_`` (clip_g) + ``text_model_encoder_layers_N_...``
  kohya, diffusers names  ``lora_unet_<diffusers m, . → _>`` (SD1.x files)
  diffusers / PEFT        ``unet.<diffusers m>``, bare ``<diffusers m>``, ``text_encoder.<m>``,
                          ``text_encoder_2.<m>``, old attention-processor names
                          (``attn1.processor.to_q_lora.up.weight``), ``base_model.model.`` prefix
  generic (ComfyUI)       ``diffusion_model.<ldm m>``, ``text_encoders.<clip>.transformer.<m>``
  SimpleTuner / LyCORIS   ``lycoris_<diffusers m, . → _>``
  a family's own map      a DiT family's other layout (``Family.lora_key_map``: diffusers / PEFT /
                          ai-toolkit names of Flux, SD3, Z-Image, ...), each name bare and with the
                          prefixes trainers write (``FAMILY_PREFIXES``); an entry may adapt a row
                          slice of a fused weight (``families.base.LoraTarget``)
  text encoders after the CLIPs (T5-XXL, Qwen3, ...): generic ``text_encoders.<name>.transformer.<m>``,
                          kohya ``lora_te<n>_`` and diffusers ``text_encoder_<n>.`` with n their place
                          after the set's CLIPs (ComfyUI's rule for T5: Flux ``lora_te2_`` / ``lora_te3_``,
                          SD3 ``lora_te3_``, Chroma ``lora_te1_``)

Because ``_`` is ambiguous once dots are replaced, names are never parsed: every candidate name of
every model weight is generated and looked up (the only sound way). The diffusers↔LDM UNet module
correspondence is ``nodes.weights.diffusers_names.unet_diffusers_module_map`` (shared with the
loader and the ControlNet converter). A file key splits into (module, slot) by its suffix
(``split_key``); ``nodes.adapters.lora`` turns each module's slots into an adapter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import Tensor

from mixgraph.nodes.families.base import LoraTarget
from mixgraph.nodes.weights.diffusers_names import unet_diffusers_module_map

__all__ = [
    "CLIP_TARGETS",
    "split_key",
    "normalize_module",
    "group_modules",
    "key_shapes",
    "unet_candidates",
    "clip_candidates",
    "model_lookup",
    "is_text_encoder_name",
    "family_candidates",
    "FAMILY_PREFIXES",
]

#: The SD text encoders' names, in the order a LoRA's patches list them. Any other text encoder
#: name (a CLIP handle's ``names``) is a target too, matched by the generic naming only unless
#: ``_KOHYA_TE`` / ``_DIFFUSERS_TE`` give it its kohya / diffusers prefixes.
CLIP_TARGETS = ("clip_l", "clip_g", "clip_h")


# --------------------------------------------------------------------------------------------
# parsing a LoRA state dict into modules

# (suffix, slot); longest suffixes first so ".lora_up.weight" wins over ".weight"-like overlaps.
_SUFFIXES: list[tuple[str, str]] = sorted(
    [
        (".lora_up.weight", "up"), (".lora_down.weight", "down"), (".lora_mid.weight", "mid"),
        (".lora_B.weight", "up"), (".lora_A.weight", "down"),
        (".lora_B.default.weight", "up"), (".lora_A.default.weight", "down"),
        (".lora.up.weight", "up"), (".lora.down.weight", "down"),
        ("_lora.up.weight", "up"), ("_lora.down.weight", "down"),
        (".lora_linear_layer.up.weight", "up"), (".lora_linear_layer.down.weight", "down"),
        (".alpha", "alpha"),
        (".hada_w1_a", "hada_w1_a"), (".hada_w1_b", "hada_w1_b"),
        (".hada_w2_a", "hada_w2_a"), (".hada_w2_b", "hada_w2_b"),
        (".hada_t1", "hada_t1"), (".hada_t2", "hada_t2"),
        (".lokr_w1", "lokr_w1"), (".lokr_w1_a", "lokr_w1_a"), (".lokr_w1_b", "lokr_w1_b"),
        (".lokr_w2", "lokr_w2"), (".lokr_w2_a", "lokr_w2_a"), (".lokr_w2_b", "lokr_w2_b"),
        (".lokr_t2", "lokr_t2"),
        (".diff", "diff"), (".diff_b", "diff_b"),
        (".dora_scale", "dora_scale"), (".w_norm", "unsupported"), (".b_norm", "unsupported"),
        (".oft_blocks", "unsupported"), (".oft_diag", "unsupported"), (".a1.weight", "unsupported"),
    ],
    key=lambda s: -len(s[0]),
)


def split_key(key: str) -> tuple[str, str] | None:
    for suffix, slot in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], slot
    return None


def normalize_module(name: str) -> str:
    """Undo wrapper prefixes and the old diffusers attention-processor naming."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    name = name.replace(".processor.to_out", ".to_out.0").replace(".processor.", ".")
    return name


def group_modules(sd: Mapping[str, Tensor]) -> tuple[dict[str, dict[str, Tensor]], list[str]]:
    """({module: {slot: tensor}} with module names normalized, keys of no known format)."""
    grouped: dict[str, dict[str, Tensor]] = {}
    stray: list[str] = []
    for key, t in sd.items():
        split = split_key(key)
        if split is None:
            stray.append(key)
            continue
        module, slot = split
        grouped.setdefault(normalize_module(module), {})[slot] = t
    return grouped, stray


# --------------------------------------------------------------------------------------------
# candidate names for model weights


def key_shapes(keys: Mapping | Iterable[str] | None) -> dict[str, tuple[int, ...] | None]:
    """Accept a state dict, a key -> shape mapping, or plain keys."""
    if keys is None:
        return {}
    if isinstance(keys, Mapping):
        out = {}
        for k, v in keys.items():
            shape = getattr(v, "shape", v)
            out[k] = tuple(shape) if shape is not None else None
        return out
    return {k: None for k in keys}


def _ldm_unet_name(key: str) -> str:
    i = key.find("diffusion_model.")
    return key[i + len("diffusion_model."):] if i >= 0 else key


def _clip_name(key: str) -> str:
    i = key.find("text_model.")
    if i >= 0:
        return key[i:]
    return key[len("transformer."):] if key.startswith("transformer.") else key


def unet_candidates(weight_keys: Iterable[str]) -> dict[str, str]:
    """LoRA module name -> model module key (without .weight), every scheme."""
    modules = {k[: -len(".weight")]: k for k in weight_keys if k.endswith(".weight")}
    ldm = {_ldm_unet_name(m): m for m in modules}
    to_diff = unet_diffusers_module_map(ldm)
    out: dict[str, str] = {}
    for name, module in ldm.items():
        out["lora_unet_" + name.replace(".", "_")] = module
        out["diffusion_model." + name] = module
        d = to_diff.get(name)
        if d is not None:
            us = d.replace(".", "_")
            out["lora_unet_" + us] = module
            out["lycoris_" + us] = module
            out["unet." + d] = module
            out[d] = module
    return out


#: prefixes of a family's other-layout LoRA names (``family_candidates``): diffusers / ai-toolkit
#: ``transformer.``, ComfyUI-converted ``diffusion_model.``, OneTrainer ``lora_transformer_`` and
#: SimpleTuner / LyCORIS ``lycoris_`` (these two with dots as underscores); PEFT's
#: ``base_model.model.`` is stripped by ``normalize_module``
FAMILY_PREFIXES = ("", "transformer.", "diffusion_model.")
FAMILY_FLAT_PREFIXES = ("lora_transformer_", "lycoris_")


def family_candidates(names: Mapping[str, LoraTarget], weight_keys: Iterable[str] | None) -> dict[str, LoraTarget]:
    """LoRA module name -> ``LoraTarget`` for a family's ``lora_key_map``: each name with every
    prefix of ``FAMILY_PREFIXES`` / ``FAMILY_FLAT_PREFIXES``; entries whose weight is not among
    ``weight_keys`` (a variant without that layer) are left out (None: keep all)."""
    keys = None if weight_keys is None else set(weight_keys)
    out: dict[str, LoraTarget] = {}
    for name, tgt in names.items():
        if keys is not None and tgt.key not in keys:
            continue
        for p in FAMILY_PREFIXES:
            out.setdefault(p + name, tgt)
        flat = name.replace(".", "_")
        for p in FAMILY_FLAT_PREFIXES:
            out.setdefault(p + flat, tgt)
    return out


_KOHYA_TE = {"clip_l": ("lora_te_", "lora_te1_"), "clip_h": ("lora_te_",), "clip_g": ("lora_te2_",)}
_DIFFUSERS_TE = {"clip_l": "text_encoder.", "clip_h": "text_encoder.", "clip_g": "text_encoder_2."}


def _later_encoder_prefixes(targets: Iterable[str]) -> dict[str, tuple[tuple[str, ...], str]]:
    """(kohya prefixes, diffusers prefix) of each text encoder that is not a CLIP, by its place
    after the set's CLIPs (ComfyUI ``model_lora_keys_clip``'s T5 rule: with clip_l alone both
    ``lora_te2_`` (OneTrainer) and ``lora_te3_``; diffusers pipelines number their encoders
    ``text_encoder``, ``text_encoder_2``, ...)."""
    targets = list(targets)
    clips = [t for t in targets if t in CLIP_TARGETS]
    out = {}
    for j, t in enumerate(t for t in targets if t not in CLIP_TARGETS):
        n = len(clips) + 1 + j
        kohya = (f"lora_te{n}_",) + (("lora_te3_",) if j == 0 and clips == ["clip_l"] else ())
        out[t] = (kohya, "text_encoder." if n == 1 else f"text_encoder_{n}.")
    return out


def clip_candidates(target: str, weight_keys: Iterable[str],
                    later: tuple[tuple[str, ...], str] | None = None) -> dict[str, str]:
    """LoRA module name -> model module key of one text encoder; ``later``: the (kohya prefixes,
    diffusers prefix) of an encoder that is not a CLIP (``_later_encoder_prefixes``)."""
    out: dict[str, str] = {}
    kohya = _KOHYA_TE.get(target, ()) if later is None else later[0]
    diffusers = _DIFFUSERS_TE.get(target) if later is None else later[1]
    for k in weight_keys:
        if not k.endswith(".weight"):
            continue
        module = k[: -len(".weight")]
        name = _clip_name(module)
        for p in kohya:
            out[p + name.replace(".", "_")] = module
        if diffusers is not None:
            out[diffusers + name] = module
        out[f"text_encoders.{target}.transformer.{name}"] = module
        out[f"text_encoders.{target}.{name}"] = module
    return out


_TE_MARKERS = ("lora_te", "text_encoder", "text_encoders.")


def is_text_encoder_name(module: str) -> bool:
    return module.startswith(_TE_MARKERS)


def model_lookup(
    unet_keys: Mapping | Iterable[str] | None,
    clip_keys: Mapping[str, Mapping | Iterable[str]] | None,
    unet_names: Mapping[str, LoraTarget] | None = None,
) -> tuple[dict[str, tuple[str, str, LoraTarget | None]], dict[str, tuple[int, ...] | None]]:
    """(LoRA module name -> (target, model module, slice) over every naming scheme, model key ->
    shape). The slice is a ``LoraTarget`` for a family-map name (``unet_names``, the family's
    ``lora_key_map``), None for a name of the whole weight ``<module>.weight``.

    The model's own names win over a family's map, UNet candidates over CLIP ones on a clash;
    see ``nodes.adapters.lora.load_lora`` for the accepted forms of ``unet_keys`` / ``clip_keys``."""
    unet_shapes = key_shapes(unet_keys)
    shapes: dict[str, tuple[int, ...] | None] = {}
    lookup: dict[str, tuple[str, str, LoraTarget | None]] = {}  # lora module -> (target, module, slice)
    if unet_keys is not None:
        for cand, module in unet_candidates(unet_shapes).items():
            lookup[cand] = ("unet", module, None)
        for cand, tgt in family_candidates(unet_names or {}, unet_shapes).items():
            lookup.setdefault(cand, ("unet", tgt.key[: -len(".weight")], tgt))
        shapes.update(unet_shapes)
    later = _later_encoder_prefixes(clip_keys or {})
    for target, keys in (clip_keys or {}).items():
        if not target or target == "unet":
            raise ValueError(f"clip_keys are keyed by text encoder name (e.g. {CLIP_TARGETS}), got {target!r}")
        ks = key_shapes(keys)
        for cand, module in clip_candidates(target, ks, later.get(target)).items():
            lookup.setdefault(cand, (target, module, None))
        shapes.update(ks)
    return lookup, shapes
