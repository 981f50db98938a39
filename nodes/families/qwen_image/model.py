"""The Qwen-Image transformer (Qwen-Image technical report, arXiv:2508.02324; ComfyUI's
``comfy/ldm/qwen_image/model.py``, diffusers' ``QwenImageTransformer2DModel``), readable top to
bottom. Attribute names are the checkpoint keys, which ComfyUI's files and diffusers'
``transformer/`` folders share (``img_in``, ``transformer_blocks.N.attn.add_q_proj``, ...).

The latent [B, 16, H, W] (or ComfyUI's [B, 16, 1, H, W]: the Wan 2.1 latent format is 3-D, one
frame for an image) is cut into 2 x 2 patches (64 values per token, channel-major) and embedded
(``img_in``); the text features (Qwen2.5-VL's last hidden state, 3584 wide) are RMS-normed
(``txt_norm``) and projected (``txt_in``). ``depth`` double-stream blocks follow (MMDiT: separate
weights per stream, one joint attention over [text; image]); every block is modulated (shift,
scale, gate, twice) by the timestep embedding alone (no pooled text, no guidance). The image
tokens leave through an AdaLN ``norm_out`` and ``proj_out``.

Positions are a 3-axis rotary embedding (frame, row, column; 16 + 56 + 56 of a 128-wide head).
Image token (r, c) of an h x w token grid sits at (0, r − h // 2, c − w // 2), centred as
ComfyUI places it. Text token i sits at (s + i, s + i, s + i) on all three axes, after the
image: s = max(h // 2, w // 2) of the sampled latent's grid.

Qwen-Image-Edit appends reference-image tokens (``ref_latents``, ComfyUI's ``ReferenceLatent``)
after the image tokens; only the sampled image's tokens are projected out. Where they sit is
ComfyUI's ``reference_latents_method``:

* "index" (Qwen's default): reference k (from 1) at frame index k, centred on its own grid;
* "offset" (and "uxo", which ComfyUI's Qwen model treats alike): frame index 1, each reference
  placed right of or below the ones before it, whichever keeps the canvas squarer;
* "index_timestep_zero" (Qwen-Image-Edit-2511, whose files carry the ``__index_timestep_zero__``
  marker; diffusers' ``zero_cond_t``): positions as "index", and the reference tokens are
  modulated by the embedding of timestep 0 (they are clean images), the sampled image's and the
  text's by the sampling timestep.

Sources: ComfyUI's model at Comfy-Org a125cd8 (2025-10-12), which has "index" and "offset"; the
method name "index_timestep_zero" and the marker are newer ComfyUI's (its workflows and files),
whose code for them was not at hand: their arithmetic here is diffusers 0.42's ``zero_cond_t``,
checked against it (``tests/test_qwen_image_parity.py``).

A text mask (1 = token, 0 = padding) keeps every token from attending to padded text keys, as
diffusers' ``encoder_hidden_states_mask`` and newer ComfyUI (whose ``model_base.QwenImage`` hands
the cond's ``attention_mask`` to the model); padded tokens keep their positions.

Conventions are ComfyUI's: ``forward(x, timestep, context, ...)`` takes ``timestep`` = σ (the
flow time; multiplier 1, the sinusoidal features scale it by 1000) and returns the velocity
ε − x0 of the CONST parameterisation.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.latent_tokens import PATCH, patchify, token_grid, unpatchify
from mixgraph.nodes.models.attention import attention

__all__ = ["QwenImageConfig", "QwenImage", "REF_METHODS", "PATCH", "timestep_embedding", "rope_angles",
           "token_positions"]

TIME_DIM = 256  # width of the sinusoidal timestep features
TIME_SCALE = 1000.0  # the features see 1000·σ (diffusers' Timesteps(scale=1000))
#: ComfyUI's ``reference_latents_method`` values the Qwen model reads (``uxo`` is placed as "offset")
REF_METHODS = ("index", "offset", "uxo", "index_timestep_zero")


@dataclass(frozen=True)
class QwenImageConfig:
    """Sizes from the weights' shapes (``detect.py``); RoPE axes and base are the family's.
    ``default_ref_method``: where reference latents go when a cond names no method (ComfyUI's
    ``default_ref_method``: "index", or "index_timestep_zero" for Edit-2511 files)."""

    in_channels: int = 16  # latent channels (img_in takes 2 x 2 patches of them)
    out_channels: int = 16
    dim: int = 3072
    heads: int = 24
    depth: int = 60
    context_dim: int = 3584  # Qwen2.5-VL 7B's hidden width
    mlp_hidden: int = 12288
    axes_dims: tuple[int, int, int] = (16, 56, 56)  # RoPE channels per axis (frame, row, column)
    rope_theta: float = 10000.0
    default_ref_method: str = "index"

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


# ---------------------------------------------------------------------------------------------
# embeddings


def timestep_embedding(t: Tensor, dim: int = TIME_DIM) -> Tensor:
    """Sinusoidal features [cos, sin] of 1000·t (diffusers' ``Timesteps(flip_sin_to_cos=True,
    downscale_freq_shift=0, scale=1000)``), float32 [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = TIME_SCALE * t.float()[:, None] * freqs[None]  # [B, half]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    """linear_1 -> SiLU -> linear_2 on the sinusoidal features (diffusers' ``TimestepEmbedding``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(TIME_DIM, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, features: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(features)))


class TimeTextEmbed(nn.Module):
    """``time_text_embed``: the timestep embedding [B, D] every block is modulated by."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedder(dim)

    def forward(self, timestep: Tensor, dtype: torch.dtype) -> Tensor:
        return self.timestep_embedder(timestep_embedding(timestep).to(dtype))


def rope_angles(positions: Tensor, axes_dims: Sequence[int], theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [B, N, head_dim / 2] of the rotary embedding of ``positions`` [B, N, 3]: axis a
    rotates its own ``axes_dims[a]`` channels, pair j by position · θ^(−2j / d) (angles in float64,
    as ComfyUI's ``EmbedND``)."""
    angles = []
    for a, d in enumerate(axes_dims):
        omega = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
        angles.append(positions[..., a, None].double() * omega)  # [B, N, d/2]
    angle = torch.cat(angles, dim=-1)  # [B, N, head_dim/2]
    return angle.cos().float(), angle.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each adjacent channel pair (x[2i], x[2i+1]) of x [B, N, H, Dh], in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, N, H, Dh/2, 2]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, :, None], sin[:, :, None]  # [B, N, 1, Dh/2]
    out = torch.stack([c * x0 - s * x1, s * x0 + c * x1], dim=-1)  # [B, N, H, Dh/2, 2]
    return out.flatten(-2).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# tokens and positions


