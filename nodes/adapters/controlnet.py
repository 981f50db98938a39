"""ControlNet (Zhang et al. 2023, "Adding Conditional Control to Text-to-Image Diffusion Models",
arXiv:2302.05543) in LDM layout, and the chain object that feeds its residuals to the UNet.

The network is a trainable copy of the UNet encoder (input blocks + middle block, built from the
UNet's own blocks) plus ``input_hint_block``, a small conv stack taking the hint image (pixel
space) down to the latent grid, added after the first conv; every input-block output and the
middle-block output pass through a zero-initialised 1x1 conv (``zero_convs.N.0``,
``middle_block_out.0``) and become residuals for the UNet's skip connections and middle block.

Attribute names equal the checkpoint keys under ``control_model.``; diffusers-layout files
(``controlnet_cond_embedding.*``, ``controlnet_down_blocks.N``, ``controlnet_mid_block``) are
renamed to them by ``convert_controlnet_state_dict`` with the shared diffusers↔LDM UNet table of
``nodes.weights.diffusers_names``. SD1.x/SD2.x and SDXL (ADM ``label_emb``) nets differ only in config
values.

T2I-Adapters (also CONTROL_NET) live in ``t2i_adapter.py``; ``apply_controlnet`` chains either
kind. ControlNet++ "union" nets (xinsir controlnet-union-sdxl-1.0 / ProMax) add the parts of
``controlnet_union.py``: a control type (``ControlNetChain.control_type``, set by
SetUnionControlNetType) shifts the time embedding and, when given, the hint features. Stability's
ControlLoRA files are built on the sampled model's UNet by ``control_lora.py``. Not supported yet:
"shuffle" global pooling.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.adapters.controlnet_union import (UNION_KEY_PREFIXES, ControlAddEmbedding, UnionBlock,
                                                      UnionConfig, check_control_type, is_union_state_dict,
                                                      union_config_from_shapes)
from mixgraph.nodes.weights.diffusers_names import (diffusers_to_ldm_table, diffusers_unet_layout,
                                                    translate_diffusers_key)
from mixgraph.nodes.models.resize import upscale
from mixgraph.nodes.families.sd.unet import (UNetConfig, build_input_blocks, build_middle_block,
                                             encoder_config_from_shapes, timestep_embedding)
from mixgraph.nodes.payloads.conditioning import Control

__all__ = [
    "ControlNetConfig",
    "ControlNetModel",
    "ControlNetChain",
    "controlnet_config_from_state_dict",
    "convert_controlnet_state_dict",
    "resize_hint",
    "dit_controlnet_kind",
]


@dataclass(frozen=True)
class ControlNetConfig:
    """unet: the encoder half's config (only input/middle fields are used; output fields empty).
    hint_channels: channels of the hint image (3 for RGB). hint_block_channels: widths of the hint
    conv stack, one per resolution (LDM: 16, 32, 96, 256 for an 8x downscale). union: the
    ControlNet++ union parts' sizes (``controlnet_union.UnionConfig``), None for a plain net."""

    unet: UNetConfig
    hint_channels: int = 3
    hint_block_channels: tuple[int, ...] = (16, 32, 96, 256)
    union: UnionConfig | None = None


def _hint_block(hint_channels: int, widths: tuple[int, ...], out: int) -> nn.Sequential:
    """conv(hint, w0); per further width: conv(w, w), conv(w, w', stride 2); conv(w_last, out);
    SiLU between convs. Each stride-2 conv halves the size, so the output is on the latent grid."""
    layers: list[nn.Module] = [nn.Conv2d(hint_channels, widths[0], 3, padding=1), nn.SiLU()]
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Conv2d(a, a, 3, padding=1), nn.SiLU(), nn.Conv2d(a, b, 3, padding=1, stride=2), nn.SiLU()]
    layers.append(nn.Conv2d(widths[-1], out, 3, padding=1))
    return nn.Sequential(*layers)


