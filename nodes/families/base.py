"""The family seam: what one diffusion model family declares (DESIGN §11, docs/ARCHITECTURE.md).

A model family (SD 1.x/2.x/SDXL, Flux.1, SD3.x, Z-Image, Qwen-Image, Wan, ...) is one folder under
``nodes/families/`` holding one object that satisfies ``Family`` plus its model files, and one
line in ``nodes/families/registry.py``'s registry. Shared code (loaders, handles, the sampler, the
memory estimate) asks the registry and the family; it never branches on a family's name.

What a family says, and who asks:

* ``detect(info, read=None, source=None)``: from a diffusion model's tensor names and shapes
  alone, whether the weights are this family's, and which variant and config they are
  (``Detection``). ``info`` is the file's header (name -> ``TensorInfo``) with the diffusion
  model's checkpoint prefix stripped (and its keys renamed to the family's own layout, e.g. from
  diffusers); keys outside the diffusion model (text encoders, marker keys such as ``v_pred``,
  a diffusers folder's ``text_encoder.*`` / ``text_encoder_2.*``) stay as they are, so a family
  can tell variants apart by what is stored beside the model. ``read(key)`` reads one tensor of
  ``info`` (None: no data may be read, e.g. for validation); ``source`` is the diffusion model's
  ``WeightSource``, for parts stored beside it that its handle reads later. The loaders ask
  every registered family in order.
* ``build(config)``: the diffusion model as a plain ``nn.Module`` whose attribute names are the
  checkpoint keys (the weight store materializes it in a storage dtype).
* ``runner(handle, module, policy)``: the sampler seam, a ``FamilyRunner``: the model with the
  family's conditioning. The denoiser hands it ``Cond``s and the latent; the runner says what
  each cond becomes (``cond_inputs``; optionally the extra input channels, ``concat``) and calls
  the model (``__call__``). Samplers never see it: they see ``denoise(x, sigma, ...)`` only.
* ``sampling(variant)``: the parameterisation (eps, v, EDM, x0, flow matching / CONST with a
  shift) and schedule defaults (``Sampling``).
* ``latent_format(variant, channels)``: ``latent_format.LatentFormat`` (scale, shift, channels,
  and the sampler previews' ``latent_rgb_factors`` / ``latent_rgb_factors_bias`` /
  ``taesd_decoder_name``; without factors a model gets no previews).
* ``text_encoders(variant)``: the named encoders the family pairs with (``TextEncoderSlot``).
* ``precision_roles``: which precision role each part runs under (presets decide per role).
* ``trace_inputs(config, latent_shape, batch)``: dummy inputs for the memory estimate's traced
  forward, so the estimate knows no model class. ``latent_shape`` is (h, w), or (t, h, w) for a
  video latent of t latent frames; a family whose edit models take reference latents may accept
  ``refs`` (their (h, w) latent sizes), which the estimate then passes.
* optional, for saving (``weights/save.py``; a family without them cannot be saved as a
  single-file checkpoint, and saving it says so): ``checkpoint_layout(variant)`` ->
  ``CheckpointLayout`` (where each part's keys go), and ``checkpoint_extras(handle, dtype)``, the
  tensors a variant keeps beside the model at the file's top level (SD: Stable Zero123's
  ``cc_projection.*``).
* optional, for LoRA files named in another layout than the model's own (``adapters/lora_keys.py``
  already matches the model's own names: kohya ``lora_unet_<key, . -> _>``, ComfyUI
  ``diffusion_model.<key>``): ``lora_key_map(config) -> {LoRA module name: LoraTarget}``, the
  family's other module names (diffusers / PEFT / ai-toolkit names, without a prefix) and the
  weight each adapts, possibly a row slice of a fused weight (diffusers' ``attn.to_q`` onto BFL's
  fused ``img_attn.qkv``). The LoRA mapper adds the prefixes trainers write (``transformer.``,
  ``diffusion_model.``, ``base_model.model.``, OneTrainer's ``lora_transformer_``, LyCORIS'
  ``lycoris_``), ignores entries whose weight the model does not have, and merges a sliced
  LoRA's update into its rows only (ComfyUI's ``(key, (dim, offset, size))`` key-map entries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

__all__ = ["Sampling", "TextEncoderSlot", "Detection", "CheckpointLayout", "LoraTarget", "FamilyRunner", "Family",
           "PREDICTIONS"]

#: Parameterisations a family may name (``sampling/parameterization.py`` implements each).
#: "flow" is rectified flow / flow matching (ComfyUI's CONST): x_σ = (1 − σ)·x0 + σ·ε, the model
#: predicts v = ε − x0, σ = shifted t.
PREDICTIONS = ("eps", "v_prediction", "x0", "lcm", "img_to_img", "edm", "flow")


@dataclass(frozen=True)
class Sampling:
    """A family variant's parameterisation and schedule (ComfyUI's ``model_sampling`` settings).

    prediction: one of ``PREDICTIONS``. zsnr: zero terminal SNR (discrete schedules).
    beta_range: (linear_start, linear_end) of a discrete schedule; None = SD's 0.00085..0.012.
    continuous: (kind "edm" | "v", sigma_min, sigma_max) for a continuous-time schedule.
    shift, multiplier: flow matching: σ(t) = shift·t / (1 + (shift − 1)·t) and the timestep the
        model sees is σ·multiplier (SD3: shift 3, multiplier 1000; AuraFlow: multiplier 1).
    shift_kind: "linear" (the above, ComfyUI's ModelSamplingDiscreteFlow) or "exponential"
        (Flux, ComfyUI's ModelSamplingFlux: σ(t) = e^shift / (e^shift + 1/t − 1), the model sees
        σ itself, multiplier unused; Flux.1's default shift μ is 1.15).
        ``sampling/schedule_flow.py`` implements both.
    """

    prediction: str = "eps"
    zsnr: bool = False
    beta_range: tuple[float, float] | None = None
    continuous: tuple | None = None
    shift: float = 1.0
    multiplier: float = 1000.0
    shift_kind: str = "linear"


@dataclass(frozen=True)
class TextEncoderSlot:
    """One named text encoder a family pairs with: ``name`` ("clip_l", "clip_g", "t5xxl",
    "qwen3_4b", ...), the ``tokenizer`` it reads, and the precision ``role`` it runs under.
    Where the loaders find it: ``prefix`` and key ``layout`` in a single-file checkpoint ("" when
    checkpoints do not carry it), ``folder`` in a diffusers pipeline folder; ``encoding``: the
    name of the text-encoder set the variant's encoders make (``ClipHandle.kind``); ``rule``: the
    encoder's output rule (``encoder_set.OutputRule``: pad token, layer, pooled output);
    ``arch``: the encoder architecture the slot's weights are ("clip", "t5", "qwen3", "gemma2":
    a name registered with the text encoders, which derives the config from the weights' shapes
    and builds the module); ``optional``: the set runs without it (SD3 without T5)."""

    name: str
    tokenizer: str
    role: str = "text"
    prefix: str = ""
    layout: str = ""
    folder: str = ""
    encoding: str = ""
    rule: Any = None
    arch: str = "clip"
    optional: bool = False


@dataclass(frozen=True)
class Detection:
    """What a family recognised in a state dict: its ``variant`` name, the model ``config``
    (a frozen dataclass derived from shapes) and the ``ModelHandle`` fields the family sets from
    the keys (``fields``): ``latent_format``, ``prediction`` (a marker key may tell), schedule
    fields, and ``parts``, a frozen dataclass of the family's own for what the variant carries
    beside the model (SD: ``sd.parts.SDParts``). The loader starts from ``sampling(variant)``.
    One field is the loader's, not the handle's: ``source_layout``, the key layout the weights
    are stored in when the family recognised a layout other than its own (Flux's diffusers
    files: a layout it registered with ``weights/layouts.register_layout``)."""

    family: str
    variant: str
    config: Any
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointLayout:
    """Where a family variant's single-file checkpoint keeps each part (what CheckpointSave
    writes): the diffusion model's key prefix, the VAE's, each text encoder's as
    (name, prefix, layout) in the family's order (layout: the key layout the encoder is stored in,
    "hf" | "open_clip", as ``TextEncoderSlot.layout``), and ComfyUI's ``modelspec.architecture``
    metadata value (None: no ``modelspec`` entries)."""

    diffusion: str
    vae: str
    text_encoders: tuple[tuple[str, str, str], ...] = ()
    architecture: str | None = None

    def text_encoder(self, name: str) -> tuple[str, str] | None:
        """(prefix, layout) of the text encoder ``name``, or None when the file has no place for it."""
        for slot, prefix, layout in self.text_encoders:
            if slot == name:
                return prefix, layout
        return None


@dataclass(frozen=True)
class LoraTarget:
    """Where one LoRA module (named in a layout other than the model's) lands in the model:
    ``key`` the model's weight key (``....weight``; its bias is the same module's ``.bias``);
    ``rows`` (start, size) along the output dim when the module is one piece of a fused weight
    (q of a fused qkv: (0, hidden)), None for the whole weight; ``swap_halves``: the module's
    output halves are the model's in the other order (diffusers' ``AdaLayerNormContinuous``
    emits (scale, shift) where BFL / MMDiT emit (shift, scale)), so its update is swapped too."""

    key: str
    rows: tuple[int, int] | None = None
    swap_halves: bool = False


@runtime_checkable
class FamilyRunner(Protocol):
    """The sampler seam: one precision-applied diffusion model with its family's conditioning.

    Everything goes in and comes out float32. ``sampling`` builds the denoiser's
    ``ModelSampling``; ``latent_format`` scales latents in and out; ``in_channels`` counts the
    model's input channels (more than the latent's: concat conditioning such as inpainting).

    Optional (the denoiser asks with ``getattr``; a runner without them has none):

    * ``concat(cond, latent_image, denoise_mask, seed) -> Tensor | None``: the extra input
      channels [B, E, H, W] the model takes after the latent for one cond (ComfyUI's
      ``concat_cond``: an inpaint model's mask + masked latent, an instruct-pix2pix model's image
      latent, ...; shared tensors in ``models/concat_cond.py``). ``latent_image`` [B, C, H, W] is
      the process_in-scaled sampled latent, ``denoise_mask`` its noise mask at latent size or
      None, ``seed`` the sampling seed. The denoiser crops it with the cond's area, batches it
      and checks C + E == ``in_channels``; None: no extra channels.
    * ``context_free_refusal() -> str | None``: why the model cannot run a text-free cond (no
      context, DualModelGuider's unconnected negative), as a sentence for the error; None when
      it can.
    * ``video_latent: bool``: the model samples video latents [B, C, T, H, W] (Wan); an image
      latent [B, C, H, W] is sampled as one frame (``ksampler.fix_empty_latent_channels``).
      ``concat`` then gives [B, E, T, H, W] and a noise mask arrives as [B, C, T, H, W].
    * ``wants_denoise_mask: bool``: ``cond_inputs`` also takes ``denoise_mask=`` (the noise mask
      at latent size, or None): a model whose inputs depend on it (Wan 2.2 5B's per-frame
      timesteps, ComfyUI's ``process_timestep``).
    * ``inpaint_keeps_clean: bool``: where the noise mask is 0 the model input is the input
      latent itself, not re-noised to the step's σ (ComfyUI's ``scale_latent_inpaint`` returning
      the latent: Wan 2.2 5B's given first frame, at timestep 0).
    * ``skippable_blocks: Mapping[str, int]``: the transformer blocks a call can leave out, by
      ComfyUI's kind name ("double_block", "single_block") -> count; the runner then takes
      ``models/block_skip.SkipBlocks`` in ``patches`` (skip-layer guidance). Without it a model
      has none, and skip-layer guidance is refused by name.
    """

    sampling: Sampling
    latent_format: Any
    in_channels: int

    def cond_inputs(self, cond: Any, latent_shape: tuple[int, ...], *, negative: bool = False,
                    seed: int = 0) -> Mapping[str, Tensor]:
        """The model inputs one CONDITIONING entry gives beside its text tokens (SDXL's vector
        ``y``; Flux's ``guidance`` and pooled vector; ...): name -> tensor with a batch dim of 1,
        batched by the denoiser with the conds evaluated together."""
        ...

    def __call__(self, x: Tensor, timestep: Tensor, context: Tensor | None,
                 inputs: Mapping[str, Tensor], control: Any = None, patches: tuple = (),
                 sigma: float | None = None) -> Tensor:
        """The raw model output (eps / v / x0 / flow velocity, per ``sampling.prediction``) for
        ``x`` [B, C, ...] already scaled by the parameterisation's c_in and concat-ed with any
        extra input channels; ``timestep`` [B]; ``context`` [B, T, D] or None; ``inputs`` the
        batched ``cond_inputs``; ``control`` residuals; ``patches`` forward-time patches."""
        ...


@runtime_checkable
class Family(Protocol):
    """A model family (see the module docstring). ``name`` is the registry key; ``display`` is
    what messages call it ("SD 1.x / 2.x / SDXL")."""

    name: str
    display: str
    precision_roles: Mapping[str, str]
    # optional: ``refusals``, the rows of ``families/refused.py``'s table of families mixgraph
    # does not run that this family runs ("Flux", ...): those files stop being refused;
    # ``checkpoint_layout(variant) -> CheckpointLayout`` and ``checkpoint_extras(handle, dtype)``
    # for CheckpointSave (without them saving the family's models is refused by name);
    # ``clip_types``: CLIPLoader / DualCLIPLoader / TripleCLIPLoader ``type`` -> the variant whose
    # ``text_encoders`` the loaded files fill ({"flux": "dev"}); the loaders match each file to a
    # slot by the encoder architecture its keys show; ``lora_key_map(config)`` -> {LoRA module
    # name: ``LoraTarget``}, the names LoRA files use in the family's other layouts (see above)

    def detect(self, info: Mapping[str, Any], read: Any = None, source: Any = None) -> Detection | None: ...

    def build(self, config: Any) -> nn.Module: ...

    def runner(self, handle: Any, module: nn.Module, policy: Any) -> FamilyRunner: ...

    def sampling(self, variant: str) -> Sampling: ...

    def latent_format(self, variant: str, channels: int) -> Any: ...

    def text_encoders(self, variant: str) -> tuple[TextEncoderSlot, ...]: ...

    def trace_inputs(self, config: Any, latent_shape: tuple[int, ...], batch: int) -> tuple[tuple, dict]:
        """(args, kwargs) for ``build(config)(*args, **kwargs)``: one model call on a latent of
        ``latent_shape`` (its spatial dims, in latent pixels) for ``batch`` evaluated entries."""
        ...
