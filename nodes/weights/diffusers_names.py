"""diffusers ↔ LDM weight names: the UNet block correspondence and the VAE renaming.

Our models use LDM ("openaimodel" / ``first_stage_model``) attribute names; diffusers files name
the same weights after ``UNet2DConditionModel`` / ``AutoencoderKL``. Both directions are a pure
renaming derived from the block layout, so they are written once here and used by the loader
(diffusers UNet/VAE files and folders), the LoRA key matcher (diffusers-named LoRA modules) and the
ControlNet converter (diffusers ControlNet files). Written by hand because no installed library
exposes the mapping as data: diffusers' own converter (``convert_ldm_unet_checkpoint``) goes one
way on whole state dicts and needs a config; the tests check this table against it.

UNet layout (``num_res``: ResBlocks per level, shallowest first): LDM ``input_blocks.0`` is
``conv_in``; then per level its ResBlocks (resnet at ``.0``, transformer at ``.1``) and, except on
the deepest level, a downsampler (``.0.op``). Output blocks run deepest level first with
num_res + 1 blocks per level; a level's last block holds the upsampler at ``.1.conv``, or
``.2.conv`` after a transformer. diffusers' ``up_blocks.i`` is LDM output level i (deepest first).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = [
    "unet_block_pairs",
    "ldm_unet_layout",
    "diffusers_unet_layout",
    "unet_diffusers_module_map",
    "diffusers_to_ldm_table",
    "translate_diffusers_key",
    "diffusers_unet_rename",
    "diffusers_vae_rename",
]

RESNET_SUBS = {  # diffusers ResnetBlock2D child -> LDM ResBlock child
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "time_emb_proj": "emb_layers.1",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "conv_shortcut": "skip_connection",
}
RESNET_SUBS_INV = {v: k for k, v in RESNET_SUBS.items()}

Table = Mapping[str, tuple[str, bool]]  # prefix -> (other naming's prefix, is a ResBlock)


# --------------------------------------------------------------------------------------------
# UNet


def unet_block_pairs(num_res: Sequence[int], mid_attn: bool = True,
                     up_attn: Sequence[bool] | None = None) -> list[tuple[str, str, bool]]:
    """(LDM prefix, diffusers prefix, is_resnet) for every block of a UNet with this layout.

    ``up_attn``: per diffusers up block (deepest level first), whether it has transformers; it
    fixes where the upsampler sits (``.2.conv`` after a transformer, else ``.1.conv``). None lists
    both places, which is right for LDM -> diffusers (only the one present is ever looked up) but
    ambiguous the other way (``diffusers_to_ldm_table`` then leaves upsamplers out).
    """
    pairs: list[tuple[str, str, bool]] = [
        ("time_embed.0", "time_embedding.linear_1", False),
        ("time_embed.2", "time_embedding.linear_2", False),
        ("label_emb.0.0", "add_embedding.linear_1", False),
        ("label_emb.0.2", "add_embedding.linear_2", False),
        ("input_blocks.0.0", "conv_in", False),
        ("out.0", "conv_norm_out", False),
        ("out.2", "conv_out", False),
        ("middle_block.0", "mid_block.resnets.0", True),
    ]
    if mid_attn:
        pairs += [("middle_block.1", "mid_block.attentions.0", False), ("middle_block.2", "mid_block.resnets.1", True)]
    else:
        pairs += [("middle_block.1", "mid_block.resnets.1", True)]
    levels = len(num_res)
    n = 1
    for i, nr in enumerate(num_res):
        for j in range(nr):
            pairs.append((f"input_blocks.{n}.0", f"down_blocks.{i}.resnets.{j}", True))
            pairs.append((f"input_blocks.{n}.1", f"down_blocks.{i}.attentions.{j}", False))
            n += 1
        if i < levels - 1:
            pairs.append((f"input_blocks.{n}.0.op", f"down_blocks.{i}.downsamplers.0.conv", False))
            n += 1
    n = 0
    for i, nr in enumerate(reversed(num_res)):
        for j in range(nr + 1):
            pairs.append((f"output_blocks.{n}.0", f"up_blocks.{i}.resnets.{j}", True))
            pairs.append((f"output_blocks.{n}.1", f"up_blocks.{i}.attentions.{j}", False))
            if j == nr and i < levels - 1:
                # longer prefixes win in lookup, so ".1.conv" beats the ".1" attention entry
                if up_attn is None:
                    slots: tuple[int, ...] = (1, 2)
                else:
                    slots = (2 if i < len(up_attn) and up_attn[i] else 1,)
                for slot in slots:
                    pairs.append((f"output_blocks.{n}.{slot}.conv", f"up_blocks.{i}.upsamplers.0.conv", False))
            n += 1
    return pairs


def ldm_unet_layout(ldm_names: Iterable[str]) -> tuple[tuple[int, ...], bool]:
    """(ResBlocks per level, middle attention) from LDM UNet module/key names."""
    inputs, downs, mid = set(), set(), set()
    for k in ldm_names:
        parts = k.split(".")
        if parts[0] == "input_blocks" and len(parts) > 1:
            inputs.add(int(parts[1]))
            if len(parts) > 3 and parts[2] == "0" and parts[3] == "op":
                downs.add(int(parts[1]))
        elif parts[0] == "middle_block" and len(parts) > 2:
            mid.add((int(parts[1]), parts[2]))
    num_res, count = [], 0
    for i in range(1, max(inputs, default=0) + 1):
        if i in downs:
            num_res.append(count)
            count = 0
        else:
            count += 1
    if inputs:
        num_res.append(count)
    mid_attn = any(p in ("proj_in", "transformer_blocks", "norm") for i, p in mid if i == 1)
    return tuple(num_res), mid_attn


def _count(keys: Iterable[str], pattern: str) -> int:
    """1 + the largest N in keys matching ``pattern`` with one ``(\\d+)`` group (0 if none)."""
    rx = re.compile(pattern)
    found = [int(m.group(1)) for k in keys if (m := rx.match(k))]
    return max(found) + 1 if found else 0


def diffusers_unet_layout(keys: Iterable[str]) -> tuple[tuple[int, ...], bool, tuple[bool, ...]]:
    """(ResBlocks per level, middle attention, transformers per up block) from diffusers UNet (or
    ControlNet) key names."""
    keys = list(keys)
    num_res = tuple(_count(keys, rf"down_blocks\.{i}\.resnets\.(\d+)\.")
                    for i in range(_count(keys, r"down_blocks\.(\d+)\.")))
    mid_attn = any(k.startswith("mid_block.attentions.0.") for k in keys)
    up_attn = tuple(any(k.startswith(f"up_blocks.{i}.attentions.") for k in keys)
                    for i in range(_count(keys, r"up_blocks\.(\d+)\.")))
    return num_res, mid_attn, up_attn


def _translate(name: str, table: Table, subs: Mapping[str, str] | None) -> str | None:
    """Map ``name`` through the longest matching dotted prefix of ``table``; None if none."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        hit = table.get(".".join(parts[:cut]))
        if hit is None:
            continue
        new_prefix, is_resnet = hit
        rest = parts[cut:]
        if is_resnet and subs is not None and rest:
            for n in (2, 1):
                mapped = subs.get(".".join(rest[:n]))
                if mapped is not None:
                    rest = mapped.split(".") + rest[n:]
                    break
        return ".".join([new_prefix, *rest])
    return None