def image_positions(h_len: int, w_len: int, index: int = 0, h_offset: int = 0, w_offset: int = 0,
                    device=None) -> Tensor:
    """(frame, row, column) of each token of an h_len x w_len grid, rows first, centred on the
    grid: [h_len·w_len, 3]."""
    pos = torch.zeros(h_len, w_len, 3, device=device)
    pos[..., 0] = index
    pos[..., 1] = (torch.arange(h_len, device=device, dtype=torch.float32) + h_offset - h_len // 2)[:, None]
    pos[..., 2] = (torch.arange(w_len, device=device, dtype=torch.float32) + w_offset - w_len // 2)[None, :]
    return pos.reshape(h_len * w_len, 3)


def token_positions(latent_hw: tuple[int, int], ref_hws: Sequence[tuple[int, int]], method: str,
                    n_txt: int, device=None) -> Tensor:
    """Positions [T + N, 3] of the text tokens, the sampled image's and each reference's, in
    sequence order (text first). ``latent_hw`` / ``ref_hws``: latent sizes (see the module
    docstring for the reference methods)."""
    h_len, w_len = token_grid(*latent_hw)
    parts = [image_positions(h_len, w_len, device=device)]
    index = placed_h = placed_w = 0
    for rh, rw in ref_hws:
        h_off = w_off = 0
        if method in ("index", "index_timestep_zero"):
            index += 1
        else:  # "offset" / "uxo": beside the references before it, in latent pixels
            index = 1
            if rh + placed_h > rw + placed_w:
                w_off = placed_w
            else:
                h_off = placed_h
            placed_h, placed_w = max(placed_h, rh + h_off), max(placed_w, rw + w_off)
        parts.append(image_positions(*token_grid(rh, rw), index=index, h_offset=(h_off + PATCH // 2) // PATCH,
                                     w_offset=(w_off + PATCH // 2) // PATCH, device=device))
    start = max(h_len // 2, w_len // 2)
    txt = torch.arange(start, start + n_txt, device=device, dtype=torch.float32)[:, None].expand(n_txt, 3)
    return torch.cat([txt] + parts, dim=0)


# ---------------------------------------------------------------------------------------------
# blocks


class RMSNorm(nn.Module):
    """x / rms(x) · weight, statistics in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).to(x.dtype)


def _layer_norm(x: Tensor) -> Tensor:
    """LayerNorm without affine parameters (eps 1e-6), statistics in float32."""
    return F.layer_norm(x.float(), x.shape[-1:], eps=1e-6).to(x.dtype)


class JointAttention(nn.Module):
    """Per-stream q / k / v projections and per-head RMS norms, RoPE, one attention over
    [text; image], per-stream output projections (``to_out.0`` image, ``to_add_out`` text)."""

    upcast_attention = False  # apply_precision sets it for fp16 policies that ask

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        head_dim = dim // heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim) for _ in range(3))  # image stream
        self.add_q_proj, self.add_k_proj, self.add_v_proj = (nn.Linear(dim, dim) for _ in range(3))  # text stream
        self.norm_q, self.norm_k = RMSNorm(head_dim), RMSNorm(head_dim)
        self.norm_added_q, self.norm_added_k = RMSNorm(head_dim), RMSNorm(head_dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        self.to_add_out = nn.Linear(dim, dim)

    def forward(self, img: Tensor, txt: Tensor, cos: Tensor, sin: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        heads = lambda t: t.unflatten(-1, (self.heads, -1))  # noqa: E731  [B, N, D] -> [B, N, H, Dh]
        q = torch.cat([self.norm_added_q(heads(self.add_q_proj(txt))), self.norm_q(heads(self.to_q(img)))], dim=1)
        k = torch.cat([self.norm_added_k(heads(self.add_k_proj(txt))), self.norm_k(heads(self.to_k(img)))], dim=1)
        v = torch.cat([heads(self.add_v_proj(txt)), heads(self.to_v(img))], dim=1)  # [B, T + N, H, Dh]
        q, k = apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype)
        out = attention(q.flatten(2), k.flatten(2), v.flatten(2), self.heads, mask=mask, upcast=self.upcast_attention)
        n_txt = txt.shape[1]
        return self.to_out[0](out[:, n_txt:]), self.to_add_out(out[:, :n_txt])


class GeluProj(nn.Module):
    """``net.0``: Linear then tanh-approximated GELU."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(dim, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """``net.0.proj`` -> GELU(tanh) -> ``net.2`` (``net.1`` is the reference's dropout)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.ModuleList([GeluProj(dim, hidden), nn.Identity(), nn.Linear(hidden, dim)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.net:
            x = layer(x)
        return x


def _per_token(params: Tensor, split: int | None, n: int) -> Tensor:
    """Modulation parameters [B, 3D] (or [2B, 3D] with ``split``: the sampling timestep's rows,
    then timestep 0's) as [B, 1 or n, 3D]: with ``split`` the first ``split`` tokens take the
    former, the rest (reference tokens) the latter."""
    if split is None:
        return params[:, None]
    now, zero = params.chunk(2, dim=0)
    b = now.shape[0]
    return torch.cat([now[:, None].expand(b, split, -1), zero[:, None].expand(b, n - split, -1)], dim=1)


def _modulate(x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
    """(x·(1 + scale) + shift, gate) for params [B, 1 | N, 3D] = (shift, scale, gate)."""
    shift, scale, gate = params.chunk(3, dim=-1)
    return torch.addcmul(shift, x, 1 + scale), gate


def _clip_fp16(x: Tensor) -> Tensor:
    """fp16 overflow pulled back into range after each block (diffusers' Qwen-Image does it)."""
    return x.clip(-65504, 65504) if x.dtype == torch.float16 else x


class QwenImageBlock(nn.Module):
    """One double-stream block: AdaLN-modulated attention then MLP, per stream, gated residuals."""

    def __init__(self, cfg: QwenImageConfig):
        super().__init__()
        d = cfg.dim
        self.img_mod = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.txt_mod = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.attn = JointAttention(d, cfg.heads)
        self.img_mlp = FeedForward(d, cfg.mlp_hidden)
        self.txt_mlp = FeedForward(d, cfg.mlp_hidden)

    def forward(self, img: Tensor, txt: Tensor, temb: Tensor, cos: Tensor, sin: Tensor,
                zero_split: int | None = None, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """img [B, N, D], txt [B, T, D], temb [B, D] (or [2B, D] with ``zero_split``: the
        timestep-zero embedding after it, for the reference tokens from ``zero_split`` on);
        ``mask`` [B, 1, 1, T + N] boolean, False for padded text keys."""
        img_mod1, img_mod2 = _per_token(self.img_mod(temb), zero_split, img.shape[1]).chunk(2, dim=-1)
        txt_temb = temb if zero_split is None else temb.chunk(2, dim=0)[0]
        txt_mod1, txt_mod2 = self.txt_mod(txt_temb)[:, None].chunk(2, dim=-1)  # [B, 1, 3D] each

        img_in, img_gate = _modulate(_layer_norm(img), img_mod1)
        txt_in, txt_gate = _modulate(_layer_norm(txt), txt_mod1)
        img_attn, txt_attn = self.attn(img_in, txt_in, cos, sin, mask)
        img = img + img_gate * img_attn
        txt = txt + txt_gate * txt_attn

        img_in, img_gate = _modulate(_layer_norm(img), img_mod2)
        img = torch.addcmul(img, img_gate, self.img_mlp(img_in))
        txt_in, txt_gate = _modulate(_layer_norm(txt), txt_mod2)
        txt = torch.addcmul(txt, txt_gate, self.txt_mlp(txt_in))
        return _clip_fp16(img), _clip_fp16(txt)


class NormOut(nn.Module):
    """``norm_out``: LayerNorm scaled and shifted by the timestep embedding; its Linear emits
    (scale, shift) in that order."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        scale, shift = self.linear(F.silu(temb))[:, None].chunk(2, dim=-1)  # [B, 1, D] each
        return torch.addcmul(shift, _layer_norm(x), 1 + scale)


# ---------------------------------------------------------------------------------------------
# the model


def _frames_out(t: Tensor, what: str) -> Tensor:
    """A 5-D one-frame latent [B, C, 1, H, W] as [B, C, H, W]; a 4-D one as it is."""
    if t.ndim == 5:
        if t.shape[2] != 1:
            raise ValueError(f"Qwen-Image: the {what} has {t.shape[2]} frames; an image model takes one")
        return t[:, :, 0]
    if t.ndim != 4:
        raise ValueError(f"Qwen-Image: the {what} is {tuple(t.shape)}; expected [B, C, H, W] or [B, C, 1, H, W]")
    return t


class QwenImage(nn.Module):
    """x [B, C, H, W] or [B, C, 1, H, W], timestep σ [B], context [B, T, context_dim],
    ref_latents: reference latents (each [1 or B, C, (1,) h, w], in the model's latent space),
    skip: indices of blocks to leave out, txt_mask [B, T] (1 = a text token, 0 = padding, which
    no token attends to) -> velocity in x's shape (see the module docstring)."""

    # the timestep embedder and the output AdaLN run on one vector per sample (f32 costs little
    # and keeps σ·1000 exact under half storage); the per-head q / k norms' weights are a few
    # hundred values each, and fp8 storage would distort every attention logit through them
    keep_f32: tuple[str, ...] = ("time_text_embed", "norm_out", "txt_norm", "*.norm_q", "*.norm_k",
                                 "*.norm_added_q", "*.norm_added_k")
    keep_f32_inputs: tuple[str, ...] = ("timestep",)

    def __init__(self, cfg: QwenImageConfig):
        super().__init__()
        if sum(cfg.axes_dims) != cfg.head_dim or any(d % 2 for d in cfg.axes_dims):
            raise ValueError(f"Qwen-Image: RoPE axes {cfg.axes_dims} must be even and fill the head width "
                             f"{cfg.head_dim}")
        self.cfg = cfg
        d = cfg.dim
        self.img_in = nn.Linear(cfg.in_channels * PATCH * PATCH, d)
        self.txt_norm = RMSNorm(cfg.context_dim)
        self.txt_in = nn.Linear(cfg.context_dim, d)
        self.time_text_embed = TimeTextEmbed(d)
        self.transformer_blocks = nn.ModuleList(QwenImageBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = NormOut(d)
        self.proj_out = nn.Linear(d, PATCH * PATCH * cfg.out_channels)

    def forward(self, x: Tensor, timestep: Tensor, context: Tensor, ref_latents: Sequence[Tensor] = (),
                ref_method: str | None = None, skip: Collection[int] = (),
                txt_mask: Tensor | None = None) -> Tensor:
        method = ref_method or self.cfg.default_ref_method
        if method not in REF_METHODS:
            raise ValueError(f"Qwen-Image: reference_latents_method {method!r}; one of {', '.join(REF_METHODS)}")
        x4 = _frames_out(x, "latent")
        b, _, h, w = x4.shape
        refs = [_frames_out(r, "reference latent").to(x4.dtype) for r in ref_latents]
        tokens = [patchify(x4)] + [patchify(r.expand(b, -1, -1, -1) if r.shape[0] == 1 else r) for r in refs]
        n_img = tokens[0].shape[1]
        img = self.img_in(torch.cat(tokens, dim=1))  # [B, N + N_refs, D]
        txt = self.txt_in(self.txt_norm(context.to(img.dtype)))  # [B, T, D]

        positions = token_positions((h, w), [tuple(r.shape[-2:]) for r in refs], method, txt.shape[1], x.device)
        cos, sin = rope_angles(positions[None], self.cfg.axes_dims, self.cfg.rope_theta)  # [1, T + N', Dh/2]

        mask = None
        if txt_mask is not None and not bool(txt_mask.bool().all()):  # padded text: its keys masked out
            text_keys = txt_mask.bool().expand(b, -1)  # [B, T]
            keys = torch.cat([text_keys, text_keys.new_ones(b, img.shape[1])], dim=1)  # [B, T + N']
            mask = keys[:, None, None, :]  # [B, 1, 1, T + N']
        temb = self.time_text_embed(timestep, img.dtype)  # [B, D]
        zero_split = None
        if method == "index_timestep_zero" and refs:
            temb = torch.cat([temb, self.time_text_embed(torch.zeros_like(timestep), img.dtype)])  # [2B, D]
            zero_split = n_img
        for i, block in enumerate(self.transformer_blocks):
            if i not in skip:  # skip-layer guidance: a left-out block passes both streams through
                img, txt = block(img, txt, temb, cos, sin, zero_split, mask)
        temb = temb[:b]
        out = self.proj_out(self.norm_out(img[:, :n_img], temb))  # [B, N, p·p·C]
        out = unpatchify(out, h, w)  # [B, C, H, W]
        return out[:, :, None] if x.ndim == 5 else out
