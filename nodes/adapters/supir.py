"""SUPIR (Yu et al. 2024, "Scaling Up to Excellence: Practicing Model Scaling for Photo-Realistic
Image Restoration In the Wild"): an SDXL restoration adapter, as ComfyUI's ``ModelPatchLoader``
(SUPIR format) and ``SUPIRApply`` run it.

Facts read from ComfyUI (comfyanonymous/ComfyUI): ``comfy/ldm/supir/supir_modules.py`` (7b35ae9),
``comfy/ldm/supir/supir_patch.py`` (5b7b80f) and ``comfy_extras/nodes_model_patch.py``
(Comfy-Org/ComfyUI 08f68f0). The code is mixgraph's own.

* ``GLVControl``: the control encoder, the encoder half of an SDXL UNet (time and label
  embeddings, input blocks, middle block; mixgraph's ``unet.build_input_blocks`` /
  ``build_middle_block``, same key layout) plus ``input_hint_block`` (a 3×3 conv of the hint
  latent, added to the first input block's output). It reads the noisy UNet input x, the
  timesteps, text context and SDXL vector y of each UNet call and returns one feature map per
  input block and one for the middle block.
* ``project_modules``: ``ZeroSFT`` adapters (one after the middle block, one per output block in
  place of the skip concatenation) and ``ZeroCrossAttn`` adapters (before each output
  Upsample), stored in reverse call order. ComfyUI hard-codes SDXL's sizes; here every size
  comes from tensor shapes, so a SUPIR file built for a smaller SDXL-layout UNet loads too.
* ``SupirPatch`` (a forward-time UNet patch, ``unet_patches.py``): per UNet call ``begin`` runs
  the control encoder once and returns a per-call object whose ``middle_after`` /
  ``output_block`` / ``before_upsample`` hooks apply the adapters with the control scale,
  interpolated linearly from ``strength_start`` (σ ≥ 14.6146) to ``strength_end`` (σ = 0):
  t = min(σ / 14.6146, 1), scale = t·(start − end) + end. A scale ≤ 0 leaves the UNet untouched.
* ``RestoreCFG`` (post-CFG sampler patch): for σ > s_tmin,
  denoised −= (denoised − x_c)·(σ / 14.6146)^restore_cfg, with
  x_c = process_in(vae.encode(vae.decode(process_out(hint)))).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.weights.safetensors_io import WeightFileError, inspect_file, read_tensors
from mixgraph.nodes.families.sd.unet import (EmbedSequential, UNetConfig, build_input_blocks,
                                             build_middle_block, encoder_config_from_shapes,
                                             timestep_embedding)

SIGMA_MAX = 14.6146  # ComfyUI's SUPIRPatch.SIGMA_MAX (SDXL's largest sigma)
GROUPS = 32

SUPIR_KEYS = ("model.control_model.input_hint_block.0.weight", "control_model.input_hint_block.0.weight")
DENOISE_ENCODER_PREFIX = "first_stage_model.denoise_encoder."

SUPPORTED = "mixgraph runs SD 1.x, SD 2.x and SDXL"


class ModelPatchError(ValueError):
    pass


def _other_format(keys: set[str]) -> str | None:
    """The name of a model-patch format ComfyUI's ModelPatchLoader knows but mixgraph does not run
    (detected by the keys ComfyUI tests, in its order), or None."""
    if "lllite_conditioning1.conv1.weight" in keys:
        return "Anima LLLite"
    if "controlnet_blocks.0.y_rms.weight" in keys:
        return "Qwen-Image DiffSynth ControlNet"
    if "feature_embedder.mid_layer_norm.bias" in keys:
        return "Flux USO style projector"
    if "control_all_x_embedder.2-1.weight" in keys:
        return "Z-Image Fun ControlNet"
    if "control_img_in.weight" in keys and "control_blocks.0.img_mlp.out.weight" in keys:
        return "Qwen-Image 2.1 Fun ControlNet"
    if "control_proj_in.weight" in keys and "control_blocks.0.adaln_proj.linear.weight" in keys:
        return "MiniMax H3 Fun ControlNet"
    if "controlnet_patch_embedding.weight" in keys:
        return "Wan Uni3C ControlNet"
    if "attention_pooler.query_tokens" in keys or any(
            k.endswith("duration_head.attention_pooler.query_tokens") for k in keys):
        return "LTX duration head"
    if "audio_proj.proj1.weight" in keys:
        return "Wan MultiTalk"
    return None


def split_supir_state_dict(sd: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(SUPIR weights keyed ``control_model.*`` / ``project_modules.*``, denoise-encoder weights
    keyed as the VAE encoder's). ComfyUI's remap: the prefixed form maps
    ``model.control_model.`` → ``control_model.`` and ``model.diffusion_model.project_modules.``
    → ``project_modules.``, the bare form keeps those two prefixes; every other key is dropped,
    after ``first_stage_model.denoise_encoder.*`` was taken out; ``control_model.mask_LQ`` too."""
    if SUPIR_KEYS[0] in sd:
        remap = {"model.control_model.": "control_model.",
                 "model.diffusion_model.project_modules.": "project_modules."}
    else:
        remap = {"control_model.": "control_model.", "project_modules.": "project_modules."}
    denoise = {k[len(DENOISE_ENCODER_PREFIX):]: v for k, v in sd.items() if k.startswith(DENOISE_ENCODER_PREFIX)}
    out: dict[str, Tensor] = {}
    for k, v in sd.items():
        if k.startswith(DENOISE_ENCODER_PREFIX):
            continue
        for old, new in remap.items():
            if k.startswith(old):
                out[new + k[len(old):]] = v
                break
    out.pop("control_model.mask_LQ", None)
    return out, denoise


