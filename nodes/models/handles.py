"""MODEL, CLIP and VAE handles: immutable, hashable recipes for a model (ARCHITECTURE.md).

A handle names where the weights are (``WeightSource``), the sizes (a config derived from
shapes), the patches (LoRA) and an optional pinned precision. It holds no weights: each use
materializes the module through the weight store (``store.materialize``) in the storage dtype
of the policy it runs under and wraps it with ``cast.apply_precision``. Deriving a handle
(``with_patches``, ``with_precision``, ``with_sampling``, ``with_layer``) is
``dataclasses.replace``.

Policy: the policy passed in is authoritative and applied as given. The handle's pins
(``precision``, and for a MODEL UNETLoader's ``weight_dtype``, a pinned storage dtype) are data
that the one resolver reads (``graph.precision.resolve``, reached through
``nodes.helpers.precision.effective``); a caller without the engine passes a finished policy itself.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.base import Sampling
from mixgraph.nodes.adapters import lora_bypass
from mixgraph.nodes.weights import store
from mixgraph.nodes.models.attention import check_backend
from mixgraph.nodes.weights.cast import PolicyLike, apply_precision
from mixgraph.nodes.models.compile import compiled as compile_module
from mixgraph.nodes.adapters.controlnet import ControlNetModel
from mixgraph.nodes.adapters.controlnet_union import check_control_type
from mixgraph.nodes.models.hooks import encode_with_hooks
from mixgraph.nodes.vae.latent_format import LatentFormat
from mixgraph.nodes.weights.layouts import reader_for_source
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file
from mixgraph.nodes.vae.taesd import load_taesd_autoencoder
from mixgraph.nodes.encoders.encoder_set import EncoderEntry, get_join
from mixgraph.nodes.encoders.text_encode import TextEncoder, check_set, encode_prompt, encode_tokens, tokenize
from mixgraph.nodes.families.sd.unet import UNetConfig
from mixgraph.nodes.vae import arch_registry as vae_archs
from mixgraph.nodes.vae.arch_base import VaeArch
from mixgraph.nodes.vae.vae import VAEConfig, decode_image, decode_tiled, encode_image, encode_tiled
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = [
    "LatentFormat", "ModelHandle", "ClipHandle", "VaeHandle", "TaesdVaeHandle", "ControlNetHandle",
]

# --------------------------------------------------------------------------------------------
# MODEL


@dataclass(frozen=True)
class ModelHandle:
    """MODEL: a diffusion model recipe of one model family (``nodes/families``).

    family: the registry name of its family ("sd": SD 1.x / 2.x / SDXL); kind: the family's
    variant name (SD: "sd1" | "sd2" | "sdxl" | "sdxl_refiner" | "sd2_x4", the x4 upscaler);
    config: the family's model config (SD: ``UNetConfig``); prediction: "eps" | "v_prediction" |
    "x0" | "lcm" | ...; zsnr: zero-terminal-SNR schedule; weight_dtype: storage pinned by
    UNETLoader (read by the resolver, not applied here); parts: what the family's variant carries
    beside the model (set by its detection).

    Patches, three kinds (docs/subsystems.md, "Model patches"): ``patches`` change weights and are
    merged at materialization (LoRA, attention multipliers); ``unet_patches`` act inside every
    UNet call (``unet_patches.py``: FreeU); ``sampler_patches`` act in the CFG denoiser
    (``sampling/cfg_patches.py``: RescaleCFG, CFGZeroStar, PAG). The last two are passed per call,
    never stored on the shared module.
    """

    source: WeightSource
    config: UNetConfig | Any
    kind: str
    prediction: str = "eps"
    zsnr: bool = False
    latent_format: LatentFormat = LatentFormat()
    patches: tuple = ()
    precision: PolicyLike | None = None
    weight_dtype: torch.dtype | None = None
    unet_patches: tuple = ()
    sampler_patches: tuple = ()
    # (kind "edm" | "v", sigma_min, sigma_max): a continuous-time schedule (ModelSamplingContinuous*)
    continuous_sampling: tuple | None = None
    # compute dtype pinned by ModelComputeDtype (read by the resolver, not applied here)
    compute_dtype: torch.dtype | None = None
    # (linear_start, linear_end) of the discrete schedule; None = SD's 0.00085..0.012
    beta_range: tuple[float, float] | None = None
    # ModelAttentionBackend: the attention implementation pinned by name (``attention.BACKENDS``);
    # None = mixgraph's default, which is the same kernel ("pytorch")
    attention_backend: str | None = None
    # TorchCompileModel: the torch.compile backend the UNet runs through (``compile.py``)
    compile_backend: str | None = None
    # the family's extra parts of this variant, a frozen dataclass the family defines (SD:
    # ``families.sd.parts.SDParts``: unCLIP, Stable Zero123, x4 upscaler, Lotus, SDPose), or None
    parts: Any = None
    # the model family (``nodes/families`` registry name) whose variant ``kind`` is
    family: str = "sd"
    # (shift, multiplier, shift_kind) of a flow schedule pinned by ModelSamplingSD3 /
    # ModelSamplingAuraFlow / ModelSamplingFlux (``families.base.Sampling``); None = the family's
    flow_shift: tuple | None = None

    def runner(self, policy: PolicyLike):
        """The sampler seam (``families.base.FamilyRunner``): the family's model, built through
        the weight store in the policy's storage dtype, precision applied, with its family's
        conditioning."""
        family = families.get(self.family)
        check_backend(self.attention_backend)  # the model's attention is BACKENDS' implementation
        merged, bypass = lora_bypass.split(self.patches)
        module = store.materialize("unet", self.source, self.config, policy.storage, merged, family.build)
        module = apply_precision(module, policy)
        if bypass:  # LoraLoaderBypass: forward hooks on this use's private module
            lora_bypass.install(module, bypass, "unet", "UNet")
        if self.compile_backend is not None:  # after the hooks, so the compiled graph includes them
            module = compile_module(module, self.compile_backend)
        return family.runner(self, module, policy)

    @property
    def sampling(self) -> Sampling:
        """The parameterisation and schedule (``families.base.Sampling``): the family's settings
        for the variant (a flow shift, ...) with this handle's prediction, zsnr and schedule."""
        sampling = dataclasses.replace(families.get(self.family).sampling(self.kind), prediction=self.prediction,
                                       zsnr=bool(self.zsnr), beta_range=self.beta_range,
                                       continuous=self.continuous_sampling)
        if self.flow_shift is not None:
            shift, multiplier, kind = self.flow_shift
            sampling = dataclasses.replace(sampling, shift=shift, multiplier=multiplier, shift_kind=kind)
        return sampling

    def with_compile(self, backend: str | None) -> "ModelHandle":
        """A handle whose UNet runs through ``torch.compile`` with ``backend`` (None: eager)."""
        return dataclasses.replace(self, compile_backend=backend)

    def with_patches(self, patches) -> "ModelHandle":
        """A handle with ``patches`` appended (applied in order at materialization)."""
        return dataclasses.replace(self, patches=self.patches + tuple(patches))

    def with_precision(self, policy: PolicyLike | None) -> "ModelHandle":
        """Pin the whole policy; it replaces an earlier compute-dtype pin (the later node wins)."""
        return dataclasses.replace(self, precision=policy, compute_dtype=None)

    def with_compute_dtype(self, dtype: torch.dtype | None) -> "ModelHandle":
        """Pin only the compute dtype (None: no pin); storage and flags stay as resolved."""
        return dataclasses.replace(self, compute_dtype=dtype)

    def with_unet_patch(self, patch) -> "ModelHandle":
        return dataclasses.replace(self, unet_patches=self.unet_patches + (patch,))

    def with_sampler_patch(self, patch) -> "ModelHandle":
        return dataclasses.replace(self, sampler_patches=self.sampler_patches + (patch,))

    def with_attention_backend(self, name: str | None) -> "ModelHandle":
        """Pin the attention implementation (``attention.BACKENDS``); an unknown name raises."""
        return dataclasses.replace(self, attention_backend=check_backend(name))

    def with_sampling(self, prediction: str, zsnr: bool = False, continuous: tuple | None = None) -> "ModelHandle":
        return dataclasses.replace(self, prediction=prediction, zsnr=bool(zsnr), continuous_sampling=continuous)

    def with_flow_sampling(self, shift: float, multiplier: float = 1000.0, kind: str = "linear") -> "ModelHandle":
        """A flow-matching (ComfyUI's CONST) model with this schedule, whatever it was before, as
        ComfyUI's ModelSamplingSD3 / AuraFlow / Flux object patch: ``kind`` "linear" (σ = shift·t /
        (1 + (shift − 1)·t), timestep σ·multiplier) or "exponential" (Flux, μ = shift)."""
        return dataclasses.replace(self, prediction="flow", zsnr=False, continuous_sampling=None,
                                   flow_shift=(float(shift), float(multiplier), kind))

    def with_latent_format(self, fmt: LatentFormat) -> "ModelHandle":
        """A handle whose sampler works in ``fmt`` (ComfyUI's ``latent_format`` object patch)."""
        return dataclasses.replace(self, latent_format=fmt)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our module's weight keys → shapes (header only), e.g. for mapping a LoRA."""
        return _module_shapes(self.source)

    def lora_names(self) -> dict:
        """The LoRA module names of the family's other layouts (``Family.lora_key_map``: LoRA
        module name -> ``families.base.LoraTarget``), {} for a family without any; what
        ``adapters.lora.load_lora`` takes as ``unet_names``."""
        key_map = getattr(families.get(self.family), "lora_key_map", None)
        return dict(key_map(self.config)) if key_map is not None else {}