class ControlNetModel(nn.Module):
    keep_f32: tuple[str, ...] = ("time_embed", "label_emb", "control_add_embedding")
    keep_f32_inputs: tuple[str, ...] = ("timesteps", "y")

    def __init__(self, config: ControlNetConfig):
        super().__init__()
        c = config.unet
        self.config = config
        mc, ted = c.model_channels, c.time_embed_dim

        def zero_conv(ch: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(ch, ch, 1))  # key: zero_convs.N.0

        self.time_embed = nn.Sequential(nn.Linear(mc, ted), nn.SiLU(), nn.Linear(ted, ted))
        if c.adm_in_channels is not None:
            self.label_emb = nn.Sequential(
                nn.Sequential(nn.Linear(c.adm_in_channels, ted), nn.SiLU(), nn.Linear(ted, ted))
            )
        self.input_hint_block = _hint_block(config.hint_channels, config.hint_block_channels, mc)
        # the UNet's encoder half, built by the UNet's own builders (same blocks, same keys)
        self.input_blocks, channels = build_input_blocks(c)
        self.zero_convs = nn.ModuleList(zero_conv(ch) for ch in channels)
        self.middle_block = build_middle_block(c, channels[-1])
        self.middle_block_out = zero_conv(channels[-1])
        if (u := config.union) is not None:  # ControlNet++ union parts (controlnet_union.py)
            if u.width != mc:
                raise ValueError(f"union ControlNet: task_embedding is {u.width} wide, the hint features {mc}")
            self.task_embedding = nn.Parameter(torch.empty(u.num_types, u.width))
            self.transformer_layes = nn.Sequential(*[UnionBlock(u.width, u.heads) for _ in range(u.layers)])
            self.spatial_ch_projs = nn.Linear(u.width, u.width)
            self.control_add_embedding = ControlAddEmbedding(u.num_types, u.type_embed_dim, ted)

    def union_hint(self, hint: Tensor, control_type: tuple[int, ...] | list[int]) -> Tensor:
        """A union net's hint features for one control type: the pooled features plus the type's
        task embedding form one token; the transformed token, projected, is a per-channel offset
        added to the features (ComfyUI ``union_controlnet_merge`` for one hint)."""
        feats = self.input_hint_block(hint)  # [B, W, h, w]
        token = feats.mean(dim=(2, 3)) + self.task_embedding[control_type[0]].to(feats.dtype)  # [B, W]
        token = self.transformer_layes(token[:, None])  # [B, 1, W]
        return feats + self.spatial_ch_projs(token[:, 0])[:, :, None, None]

    def forward(self, x: Tensor, hint: Tensor, timesteps: Tensor, context: Tensor | None,
                y: Tensor | None = None, control_type: tuple[int, ...] | list[int] = ()) -> list[Tensor]:
        """x: [B, in_channels, h, w] (the UNet's input, c_in-scaled); hint: [B, hint_channels, 8h, 8w];
        timesteps: [B]; context: [B, T, D]; y: [B, adm] for SDXL nets; control_type: a union net's
        type index, () = "auto" (a plain net ignores it, as ComfyUI's extra argument).

        Returns len(input_blocks) + 1 residuals: one per input block, then the middle one (a list,
        so the precision layer's exit cast reaches every tensor)."""
        if (y is None) != (self.config.unet.adm_in_channels is None):
            raise ValueError(
                f"ControlNet: adm_in_channels={self.config.unet.adm_in_channels} but y is "
                f"{'missing' if y is None else 'given'}"
            )
        emb = self.time_embed(timestep_embedding(timesteps, self.config.unet.model_channels))
        guided_hint: Tensor | None = None
        if self.config.union is not None:
            control_type = tuple(int(t) for t in control_type)
            check_control_type(control_type, self.config.union.num_types)
            emb = emb + self.control_add_embedding(control_type, emb.device).to(emb.dtype)
            if control_type:
                guided_hint = self.union_hint(hint, control_type)
        if y is not None:
            emb = emb + self.label_emb(y)
        if guided_hint is None:
            guided_hint = self.input_hint_block(hint)  # [B, mc, h, w]
        outs: list[Tensor] = []
        h = x
        for block, zero in zip(self.input_blocks, self.zero_convs):
            h = block(h, emb, context)
            if guided_hint is not None:  # after the first conv only
                h = h + guided_hint
                guided_hint = None
            outs.append(zero(h))
        h = self.middle_block(h, emb, context)
        outs.append(self.middle_block_out(h))
        return outs


# --------------------------------------------------------------------------------------------
# loading