def unet_diffusers_module_map(ldm_modules: Iterable[str]) -> dict[str, str]:
    """LDM UNet module (or key) name -> diffusers name, for every given LDM name with one."""
    names = list(ldm_modules)
    num_res, mid_attn = ldm_unet_layout(names)
    table = {ldm: (diff, res) for ldm, diff, res in unet_block_pairs(num_res, mid_attn)}
    out = {}
    for n in names:
        d = _translate(n, table, RESNET_SUBS_INV)
        if d is not None:
            out[n] = d
    return out


def diffusers_to_ldm_table(num_res: Sequence[int], mid_attn: bool = True,
                           up_attn: Sequence[bool] | None = None) -> dict[str, tuple[str, bool]]:
    """diffusers prefix -> (LDM prefix, is_resnet); use with ``translate_diffusers_key``.

    ``num_res``: ResBlocks per level (diffusers' layers_per_block per down block). Upsamplers are
    included only when ``up_attn`` says where they sit (an encoder-only ControlNet has none)."""
    table = {}
    for ldm, diff, res in unet_block_pairs(num_res, mid_attn, up_attn):
        if up_attn is None and diff.startswith("up_blocks.") and diff.endswith("upsamplers.0.conv"):
            continue  # ambiguous (.1 or .2) without up_attn
        table[diff] = (ldm, res)
    return table