# ---------------------------------------------------------------------------------------------
# modules


class ZeroSFT(nn.Module):
    """Spatial feature transform of a UNet feature map h by a control feature map c: h + conv(c)
    (concatenated after the main path ``h_ori`` when ``concat_channels``), group-normed, then
    scaled and shifted by convs of c; blended with the unadapted input by the control scale."""

    def __init__(self, label_nc: int, norm_nc: int, concat_channels: int, hidden: int):
        super().__init__()
        width = norm_nc + concat_channels
        self.param_free_norm = nn.GroupNorm(GROUPS, width)
        self.mlp_shared = nn.Sequential(nn.Conv2d(label_nc, hidden, 3, padding=1), nn.SiLU())
        self.zero_mul = nn.Conv2d(hidden, width, 3, padding=1)
        self.zero_add = nn.Conv2d(hidden, width, 3, padding=1)
        self.zero_conv = nn.Conv2d(label_nc, norm_nc, 1)
        self.pre_concat = concat_channels != 0

    def forward(self, c: Tensor, h: Tensor, h_ori: Tensor | None = None, scale: float = 1.0) -> Tensor:
        pre = h_ori is not None and self.pre_concat
        added = h + self.zero_conv(c)
        # without a pre-concatenation ComfyUI's in-place add makes the blend's start point h + conv(c)
        raw = torch.cat([h_ori, h], dim=1) if pre else added
        x = torch.cat([h_ori, added], dim=1) if pre else added
        actv = self.mlp_shared(c)
        gamma, beta = self.zero_mul(actv), self.zero_add(actv)
        x = self.param_free_norm(x)
        x = x + beta + x * gamma
        if h_ori is not None and not self.pre_concat:
            x = torch.cat([h_ori, x], dim=1)
        return torch.lerp(raw, x, scale)