def convert_controlnet_state_dict(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Any supported ControlNet file -> our (LDM, unprefixed) keys.

    LDM files (``control_model.zero_convs.0.0.weight``, or the same without the prefix) are
    stripped; diffusers files (``controlnet_cond_embedding.conv_in.weight``) are renamed, a union
    net's own keys (``controlnet_union.UNION_KEY_PREFIXES``) kept as they are.
    """
    if "lora_controlnet" in sd:  # ControlLoRA: built per base model (control_lora.py)
        raise ValueError("ControlLoRA file: its net is built from the sampled model's UNet "
                         "(control_lora.ControlLoraHandle), not converted on its own")
    if any(k.startswith("control_model.") for k in sd):
        if "control_model.difference" in sd or "difference" in sd:
            raise NotImplementedError("diff ControlNet (needs the base model): not supported yet")
        return {k[len("control_model."):]: v for k, v in sd.items() if k.startswith("control_model.")}
    if "zero_convs.0.0.weight" in sd:
        return dict(sd)
    if (kind := dit_controlnet_kind(sd)) is not None:
        raise NotImplementedError(f"{kind} ControlNet: not supported yet")
    if "controlnet_cond_embedding.conv_in.weight" in sd:
        if any(k.startswith("controlnet_mode_embedding") for k in sd):
            raise NotImplementedError("ControlNet with controlnet_mode_embedding (InstantX union, an SD3/Flux "
                                      "ControlNet): not supported yet")
        # ControlNet++ union nets (comfy/controlnet.py's diffusers branch): the union keys keep
        # their names, the rest is a diffusers ControlNet
        union = {k: v for k, v in sd.items() if k.startswith(UNION_KEY_PREFIXES)}
        if union and not is_union_state_dict(union):
            raise ValueError(f"union ControlNet: control_add_embedding / task_embedding missing "
                             f"(has {sorted(union)[:4]})")
        return _from_diffusers({k: v for k, v in sd.items() if k not in union}) | union
    raise NotImplementedError(
        f"ControlNet format not recognised (T2I-Adapter or another family): not supported yet; "
        f"keys such as {sorted(sd)[:4]}"
    )


def dit_controlnet_kind(keys) -> str | None:
    """The name of a DiT ControlNet format ComfyUI loads (``load_controlnet_state_dict``), or None,
    for refusals here: the loader takes SD3 / SD3.5 and Flux InstantX / XLabs / MistoLine nets first
    (``sd35_controlnet.py``, ``sd3_mmdit_controlnet.py``, ``flux_controlnet.py``)."""
    if "controlnet_blocks.0.weight" in keys:
        if "double_blocks.0.img_attn.norm.key_norm.scale" in keys:
            return "Flux XLabs"
        if "pos_embed_input.proj.weight" in keys:
            if "transformer_blocks.0.adaLN_modulation.1.bias" in keys:
                return "Stability SD3.5"
            return "SD3 diffusers-format (InstantX / AliMama SD3)"
        if "transformer_blocks.0.img_mlp.net.0.proj.weight" in keys:
            return "Qwen-Image InstantX"
        if "controlnet_x_embedder.weight" in keys:
            return "Flux InstantX / Shakker union"
    if "controlnet_blocks.0.linear.weight" in keys:
        return "Flux MistoLine"
    return None


def _from_diffusers(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    num_res, mid_attn, _ = diffusers_unet_layout(sd)
    table = diffusers_to_ldm_table(num_res, mid_attn)
    n_emb = len({int(m.group(1)) for k in sd if (m := re.match(r"controlnet_cond_embedding\.blocks\.(\d+)\.", k))})
    table["controlnet_cond_embedding.conv_in"] = ("input_hint_block.0", False)
    for i in range(n_emb):
        table[f"controlnet_cond_embedding.blocks.{i}"] = (f"input_hint_block.{2 * (i + 1)}", False)
    table["controlnet_cond_embedding.conv_out"] = (f"input_hint_block.{2 * (n_emb + 1)}", False)
    for k in sd:
        if m := re.match(r"controlnet_down_blocks\.(\d+)\.", k):
            table[f"controlnet_down_blocks.{m.group(1)}"] = (f"zero_convs.{m.group(1)}.0", False)
    table["controlnet_mid_block"] = ("middle_block_out.0", False)
    out: dict[str, Tensor] = {}
    unknown = []
    for k, v in sd.items():
        new = translate_diffusers_key(k, table)
        if new is None:
            unknown.append(k)
        else:
            out[new] = v
    if unknown:
        raise ValueError(f"diffusers ControlNet: {len(unknown)} keys have no LDM name, e.g. {unknown[:4]}")
    return out


def controlnet_config_from_state_dict(sd: Mapping[str, Tensor]) -> ControlNetConfig:
    """Derive the config from tensor shapes of an LDM-named (converted) ControlNet state dict."""
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    if "input_blocks.0.0.weight" not in shapes or "zero_convs.0.0.weight" not in shapes:
        raise ValueError(f"not an LDM ControlNet state dict (keys such as {sorted(shapes)[:4]})")
    hint_idx = sorted(int(m.group(1)) for k in shapes if (m := re.fullmatch(r"input_hint_block\.(\d+)\.weight", k)))
    hint_shapes = [shapes[f"input_hint_block.{j}.weight"] for j in hint_idx]
    # widths: the first conv's output, then each stride-2 conv's (every second conv after the first)
    widths = (hint_shapes[0][0],) + tuple(s[0] for s in hint_shapes[2:-1:2])
    return ControlNetConfig(unet=encoder_config_from_shapes(shapes), hint_channels=hint_shapes[0][1],
                            hint_block_channels=widths, union=union_config_from_shapes(shapes))


# --------------------------------------------------------------------------------------------
# the chain: what Cond.control holds


def resize_hint(image: Tensor, height: int, width: int) -> Tensor:
    """IMAGE [B, H, W, C] -> [B, C, height, width] as ComfyUI's ``common_upscale(...,
    "nearest-exact", "center")``: crop the centre to the target aspect ratio, then resize."""
    return upscale(image.movedim(-1, 1), width, height, "nearest-exact", "center")  # [B,C,H,W]


def _broadcast(hint: Tensor, batch: int) -> Tensor:
    """Repeat hint images cyclically up to ``batch`` (a single image is shared by all)."""
    if hint.shape[0] == batch:
        return hint
    if hint.shape[0] == 1:
        return hint.expand(batch, -1, -1, -1)
    idx = torch.arange(batch) % hint.shape[0]
    return hint[idx]


Runner = Callable[..., list[Tensor]]  # ControlNetModel (after apply_precision): same signature


@dataclass(frozen=True, eq=False)
class ControlNetChain:
    """One applied ControlNet and, through ``previous``, the ones applied before it.

    runner:   a ControlNetModel (usually wrapped by apply_precision; f32 in, f32 out).
    hint:     IMAGE [B, H, W, 3] float32 in 0..1.
    strength: multiplies every residual of this net.
    start_percent, end_percent: sampling progress range in which this net is active, inclusive
              (ComfyUI compares sigma against ``percent_to_sigma`` of both ends; the sampler gives
              ``percent = sigma_to_percent(sigma)``, which is the same test in percent terms).
    vae_scale: pixel size of one latent cell (8 for SD): the hint is resized to latent × 8.
    control_type: a union net's control type, () = "auto" (``ControlNetHandle.control_type``; a
              plain net ignores it).
    Identity-compared (holds tensors); a new chain is made by wrapping: ``ControlNetChain(...,
    previous=old)``.
    """

    runner: Runner
    hint: Tensor
    strength: float = 1.0
    start_percent: float = 0.0
    end_percent: float = 1.0
    previous: "ControlNetChain | None" = None
    vae_scale: int = 8
    control_type: tuple[int, ...] = ()

    def residuals(self, x_in: Tensor, timesteps: Tensor, context: Tensor, y: Tensor | None,
                  sigma: Tensor, percent: float) -> Control | None:
        """Sum of the residuals of every active net in the chain for this UNet batch, or None.

        The hint is resized to x_in's spatial size × vae_scale and broadcast to its batch. With
        several images and cond/uncond batched together the hint images repeat cyclically (ComfyUI
        repeats them per cond; the two agree whenever the hint batch divides the image batch)."""
        prev = None
        if self.previous is not None:
            prev = self.previous.residuals(x_in, timesteps, context, y, sigma, percent)
        if not (self.start_percent <= percent <= self.end_percent) or self.strength == 0.0:
            return prev
        h, w = x_in.shape[-2:]
        hint = resize_hint(self.hint.float(), h * self.vae_scale, w * self.vae_scale)
        hint = _broadcast(hint, x_in.shape[0])
        extra = {"control_type": self.control_type} if self.control_type else {}
        outs = self.runner(x_in, hint, timesteps, context, y, **extra)
        own = Control(input=[o * self.strength for o in outs[:-1]], middle=outs[-1] * self.strength)
        return own if prev is None else prev + own


def apply_controlnet(conds, control_net, policy, image: Tensor, strength: float,
                     start_percent: float, end_percent: float, apply_to_uncond: bool = False,
                     vae=None, vae_policy=None, extra_concat: tuple = ()):
    """ControlNetApply(Advanced): each cond gets a chain with this net on top of its previous one.

    Conds sharing a previous chain share the new link (one net evaluation per UNet batch).
    ``vae`` / ``vae_policy``: the apply node's VAE, used by nets that take the hint as a latent
    (DiT ControlNets, whose handles give their chain's arguments: ``chain_args``); other nets
    ignore it, as ComfyUI. ``extra_concat``: ControlNetInpaintingAliMamaApply's mask for nets with
    ``concat_mask``."""
    import dataclasses

    chain = getattr(control_net, "chain_type", None) or ControlNetChain  # T2I-Adapters bring their own
    runner = control_net.runner(policy)
    # SetUnionControlNetType's extra argument (ControlNetHandle.control_type)
    extra = {"control_type": ct} if (ct := tuple(getattr(control_net, "control_type", ()))) else {}
    if callable(getattr(control_net, "chain_args", None)):  # DiT nets: the hint through the VAE (dit_controlnet.py)
        extra = control_net.chain_args(vae, vae_policy, extra_concat)
    made: dict[int, ControlNetChain] = {}
    out = []
    for cond in conds:
        key = id(cond.control)
        if key not in made:
            made[key] = chain(runner, image, strength, start_percent, end_percent, previous=cond.control, **extra)
        out.append(dataclasses.replace(cond, control=made[key],
                                       control_apply_to_uncond=apply_to_uncond))
    return tuple(out)