# --------------------------------------------------------------------------------------------
# CLIP


@dataclass(frozen=True)
class ClipHandle:
    """CLIP: a set of named text encoders (``encoder_set.EncoderEntry``, in the order their
    features join), made for the text-encoder set ``kind`` ("sd1", "sd2", "sdxl", "sdxl_refiner";
    the DiT sets "flux", "sd3", "chroma", ..., whose outputs make a cond by the set's join,
    ``encoder_set.register_join``).

    layer_idx: CLIPSetLastLayer's stop_at_clip_layer (None = each encoder's default).
    patches: LoRA patches, each applied to the encoder named by its ``target``.
    hooks, hooks_to_conds, hooks_schedule: SetClipHooks (``models/hooks.py``): weight hooks
        applied while encoding, whether the conds carry them, whether keyframes schedule them.

    Precision: each encoder runs under the policy of its precision role (``entry.role``):
    ``policies[entry.role]`` when the caller gives one, else the one ``policy``.
    """

    kind: str
    encoders: tuple[EncoderEntry, ...] = ()
    layer_idx: int | None = None
    patches: tuple = ()
    precision: PolicyLike | None = None
    hooks: Any = None
    hooks_to_conds: bool = True
    hooks_schedule: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoders", tuple(self.encoders))
        bad = [e for e in self.encoders if not isinstance(e, EncoderEntry)]
        if bad:
            raise TypeError(f"ClipHandle.encoders holds EncoderEntry items, got {type(bad[0]).__name__}")
        check_set(self.names, [e.rule for e in self.encoders], get_join(self.kind))

    @property
    def names(self) -> tuple[str, ...]:
        """The encoder names, in set order (("clip_l", "clip_g") for SDXL)."""
        return tuple(e.name for e in self.encoders)

    def encoder(self, name: str) -> EncoderEntry:
        """The entry named ``name``; ValueError naming the encoders there are when none is."""
        for e in self.encoders:
            if e.name == name:
                return e
        raise ValueError(f"this {self.kind} CLIP has no text encoder {name!r}; it has {', '.join(self.names)}")

    def encode(
        self, text: str, policy: PolicyLike, embedding_lookup=None, warn: Callable[[str], None] | None = None,
        texts: dict[str, str] | None = None, policies: Mapping[str, PolicyLike] | None = None,
    ) -> tuple[Cond, ...]:
        """CONDITIONING for `text`; `texts` gives some encoders their own prompt (SDXL's
        text_l / text_g, see ``text_encode.encode_prompt``); `policies`: precision role ->
        policy, for encoders whose role should not run under `policy`."""
        if self.hooks is not None:
            return encode_with_hooks(self, text, policy, embedding_lookup=embedding_lookup, warn=warn,
                                     texts=texts, policies=policies)
        return encode_prompt(
            self._text_encoders(policy, policies), text, layer_idx=self.layer_idx,
            embedding_lookup=embedding_lookup, warn=warn, texts=texts, join=get_join(self.kind),
        )

    @staticmethod
    def policy_for(entry: EncoderEntry, policy: PolicyLike,
                   policies: Mapping[str, PolicyLike] | None = None) -> PolicyLike:
        """The policy ``entry`` runs under: its role's in ``policies``, else ``policy``."""
        return (policies or {}).get(entry.role, policy)

    def _text_encoders(self, policy: PolicyLike, policies: Mapping[str, PolicyLike] | None) -> tuple[TextEncoder, ...]:
        loaded = []
        for e in self.encoders:
            run = self.policy_for(e, policy, policies)
            patches, bypass = lora_bypass.split(
                tuple(p for p in self.patches if getattr(p, "target", e.name) == e.name))
            module = store.materialize(e.name, e.source, e.config, run.storage, patches, e.build)
            module = lora_bypass.install(apply_precision(module, run), bypass, e.name, e.name)
            loaded.append(TextEncoder(e.name, e.rule, module, e.tokenizer))
        return tuple(loaded)

    def tokenize(self, text: str, embedding_lookup=None, warn: Callable[[str], None] | None = None) -> dict:
        """ComfyUI's ``clip.tokenize(text, return_word_ids=True)``: encoder name -> chunks of
        (token, weight, word id)."""
        return tokenize(self.encoders, text, embedding_lookup=embedding_lookup, warn=warn, word_ids=True)

    def encode_tokens(self, tokenized: dict, policy: PolicyLike, warn: Callable[[str], None] | None = None,
                      policies: Mapping[str, PolicyLike] | None = None) -> tuple[Cond, ...]:
        """ComfyUI's ``clip.encode_from_tokens``: CONDITIONING for chunks from ``tokenize``."""
        if self.hooks is not None:
            raise NotImplementedError("encoding tokens with a CLIP that has hooks (SetClipHooks): not supported yet")
        return encode_tokens(self._text_encoders(policy, policies), tokenized, layer_idx=self.layer_idx, warn=warn,
                             join=get_join(self.kind))

    def with_layer(self, n: int | None) -> "ClipHandle":
        return dataclasses.replace(self, layer_idx=n)

    def with_patches(self, patches) -> "ClipHandle":
        return dataclasses.replace(self, patches=self.patches + tuple(patches))

    def with_precision(self, policy: PolicyLike | None) -> "ClipHandle":
        return dataclasses.replace(self, precision=policy)

    def with_hooks(self, hooks, to_conds: bool = True, schedule: bool = False) -> "ClipHandle":
        """SetClipHooks: encode with ``hooks`` (a ``payloads.hooks.HookGroup``)."""
        return dataclasses.replace(self, hooks=hooks, hooks_to_conds=bool(to_conds), hooks_schedule=bool(schedule))

    def weight_shapes(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """encoder name → {HF-layout key → shape}, e.g. for mapping a LoRA."""
        out = {}
        for e in self.encoders:
            with torch.device("meta"):
                m = e.build(e.config)
            out[e.name] = {k: tuple(v.shape) for k, v in m.state_dict().items()}
        return out


# --------------------------------------------------------------------------------------------
# VAE


@dataclass(frozen=True)
class VaeHandle:
    """VAE: an autoencoder of the architecture ``arch`` (``nodes/vae/arch_registry.py``: "kl", the
    LDM KL autoencoder; "wan", the Wan 2.1 / 2.2 video VAEs), whose object builds the module and
    maps IMAGE <-> latent with it. Latents in and out are unscaled (the scale factor is applied by
    the sampler); IMAGE tensors are [B,H,W,3] float32 in 0..1 (a video's frames along B)."""

    source: WeightSource
    config: VAEConfig | Any
    latent_format: LatentFormat = LatentFormat()
    precision: PolicyLike | None = None
    arch: str = "kl"

    @property
    def architecture(self) -> VaeArch:
        return vae_archs.get(self.arch)

    @property
    def latent_scale(self) -> float:
        return self.latent_format.scale_factor

    @property
    def latent_channels(self) -> int:
        return self.config.latent_channels

    @property
    def downscale(self) -> int:
        return self.config.downscale

    def build(self, config: Any) -> torch.nn.Module:
        """The architecture's module for ``config`` (what the weight store materializes)."""
        return self.architecture.build(config)

    def module(self, policy: PolicyLike) -> torch.nn.Module:
        module = store.materialize("vae", self.source, self.config, policy.storage, (), self.architecture.build)
        return apply_precision(module, policy)

    def decode(self, samples: Tensor, policy: PolicyLike) -> Tensor:
        """Latent [B,C,h,w] (a video VAE: [B,C,T,h,w]) → IMAGE; out-of-memory falls back to tiled
        decoding."""
        m = self.module(policy)
        with torch.inference_mode():
            return self.architecture.decode(m, samples, self.config)

    def decode_tiled(self, samples: Tensor, policy: PolicyLike, tile_size: int = 512, overlap: int = 64,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        """VAEDecodeTiled: tile_size and overlap in **pixels**, temporal_size and temporal_overlap in
        pixel frames (video VAEs only)."""
        m = self.module(policy)
        with torch.inference_mode():
            return self.architecture.decode_tiled(m, samples, self.config, tile_size, overlap, temporal_size,
                                                  temporal_overlap)

    def encode(self, pixels: Tensor, policy: PolicyLike) -> Tensor:
        """IMAGE [B,H,W,C] → latent posterior mean (H, W center-cropped to the downscale)."""
        m = self.module(policy)
        with torch.inference_mode():
            return self.architecture.encode(m, pixels, self.config)

    def encode_tiled(self, pixels: Tensor, policy: PolicyLike, tile_size: int = 512, overlap: int = 64,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        """VAEEncodeTiled: tile_size and overlap in pixels."""
        m = self.module(policy)
        with torch.inference_mode():
            return self.architecture.encode_tiled(m, pixels, self.config, tile_size, overlap, temporal_size,
                                                  temporal_overlap)

    def with_precision(self, policy: PolicyLike | None) -> "VaeHandle":
        return dataclasses.replace(self, precision=policy)


@functools.lru_cache(maxsize=4)
def _taesd_module(encoder: str, decoder: str, name: str, stamp: tuple) -> torch.nn.Module:
    return load_taesd_autoencoder(encoder, decoder, name)


@dataclass(frozen=True)
class TaesdVaeHandle:
    """VAE: ComfyUI's TAESD VAE (VAELoader "taesd" / "taesdxl"): the tiny encoder/decoder pair in
    ``vae_approx`` (``vae/taesd.py``, ``TAESDAutoencoder``). Same interface and latent space as
    ``VaeHandle``: latents unscaled, IMAGE tensors [B,H,W,3] float32 in 0..1."""

    name: str
    encoder_path: str
    decoder_path: str
    latent_format: LatentFormat = LatentFormat()
    precision: PolicyLike | None = None
    downscale: int = 8

    @property
    def latent_scale(self) -> float:
        return self.latent_format.scale_factor

    @property
    def latent_channels(self) -> int:
        return self.latent_format.channels

    def module(self, policy: PolicyLike) -> torch.nn.Module:
        stamp = tuple(os.stat(p).st_mtime_ns for p in (self.encoder_path, self.decoder_path))
        return apply_precision(_taesd_module(self.encoder_path, self.decoder_path, self.name, stamp), policy)

    def decode(self, samples: Tensor, policy: PolicyLike) -> Tensor:
        m = self.module(policy)
        with torch.inference_mode():
            return decode_image(lambda z: m.decode(z).float(), samples, downscale=self.downscale)

    def decode_tiled(self, samples: Tensor, policy: PolicyLike, tile_size: int = 512, overlap: int = 64,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        if tile_size < overlap * 4:
            overlap = tile_size // 4
        f = self.downscale
        m = self.module(policy)
        with torch.inference_mode():
            return decode_tiled(lambda z: m.decode(z).float(), samples, tile=tile_size // f, overlap=overlap // f,
                                downscale=f)

    def encode(self, pixels: Tensor, policy: PolicyLike) -> Tensor:
        m = self.module(policy)
        with torch.inference_mode():
            return encode_image(lambda x: m.encode(x).float(), pixels, downscale=self.downscale,
                                latent_channels=self.latent_channels)

    def encode_tiled(self, pixels: Tensor, policy: PolicyLike, tile_size: int = 512, overlap: int = 64,
                     temporal_size: int = 64, temporal_overlap: int = 8) -> Tensor:
        m = self.module(policy)
        with torch.inference_mode():
            return encode_tiled(lambda x: m.encode(x).float(), pixels, tile=tile_size, overlap=overlap,
                                downscale=self.downscale, latent_channels=self.latent_channels)

    def with_precision(self, policy: PolicyLike | None) -> "TaesdVaeHandle":
        return dataclasses.replace(self, precision=policy)


# --------------------------------------------------------------------------------------------
# CONTROL_NET


@dataclass(frozen=True)
class ControlNetHandle:
    """CONTROL_NET: a ControlNet recipe (``nodes.adapters.controlnet``); ``config`` is a
    ``ControlNetConfig``. ``runner(policy)`` is the precision-applied ``ControlNetModel``
    (f32 in, f32 out), what ``ControlNetChain.runner`` holds. ``control_type``: the extra argument
    SetUnionControlNetType sets (ComfyUI ``set_extra_arg("control_type", ...)``): () = "auto", or
    one union type index; only union nets read it."""

    source: WeightSource
    config: Any
    patches: tuple = ()
    precision: PolicyLike | None = None
    control_type: tuple[int, ...] = ()

    def with_control_type(self, control_type: tuple[int, ...]) -> "ControlNetHandle":
        union = getattr(self.config, "union", None)
        if union is not None:
            check_control_type(control_type, union.num_types)
        return dataclasses.replace(self, control_type=tuple(control_type))

    def runner(self, policy: PolicyLike) -> torch.nn.Module:
        module = store.materialize("controlnet", self.source, self.config, policy.storage, self.patches, ControlNetModel)
        return apply_precision(module, policy)

    def with_precision(self, policy: PolicyLike | None) -> "ControlNetHandle":
        return dataclasses.replace(self, precision=policy)


def _module_shapes(source: WeightSource) -> dict[str, tuple[int, ...]]:
    if source.path is None:
        items = {k: tuple(v.shape) for k, v in (source.tensors or {}).items()}
    else:
        items = {k: i.shape for k, i in inspect_file(source.path).items()}
    rename, post = reader_for_source(source)
    out = {}
    for k, shape in items.items():
        if not k.startswith(source.prefix):
            continue
        k = k[len(source.prefix):]
        new = rename(k) if rename is not None else k
        if new is not None:
            out[new] = shape
    if post is not None:  # a layout that is not a renaming (Flux's diffusers files: fused q, k, v)
        meta = post({k: torch.empty(shape, device="meta") for k, shape in out.items()})
        out = {k: tuple(t.shape) for k, t in meta.items()}
    return out