class _CrossAttn(nn.Module):
    def __init__(self, query_dim: int, context_dim: int, inner: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim))

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)

        def split(t: Tensor) -> Tensor:  # [B, N, inner] -> [B, heads, N, d]
            return t.reshape(b, t.shape[1], self.heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(q), split(k), split(v))
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class ZeroCrossAttn(nn.Module):
    """x + attention(x tokens → context tokens)·scale, both group-normed first."""

    def __init__(self, context_dim: int, query_dim: int, inner: int, heads: int):
        super().__init__()
        self.attn = _CrossAttn(query_dim, context_dim, inner, heads)
        self.norm1 = nn.GroupNorm(GROUPS, query_dim)
        self.norm2 = nn.GroupNorm(GROUPS, context_dim)

    def forward(self, context: Tensor, x: Tensor, scale: float = 1.0) -> Tensor:
        _, _, h, w = x.shape
        out = self.attn(self.norm1(x).flatten(2).transpose(1, 2), self.norm2(context).flatten(2).transpose(1, 2))
        return x + out.transpose(1, 2).unflatten(2, (h, w)) * scale


class GLVControl(nn.Module):
    """The control encoder: an SDXL UNet's encoder half plus ``input_hint_block``."""

    def __init__(self, config: UNetConfig):
        super().__init__()
        if config.adm_in_channels is None:
            raise ModelPatchError("SUPIR control model: no label_emb (SDXL vector input) found")
        self.config = config
        mc, ted = config.model_channels, config.time_embed_dim
        self.time_embed = nn.Sequential(nn.Linear(mc, ted), nn.SiLU(), nn.Linear(ted, ted))
        self.label_emb = nn.Sequential(nn.Sequential(nn.Linear(config.adm_in_channels, ted), nn.SiLU(),
                                                     nn.Linear(ted, ted)))
        self.input_blocks, channels = build_input_blocks(config)
        self.middle_block = build_middle_block(config, channels[-1])
        self.input_hint_block = EmbedSequential([nn.Conv2d(config.in_channels, mc, 3, padding=1)])
        self.feature_channels = tuple(channels) + (channels[-1],)

    def forward(self, hint: Tensor, timesteps: Tensor, x: Tensor, context: Tensor, y: Tensor) -> list[Tensor]:
        emb = self.time_embed(timestep_embedding(timesteps, self.config.model_channels).to(x.dtype))
        emb = emb + self.label_emb(y)
        guided = self.input_hint_block(hint, emb, context)
        feats: list[Tensor] = []
        h = x
        for i, block in enumerate(self.input_blocks):
            h = block(h, emb, context)
            if i == 0:
                h = h + guided
            feats.append(h)
        feats.append(self.middle_block(h, emb, context))
        return feats


class SupirModel(nn.Module):
    def __init__(self, control: GLVControl, project_modules: list[nn.Module]):
        super().__init__()
        self.control_model = control
        self.project_modules = nn.ModuleList(project_modules)


