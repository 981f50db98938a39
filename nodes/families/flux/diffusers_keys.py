"""diffusers' ``FluxTransformer2DModel`` / ``ChromaTransformer2DModel`` key layout <-> BFL's
(``model.py``'s attribute names), both ways.

diffusers splits what BFL fuses: q, k, v (and, in single-stream blocks, the MLP input) are
separate Linears, so one BFL tensor is the concatenation of several diffusers tensors along the
output dimension. Its last layer's modulation (``norm_out.linear``) stores (scale, shift) where
BFL stores (shift, scale). One table (``key_plan``) says which diffusers keys make each BFL key
and how; it converts tensors (``to_bfl``, ``to_diffusers``) and a header's shapes
(``shapes_to_bfl``, for detection).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mixgraph.nodes.families.base import LoraTarget

__all__ = ["is_diffusers_flux", "is_diffusers_chroma", "chroma_plan", "key_plan", "to_bfl", "to_diffusers",
           "shapes_to_bfl", "stored_rename", "fuse", "lora_targets", "SIGNATURE"]

#: keys only a diffusers Flux / Chroma transformer has (ComfyUI's test: ``x_embedder.weight``)
SIGNATURE = ("x_embedder.weight", "single_transformer_blocks.0.attn.to_q.weight")

_TOP = {  # BFL name -> diffusers name (renamed one to one; each with .weight and .bias)
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
    "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
    "final_layer.linear": "proj_out",
}
_DOUBLE = {
    "img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear",
    "img_attn.proj": "attn.to_out.0", "txt_attn.proj": "attn.to_add_out",
    "img_mlp.0": "ff.net.0.proj", "img_mlp.2": "ff.net.2",
    "txt_mlp.0": "ff_context.net.0.proj", "txt_mlp.2": "ff_context.net.2",
}
_DOUBLE_NORMS = {  # RMS norm scales: BFL .scale <- diffusers .weight
    "img_attn.norm.query_norm": "attn.norm_q", "img_attn.norm.key_norm": "attn.norm_k",
    "txt_attn.norm.query_norm": "attn.norm_added_q", "txt_attn.norm.key_norm": "attn.norm_added_k",
}
_SINGLE = {"modulation.lin": "norm.linear", "linear2": "proj_out"}
_SINGLE_NORMS = {"norm.query_norm": "attn.norm_q", "norm.key_norm": "attn.norm_k"}


@dataclass(frozen=True)
class Part:
    """One BFL tensor made of diffusers tensors: ``sources`` concatenated along dim 0 ("cat"; one
    source: a rename) or the two halves of one source swapped ("swap")."""

    sources: tuple[str, ...]
    op: str = "cat"


def is_diffusers_flux(keys) -> bool:
    return all(k in keys for k in SIGNATURE)


def is_diffusers_chroma(keys) -> bool:
    return "distilled_guidance_layer.in_proj.weight" in keys


def chroma_plan(diffusers_keys) -> dict[str, Part]:
    """Chroma's approximator rows: its MLP layers are ``linear_1`` / ``linear_2`` in diffusers,
    ``in_layer`` / ``out_layer`` in BFL, its RMS norms ``.weight`` / ``.scale``."""
    keys = set(diffusers_keys)
    plan = {}
    for k in keys:
        if not k.startswith("distilled_guidance_layer."):
            continue
        bfl = k.replace(".linear_1.", ".in_layer.").replace(".linear_2.", ".out_layer.")
        if re.match(r"distilled_guidance_layer\.norms\.\d+\.weight$", k):
            bfl = k[:-len("weight")] + "scale"
        plan[bfl] = Part((k,))
    return plan


def _blocks(keys, prefix: str) -> list[int]:
    found = {int(m.group(1)) for k in keys if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return sorted(found)


def key_plan(diffusers_keys) -> dict[str, Part]:
    """BFL key -> ``Part`` for the diffusers keys given (which say the depths, biases, guidance)."""
    keys = set(diffusers_keys)
    plan: dict[str, Part] = {}

    def add(bfl: str, diff: str) -> None:
        for end in ("weight", "bias"):
            if f"{diff}.{end}" in keys:
                plan[f"{bfl}.{end}"] = Part((f"{diff}.{end}",))

    for bfl, diff in _TOP.items():
        add(bfl, diff)
    if "norm_out.linear.weight" in keys:
        for end in ("weight", "bias"):
            plan[f"final_layer.adaLN_modulation.1.{end}"] = Part((f"norm_out.linear.{end}",), "swap")
    for i in _blocks(keys, "transformer_blocks."):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for bfl, diff in _DOUBLE.items():
            add(b + bfl, d + diff)
        for bfl, diff in _DOUBLE_NORMS.items():
            plan[f"{b}{bfl}.scale"] = Part((f"{d}{diff}.weight",))
        for end in ("weight", "bias"):
            if f"{d}attn.to_q.{end}" in keys:
                plan[f"{b}img_attn.qkv.{end}"] = Part(tuple(f"{d}attn.to_{x}.{end}" for x in "qkv"))
                plan[f"{b}txt_attn.qkv.{end}"] = Part(tuple(f"{d}attn.add_{x}_proj.{end}" for x in "qkv"))
    for i in _blocks(keys, "single_transformer_blocks."):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        for bfl, diff in _SINGLE.items():
            add(b + bfl, d + diff)
        for bfl, diff in _SINGLE_NORMS.items():
            plan[f"{b}{bfl}.scale"] = Part((f"{d}{diff}.weight",))
        for end in ("weight", "bias"):
            plan[f"{b}linear1.{end}"] = Part(tuple(f"{d}attn.to_{x}.{end}" for x in "qkv") + (f"{d}proj_mlp.{end}",))
    return plan


def _swap(t: Tensor) -> Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def to_bfl(sd: Mapping[str, Tensor], extra=None) -> dict[str, Tensor]:
    """A diffusers-layout state dict -> BFL keys. ``extra``: a function (diffusers keys -> dict of
    BFL key -> Part) adding rows for a variant's own keys (Chroma's approximator)."""
    plan = key_plan(sd) | (extra(sd) if extra else {})
    out = {}
    for bfl, part in plan.items():
        if part.op == "swap":
            out[bfl] = _swap(sd[part.sources[0]])
        else:
            ts = [sd[s] for s in part.sources]
            out[bfl] = ts[0] if len(ts) == 1 else torch.cat(ts, 0)
    return out


def shapes_to_bfl(info: Mapping[str, object], extra=None) -> dict[str, tuple[int, ...]]:
    """A diffusers-layout header (key -> TensorInfo or shape) -> BFL key -> shape."""
    shape = lambda k: tuple(getattr(info[k], "shape", info[k]))  # noqa: E731
    plan = key_plan(info) | (extra(info) if extra else {})
    out = {}
    for bfl, part in plan.items():
        shapes = [shape(s) for s in part.sources]
        out[bfl] = (sum(s[0] for s in shapes),) + shapes[0][1:]
    return out


def to_diffusers(sd: Mapping[str, Tensor], diffusers_keys, extra=None) -> dict[str, Tensor]:
    """The inverse of ``to_bfl``: BFL tensors split into the diffusers keys given (a diffusers
    model's ``state_dict()`` keys), e.g. to load our weights into diffusers' model."""
    plan = key_plan(diffusers_keys) | (extra(diffusers_keys) if extra else {})
    out = {}
    for bfl, part in plan.items():
        t = sd[bfl]
        if part.op == "swap":
            out[part.sources[0]] = _swap(t)
            continue
        if len(part.sources) == 1:
            out[part.sources[0]] = t
            continue
        # q, k, v are each a third of a fused qkv; in a single block's linear1 (q, k, v, MLP in)
        # each is the model width, its weight's input width
        width = t.shape[0] // 3 if len(part.sources) == 3 else sd[bfl.rsplit(".", 1)[0] + ".weight"].shape[1]
        sizes = [width] * 3 + ([t.shape[0] - 3 * width] if len(part.sources) == 4 else [])
        for name, piece in zip(part.sources, t.split(sizes, 0)):
            out[name] = piece
    return out



PART = "#"  # a stored tensor that is one piece of a fused BFL tensor: "<bfl key>#<piece index>"


def stored_rename(diffusers_keys, extra=None):
    """A per-key renaming of a diffusers-layout file for the weight store: one-to-one keys get
    their BFL name, each piece of a fused tensor "<BFL key>#<i>" and a swapped one "<BFL key>#swap",
    so the store's per-key dtype rule (``keep_f32``) sees BFL names; ``fuse`` then joins them."""
    names = {}
    for bfl, part in (key_plan(diffusers_keys) | (extra(diffusers_keys) if extra else {})).items():
        if part.op == "swap":
            names[part.sources[0]] = f"{bfl}{PART}swap"
        elif len(part.sources) == 1:
            names[part.sources[0]] = bfl
        else:
            for i, src in enumerate(part.sources):
                names[src] = f"{bfl}{PART}{i}"
    return names.get


def fuse(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Join the pieces ``stored_rename`` named: concatenated in piece order, swapped halves put back."""
    out: dict[str, Tensor] = {}
    pieces: dict[str, dict[int, Tensor]] = {}
    for key, t in sd.items():
        if PART not in key:
            out[key] = t
            continue
        bfl, piece = key.split(PART)
        if piece == "swap":
            out[bfl] = _swap(t)
        else:
            pieces.setdefault(bfl, {})[int(piece)] = t
    for bfl, parts in pieces.items():
        out[bfl] = torch.cat([parts[i] for i in sorted(parts)], 0)
    return out


def lora_targets(config) -> dict[str, LoraTarget]:
    """diffusers / PEFT / ai-toolkit LoRA module names of a Flux.1 / Chroma model of ``config``
    (a ``FluxConfig`` or ``ChromaConfig``) -> the BFL weight each adapts (ComfyUI
    ``utils.flux_to_diffusers`` + ``lora.model_lora_keys_unet``): q, k, v onto their third of a
    double block's fused ``qkv``, and in a single block q, k, v and ``proj_mlp`` onto their rows of
    ``linear1`` (hidden, hidden, hidden, MLP width); ``norm_out.linear`` with its halves swapped.
    Also XLabs' / USO's ``single_blocks.N.linear1_qkv`` (the q, k, v rows of ``linear1``). Names
    of layers a variant lacks (Chroma's modulations) are left for the mapper to drop."""
    h, mlp = config.hidden_size, config.mlp_hidden
    out: dict[str, LoraTarget] = {}

    def whole(diff: str, bfl: str) -> None:
        out[diff] = LoraTarget(f"{bfl}.weight")

    for bfl, diff in _TOP.items():
        whole(diff, bfl)
    out["norm_out.linear"] = LoraTarget("final_layer.adaLN_modulation.1.weight", swap_halves=True)
    for i in range(config.depth):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for bfl, diff in _DOUBLE.items():
            whole(d + diff, b + bfl)
        for j, x in enumerate("qkv"):
            out[f"{d}attn.to_{x}"] = LoraTarget(f"{b}img_attn.qkv.weight", (j * h, h))
            out[f"{d}attn.add_{x}_proj"] = LoraTarget(f"{b}txt_attn.qkv.weight", (j * h, h))
    for i in range(config.depth_single_blocks):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        for bfl, diff in _SINGLE.items():
            whole(d + diff, b + bfl)
        for j, x in enumerate("qkv"):
            out[f"{d}attn.to_{x}"] = LoraTarget(f"{b}linear1.weight", (j * h, h))
        out[f"{d}proj_mlp"] = LoraTarget(f"{b}linear1.weight", (3 * h, mlp))
        out[f"{b}linear1_qkv"] = LoraTarget(f"{b}linear1.weight", (0, 3 * h))
    for i in range(getattr(config, "approximator_layers", 0)):  # Chroma's approximator
        for diff, bfl in (("linear_1", "in_layer"), ("linear_2", "out_layer")):
            whole(f"distilled_guidance_layer.layers.{i}.{diff}", f"distilled_guidance_layer.layers.{i}.{bfl}")
    return out