def translate_diffusers_key(key: str, table: Table) -> str | None:
    """A diffusers UNet key -> the LDM key, using a ``diffusers_to_ldm_table``; None if no block
    of the table owns it."""
    return _translate(key, table, RESNET_SUBS)


def diffusers_unet_rename(keys: Iterable[str]) -> Callable[[str], str | None]:
    """A key map diffusers ``UNet2DConditionModel`` → LDM ``openaimodel`` names, for this key set
    (its layout is read from the keys). Keys of no block (e.g. a stray buffer) map to None."""
    table = diffusers_to_ldm_table(*diffusers_unet_layout(keys))
    return lambda key: translate_diffusers_key(key, table)


# --------------------------------------------------------------------------------------------
# VAE

_VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out",
             "query": "q", "key": "k", "value": "v", "proj_attn": "proj_out"}


def diffusers_vae_rename(keys: Iterable[str]) -> Callable[[str], str | None]:
    """A key map diffusers ``AutoencoderKL`` → LDM ``first_stage_model`` names (prefix-free).

    diffusers' attention projections are [C, C] Linear weights where LDM has [C, C, 1, 1] 1×1
    convs; that is a reshape, which the weight store does on assignment, not a rename."""
    levels = _count(list(keys), r"decoder\.up_blocks\.(\d+)\.")

    def rename(key: str) -> str | None:
        parts = key.split(".")
        if parts[0] in ("quant_conv", "post_quant_conv"):
            return key
        side, rest = parts[0], parts[1:]
        if side not in ("encoder", "decoder") or not rest:
            return None
        head = rest[0]
        if head in ("conv_in", "conv_out"):
            return key
        if head == "conv_norm_out":
            return ".".join([side, "norm_out"] + rest[1:])
        if head == "mid_block":
            kind, idx, tail = rest[1], int(rest[2]), rest[3:]
            if kind == "resnets":
                return ".".join([side, "mid", f"block_{idx + 1}"] + _vae_resnet(tail))
            sub = _VAE_ATTN.get(tail[0])
            if sub is None:
                return None
            if tail[0] == "to_out":  # to_out.0.weight
                tail = tail[1:]
            return ".".join([side, "mid", "attn_1", sub] + tail[1:])
        if head in ("down_blocks", "up_blocks"):
            i = int(rest[1])
            level = i if head == "down_blocks" else levels - 1 - i
            what, tail = rest[2], rest[3:]
            base = [side, "down" if head == "down_blocks" else "up", str(level)]
            if what == "resnets":
                return ".".join(base + ["block", tail[0]] + _vae_resnet(tail[1:]))
            if what in ("downsamplers", "upsamplers"):  # downsamplers.0.conv.weight
                return ".".join(base + ["downsample" if what == "downsamplers" else "upsample"] + tail[1:])
        return None

    return rename


def _vae_resnet(tail: list[str]) -> list[str]:
    return (["nin_shortcut"] + tail[1:]) if tail and tail[0] == "conv_shortcut" else tail