def _project_module(shapes: dict[str, tuple[int, ...]], i: int) -> nn.Module:
    p = f"project_modules.{i}."
    if p + "zero_conv.weight" in shapes:
        label_nc = shapes[p + "zero_conv.weight"][1]
        norm_nc = shapes[p + "zero_conv.weight"][0]
        width = shapes[p + "zero_mul.weight"][0]
        hidden = shapes[p + "mlp_shared.0.weight"][0]
        return ZeroSFT(label_nc, norm_nc, width - norm_nc, hidden)
    if p + "attn.to_q.weight" in shapes:
        inner, query_dim = shapes[p + "attn.to_q.weight"]
        context_dim = shapes[p + "attn.to_k.weight"][1]
        heads = max(1, query_dim // 64)  # ComfyUI: query_dim // 64 heads of 64 channels
        if inner % heads:
            raise ModelPatchError(f"SUPIR project_modules.{i}: attention width {inner} does not split "
                                  f"into {heads} heads")
        return ZeroCrossAttn(context_dim, query_dim, inner, heads)
    raise ModelPatchError(f"SUPIR project_modules.{i}: neither a ZeroSFT (zero_conv) nor a ZeroCrossAttn "
                          f"(attn.to_q) adapter")


def build_supir(shapes: dict[str, tuple[int, ...]]) -> SupirModel:
    """A SupirModel sized from the remapped keys' shapes."""
    control_shapes = {k[len("control_model."):]: s for k, s in shapes.items() if k.startswith("control_model.")}
    if "input_blocks.0.0.weight" not in control_shapes:
        raise ModelPatchError("SUPIR control model: no control_model.input_blocks.0.0.weight")
    control = GLVControl(encoder_config_from_shapes(control_shapes))
    n = 0
    while any(k.startswith(f"project_modules.{n}.") for k in shapes):
        n += 1
    if n == 0:
        raise ModelPatchError("SUPIR model patch has no project_modules")
    return SupirModel(control, [_project_module(shapes, i) for i in range(n)])


# ---------------------------------------------------------------------------------------------
# MODEL_PATCH


class SupirWeights:
    """MODEL_PATCH (SUPIR): the float32 module on the CPU, per-device copies made on first use,
    and the denoise encoder weights (VAE encoder keys) when the file has them. Compared by
    identity: one object per load."""

    format = "SUPIR"

    def __init__(self, model: SupirModel, denoise_encoder: dict[str, Tensor], name: str = ""):
        self.model = model.eval().requires_grad_(False)
        self.denoise_encoder = denoise_encoder
        self.name = name
        self._copies: dict[torch.device, SupirModel] = {}
        self._lock = threading.Lock()

    def on(self, device: torch.device) -> SupirModel:
        if device.type == "cpu":
            return self.model
        with self._lock:
            m = self._copies.get(device)
            if m is None:
                m = self._copies[device] = copy.deepcopy(self.model).to(device)
            return m

    def __repr__(self) -> str:
        return f"SupirWeights({self.name!r})"


def load_model_patch(path: str | os.PathLike) -> SupirWeights:
    """ModelPatchLoader: a SUPIR file; the other formats ComfyUI knows are refused by name."""
    name = os.path.basename(os.fspath(path))
    try:
        keys = set(inspect_file(path))
    except WeightFileError as e:
        raise ModelPatchError(str(e)) from e
    other = _other_format(keys)
    if other is not None:
        raise ModelPatchError(f"{name}: model patch format {other}: model family not supported ({SUPPORTED})")
    if not any(k in keys for k in SUPIR_KEYS):
        raise ModelPatchError(f"{name}: not a model patch format mixgraph knows (SUPIR is recognised by "
                              f"{SUPIR_KEYS[1]!r}, with or without the 'model.' prefix)")
    # a SUPIR checkpoint often holds a whole SDXL model too: read only what the remap keeps
    wanted = [k for k in keys if k.startswith(("model.control_model.", "model.diffusion_model.project_modules.",
                                               "control_model.", "project_modules.", DENOISE_ENCODER_PREFIX))]
    sd, denoise = split_supir_state_dict(read_tensors(path, wanted, dtype=torch.float32))
    model = build_supir({k: tuple(v.shape) for k, v in sd.items()})
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ModelPatchError(f"{name}: SUPIR weights do not fit the layout read from their shapes "
                              f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    return SupirWeights(model, denoise, name)


def denoise_encoder_vae(module: nn.Module, denoise: dict[str, Tensor]) -> nn.Module:
    """A copy of the VAE ``module`` (AutoencoderKL) whose encoder weights are replaced by the SUPIR
    denoise encoder's (ComfyUI adds them as ``encoder.<k>`` patches with strength_model 0: keys the
    encoder lacks are ignored). The shared module is never changed."""
    m = copy.deepcopy(module)
    own = m.encoder.state_dict()
    new = {}
    for k, v in denoise.items():
        if k not in own:
            continue
        if own[k].numel() != v.numel():
            raise ModelPatchError(f"SUPIR denoise encoder weight {k!r} has shape {tuple(v.shape)}, "
                                  f"the VAE encoder's is {tuple(own[k].shape)}")
        new[k] = v.reshape(own[k].shape).to(own[k].dtype)
    m.encoder.load_state_dict(new, strict=False)
    return m


# ---------------------------------------------------------------------------------------------
# patches


def _match_batch(t: Tensor, b: int) -> Tensor:
    if t.shape[0] == b:
        return t
    if t.shape[0] == 1:
        return t.expand(b, *t.shape[1:])
    return t.repeat((b + t.shape[0] - 1) // t.shape[0], 1, 1, 1)[:b]


def control_scale(start: float, end: float, sigma: float | None) -> float:
    """ComfyUI's SUPIRPatch._get_control_scale."""
    if start == end or sigma is None:
        return end
    t = min(sigma / SIGMA_MAX, 1.0)
    return t * (start - end) + end


@dataclass(frozen=True, eq=False)
class SupirPatch:
    """The forward-time UNet patch (``unet_patches.py``); ``hint`` is the process_in'ed hint
    latent [B, C, h, w]."""

    weights: SupirWeights
    hint: Tensor = field(repr=False)
    strength_start: float = 1.0
    strength_end: float = 1.0
    sigma: float | None = None

    def at_sigma(self, sigma: float) -> "SupirPatch":
        return dataclasses.replace(self, sigma=float(sigma))

    def begin(self, x: Tensor, timesteps: Tensor, context: Tensor, y: Tensor | None):
        scale = control_scale(self.strength_start, self.strength_end, self.sigma)
        if not scale > 0:
            return None
        if y is None:
            raise ModelPatchError("SUPIR needs an SDXL model (its control encoder reads the SDXL vector input)")
        if tuple(self.hint.shape[-2:]) != tuple(x.shape[-2:]):
            raise ModelPatchError(f"SUPIRApply: the image encodes to a {tuple(self.hint.shape[-2:])} latent but "
                                  f"the sampled latent is {tuple(x.shape[-2:])}; use an image of the "
                                  f"sampled size")
        model = self.weights.on(x.device)
        hint = _match_batch(self.hint.to(device=x.device, dtype=torch.float32), x.shape[0])
        with torch.no_grad():
            feats = model.control_model(hint, timesteps, x.float(), context.float(), y.float())
        return _SupirCall(model.project_modules, feats, scale)


class _SupirCall:
    """SUPIR's adapters for one UNet call: they are used from the last to the first."""

    def __init__(self, modules: nn.ModuleList, feats: list[Tensor], scale: float):
        self.modules = modules
        self.feats = feats
        self.scale = scale
        self.adapter = len(modules) - 1
        self.control = len(feats) - 1
        self.current = self.control

    def _next(self) -> nn.Module:
        if self.adapter < 0:
            raise ModelPatchError("SUPIR model patch has fewer adapters than this UNet has blocks "
                                  "(built for another UNet)")
        m = self.modules[self.adapter]
        self.adapter -= 1
        return m

    def middle_after(self, h: Tensor) -> Tensor:
        out = self._next()(self.feats[self.control], h.float(), scale=self.scale)
        self.control -= 1
        return out.to(h.dtype)

    def output_block(self, h: Tensor, skip: Tensor, index: int) -> tuple[Tensor, None]:
        self.current = self.control
        out = self._next()(self.feats[self.control], skip.float(), h.float(), scale=self.scale)
        self.control -= 1
        return out.to(h.dtype), None

    def before_upsample(self, h: Tensor) -> Tensor:
        return self._next()(self.feats[self.current], h.float(), scale=self.scale).to(h.dtype)


@dataclass(frozen=True, eq=False)
class RestoreCFG:
    """Post-CFG pull of the guided x0 towards the input image's latent ``x_center``
    (process_in space, [B, C, h, w])."""

    x_center: Tensor = field(repr=False)
    restore_cfg: float = 4.0
    s_tmin: float = 0.05
    stage: str = "post_cfg"

    def post(self, a, denoised: Tensor) -> Tensor:
        sigma = a.sigma
        s = float(sigma.reshape(-1)[0]) if sigma.dim() > 0 else float(sigma)
        if not s > self.s_tmin:
            return denoised
        ref = _match_batch(self.x_center.to(device=denoised.device, dtype=denoised.dtype), denoised.shape[0])
        sig = sigma.reshape(-1, 1, 1, 1) if sigma.dim() > 0 else sigma
        sig = sig.to(device=denoised.device, dtype=denoised.dtype)
        return denoised - (denoised - ref) * (sig / SIGMA_MAX) ** self.restore_cfg
