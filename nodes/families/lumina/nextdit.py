"""NextDiT: the single-stream flow transformer of Lumina Image 2.0 and Z-Image (ComfyUI's
``comfy/ldm/lumina/model.py`` ``NextDiT``; Lumina-Image-2.0, arXiv:2503.21758; Z-Image's S3-DiT,
arXiv:2511.22699).

Text and image tokens are one sequence. The caption (the text encoder's hidden states) is
RMS-normed and projected (``cap_embedder``) and refined alone (``context_refiner``, no timestep);
the latent is cut into 2 x 2 patches (``x_embedder``) and refined alone (``noise_refiner``,
timestep-modulated); then both run jointly through ``layers`` and the image tokens are projected
back (``final_layer``). Position is a 3-axis rotary embedding over (caption index, row, column):
caption token i sits at (i + 1, 0, 0), every image token at (L + 1, row, col) for a caption of L
tokens, as ComfyUI places them (the reference implementations count from 0; RoPE sees only the
differences, which are the same).

Z-Image is the same model with other settings (``NextDiTConfig``): its blocks take the timestep
embedding without a SiLU (``z_image_modulation``), its timestep is scaled by 1000, its RoPE base
is 256, and it pads the caption and the image tokens to a multiple of 32 with learned tokens
(``cap_pad_token``, ``x_pad_token``); ComfyUI numbers caption pads on after the caption and puts
image pads at (0, 0, 0).

Conventions are ComfyUI's: ``forward(x, timesteps, context, attention_mask)`` takes
``timesteps`` = σ (the flow time, multiplier 1) and feeds the network 1 − σ (what the model was
trained on: 0 = noise, 1 = data), and returns the negated network output, the velocity ε − x0 of
ComfyUI's CONST parameterisation. Attribute names are ComfyUI's checkpoint keys.

``attention_mask`` [B, T] (1 = a caption token, 0 = padding) drops the padded caption tokens: they
take no position and no part in attention, as in Lumina-Image-2.0's code and diffusers'
``Lumina2Transformer2DModel``. (ComfyUI's current NextDiT ignores the mask; its own Gemma and Qwen
tokenizers never pad a single prompt, so its conds carry no padding and the two agree.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixgraph.nodes.models.attention import attention

__all__ = ["NextDiTConfig", "NextDiT", "RMSNorm", "rope_frequencies", "timestep_embedding"]


@dataclass(frozen=True)
class NextDiTConfig:
    """Sizes from the weights' shapes (``detect.py``); the settings shapes cannot show (RoPE axes
    and base, timestep scale) are the family's."""

    in_channels: int = 16
    patch: int = 2
    dim: int = 2304
    heads: int = 24
    kv_heads: int = 8
    depth: int = 26
    refiner_depth: int = 2
    ffn_hidden: int = 9216
    cap_feat_dim: int = 2304
    t_hidden: int = 1024  # t_embedder.mlp.0's width
    t_width: int = 1024  # the timestep embedding the blocks are modulated by (t_embedder.mlp.2's width)
    freq_dim: int = 256  # sinusoidal timestep features
    axes_dims: tuple[int, int, int] = (32, 32, 32)  # RoPE dims per axis (caption index, row, col)
    rope_theta: float = 10000.0
    time_scale: float = 1.0
    z_image_modulation: bool = False
    pad_tokens_multiple: int | None = None
    norm_eps: float = 1e-5
    has_norm_final: bool = False  # Lumina 2 files carry an unused ``norm_final.weight``

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal features [cos, sin] (DiT's ``TimestepEmbedder``), float32 [N, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]  # [N, half]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [N, 2*half]
    return F.pad(emb, (0, dim % 2))


def rope_frequencies(positions: Tensor, axes_dims: tuple[int, ...], theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [B, T, head_dim / 2] of the rotary embedding of ``positions`` [B, T, axes]: each
    axis a rotates its own ``axes_dims[a]`` channels (ComfyUI's ``EmbedND``; angles in float64)."""
    angles = []
    for a, d in enumerate(axes_dims):
        omega = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
        angles.append(positions[..., a, None].double() * omega)  # [B, T, d/2]
    angle = torch.cat(angles, dim=-1)  # [B, T, head_dim/2]
    return angle.cos().float(), angle.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each channel pair (x[2i], x[2i+1]) of x [B, T, H, Dh] by its angle, in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, T, H, Dh/2, 2]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, :, None], sin[:, :, None]  # [B, T, 1, Dh/2]
    out = torch.stack([c * x0 - s * x1, s * x0 + c * x1], dim=-1)  # [B, T, H, Dh/2, 2]
    return out.flatten(-2).to(x.dtype)


def clamp_fp16(x: Tensor) -> Tensor:
    """fp16 overflow (inf / nan) pulled back into range, where ComfyUI's NextDiT does it: after
    each attention and feed-forward branch (Z-Image runs in fp16 only so)."""
    if x.dtype == torch.float16:
        return torch.nan_to_num(x, nan=0.0, posinf=65504.0, neginf=-65504.0)
    return x


class RMSNorm(nn.Module):
    """x / rms(x) · weight, statistics in float32 (the weight is used in the input's dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight.to(x.dtype)


class JointAttention(nn.Module):
    """Self-attention with grouped key/value heads, RMS-normed queries and keys, and RoPE. The
    q / k norms use ``norm_eps`` (1e-5) as the reference implementations and diffusers do;
    ComfyUI's use the dtype's epsilon, a difference of about 1e-5 relative."""

    upcast_attention = False  # apply_precision sets it for fp16 policies that ask

    def __init__(self, cfg: NextDiTConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.dim, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.out = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=-1)
        q = apply_rope(self.q_norm(q.view(b, t, self.heads, self.head_dim)), cos, sin)  # [B, T, H, Dh]
        k = apply_rope(self.k_norm(k.view(b, t, self.kv_heads, self.head_dim)), cos, sin)  # [B, T, Hkv, Dh]
        v = v.view(b, t, self.kv_heads, self.head_dim)
        rep = self.heads // self.kv_heads  # query head h reads key/value head h // rep
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)  # [B, T, H, Dh]
        out = attention(q.flatten(2), k.flatten(2), v.flatten(2), self.heads, upcast=self.upcast_attention)
        return self.out(out)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) · w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(clamp_fp16(F.silu(self.w1(x)) * self.w3(x)))


class JointTransformerBlock(nn.Module):
    """Sandwich-normed attention and feed-forward; with ``modulated`` the timestep embedding
    scales each branch's input (1 + scale) and gates its output (tanh(gate))."""

    def __init__(self, cfg: NextDiTConfig, modulated: bool):
        super().__init__()
        self.attention = JointAttention(cfg)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_hidden)
        self.attention_norm1 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm1 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention_norm2 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm2 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.modulated = modulated
        if modulated:  # Z-Image feeds the embedding straight in, Lumina 2 through a SiLU
            linear = nn.Linear(cfg.t_width, 4 * cfg.dim)
            layers = (linear,) if cfg.z_image_modulation else (nn.SiLU(), linear)
            self.adaLN_modulation = nn.Sequential(*layers)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, t_emb: Tensor | None = None) -> Tensor:
        if not self.modulated:
            x = x + self.attention_norm2(clamp_fp16(self.attention(self.attention_norm1(x), cos, sin)))
            return x + self.ffn_norm2(self.feed_forward(self.ffn_norm1(x)))
        scale_msa, gate_msa, scale_mlp, gate_mlp = self.adaLN_modulation(t_emb)[:, None].chunk(4, dim=-1)  # [B, 1, D]
        h = clamp_fp16(self.attention(self.attention_norm1(x) * (1 + scale_msa), cos, sin))
        x = x + gate_msa.tanh() * self.attention_norm2(h)
        h = clamp_fp16(self.feed_forward(self.ffn_norm1(x) * (1 + scale_mlp)))
        return x + gate_mlp.tanh() * self.ffn_norm2(h)


class FinalLayer(nn.Module):
    """LayerNorm scaled by the timestep embedding, then the patch projection."""

    def __init__(self, cfg: NextDiTConfig):
        super().__init__()
        self.norm_final = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(cfg.dim, cfg.patch * cfg.patch * cfg.in_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(cfg.t_width, cfg.dim))

    def forward(self, x: Tensor, t_emb: Tensor) -> Tensor:
        scale = self.adaLN_modulation(t_emb)[:, None]  # [B, 1, D]
        return self.linear(self.norm_final(x) * (1 + scale))


class TimestepEmbedder(nn.Module):
    def __init__(self, cfg: NextDiTConfig):
        super().__init__()
        self.freq_dim = cfg.freq_dim
        self.mlp = nn.Sequential(nn.Linear(cfg.freq_dim, cfg.t_hidden), nn.SiLU(), nn.Linear(cfg.t_hidden, cfg.t_width))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, self.freq_dim))


class NextDiT(nn.Module):
    """x [B, C, H, W], timesteps σ [B], context [B, T, cap_feat_dim], attention_mask [B, T] or
    None -> velocity [B, C, H, W] (see the module docstring)."""

    keep_f32 = ("t_embedder",)  # a few thousand weights whose input is the exact timestep
    keep_f32_inputs = ("timesteps",)  # 1 − σ in bf16 would move the timestep

    def __init__(self, cfg: NextDiTConfig):
        super().__init__()
        if sum(cfg.axes_dims) != cfg.head_dim:
            raise ValueError(f"NextDiT: RoPE axes {cfg.axes_dims} do not fill the head width {cfg.head_dim}")
        self.cfg = cfg
        self.x_embedder = nn.Linear(cfg.patch * cfg.patch * cfg.in_channels, cfg.dim)
        self.noise_refiner = nn.ModuleList(JointTransformerBlock(cfg, modulated=True) for _ in range(cfg.refiner_depth))
        self.context_refiner = nn.ModuleList(JointTransformerBlock(cfg, modulated=False)
                                             for _ in range(cfg.refiner_depth))
        self.t_embedder = TimestepEmbedder(cfg)
        self.cap_embedder = nn.Sequential(RMSNorm(cfg.cap_feat_dim, cfg.norm_eps), nn.Linear(cfg.cap_feat_dim, cfg.dim))
        self.layers = nn.ModuleList(JointTransformerBlock(cfg, modulated=True) for _ in range(cfg.depth))
        if cfg.has_norm_final:  # stored by Lumina 2, used by no implementation
            self.norm_final = RMSNorm(cfg.dim, cfg.norm_eps)
        self.final_layer = FinalLayer(cfg)
        if cfg.pad_tokens_multiple is not None:
            self.x_pad_token = nn.Parameter(torch.zeros(1, cfg.dim))
            self.cap_pad_token = nn.Parameter(torch.zeros(1, cfg.dim))

    def forward(self, x: Tensor, timesteps: Tensor, context: Tensor | None,
                attention_mask: Tensor | None = None) -> Tensor:
        t_emb = self.t_embedder((1.0 - timesteps.float()) * self.cfg.time_scale)  # [B, t_width]
        if context is None:
            if self.cfg.pad_tokens_multiple is None:
                raise ValueError("Lumina 2 needs a text conditioning (no caption tokens were given)")
            cap = None
        else:
            cap = self.cap_embedder(context)  # [B, T, D]
        if attention_mask is None or cap is None or bool(attention_mask.bool().all()):
            return -self._run(x, t_emb, cap)
        keep = attention_mask.bool()
        if bool((keep == keep[:1]).all()) and keep[0].any():  # one caption (a batch of images): one call
            return -self._run(x, t_emb, cap[:, keep[0]])
        outs = []
        for i in range(x.shape[0]):  # padded captions differ in length: one sample at a time
            tokens = cap[i:i + 1, keep[i]] if keep[i].any() else cap[i:i + 1, :1]  # [1, L_i, D]
            outs.append(self._run(x[i:i + 1], t_emb[i:i + 1], tokens))
        return -torch.cat(outs)

    def _pad(self, tokens: Tensor, pad_token: Tensor) -> Tensor:
        """Tokens [B, L, D] padded with ``pad_token`` to a multiple of ``pad_tokens_multiple``."""
        extra = (-tokens.shape[1]) % self.cfg.pad_tokens_multiple
        pad = pad_token.to(tokens.dtype)[None].expand(tokens.shape[0], extra, -1)  # [B, extra, D]
        return torch.cat([tokens, pad], dim=1)

    def _run(self, x: Tensor, t_emb: Tensor, cap: Tensor | None) -> Tensor:
        """The network on captions of one length; returns its raw output [B, C, H, W]."""
        cfg, p = self.cfg, self.cfg.patch
        b, c, h, w = x.shape
        x = F.pad(x, (0, (-w) % p, 0, (-h) % p), mode="circular")  # ComfyUI's pad_to_patch_size
        gh, gw = x.shape[2] // p, x.shape[3] // p
        patches = x.view(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2)  # [B, N, p·p·C]
        img = self.x_embedder(patches)  # [B, N, D]
        n = img.shape[1]
        if cap is None:  # Z-Image without text: one block of caption pad tokens
            cap = self.cap_pad_token.to(img.dtype)[None].expand(b, cfg.pad_tokens_multiple, -1)
        elif cfg.pad_tokens_multiple is not None:
            cap = self._pad(cap, self.cap_pad_token)
        if cfg.pad_tokens_multiple is not None:
            img = self._pad(img, self.x_pad_token)
        n_cap = cap.shape[1]
        dev = x.device
        cap_pos = torch.zeros(b, n_cap, 3, device=dev)
        cap_pos[..., 0] = torch.arange(1, n_cap + 1, device=dev)
        img_pos = torch.zeros(b, img.shape[1], 3, device=dev)  # pad tokens stay at (0, 0, 0)
        img_pos[:, :n, 0] = n_cap + 1
        img_pos[:, :n, 1] = torch.arange(gh, device=dev).repeat_interleave(gw)  # row of each patch
        img_pos[:, :n, 2] = torch.arange(gw, device=dev).repeat(gh)  # column of each patch
        cap_rope = rope_frequencies(cap_pos, cfg.axes_dims, cfg.rope_theta)
        img_rope = rope_frequencies(img_pos, cfg.axes_dims, cfg.rope_theta)

        for block in self.context_refiner:
            cap = block(cap, *cap_rope)
        for block in self.noise_refiner:
            img = block(img, *img_rope, t_emb)
        tokens = torch.cat([cap, img], dim=1)  # [B, n_cap + N', D]
        rope = tuple(torch.cat(pair, dim=1) for pair in zip(cap_rope, img_rope))
        for block in self.layers:
            tokens = block(tokens, *rope, t_emb)
        out = self.final_layer(tokens[:, n_cap:n_cap + n], t_emb)  # [B, N, p·p·C]
        out = out.view(b, gh, gw, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, gh * p, gw * p)  # [B, C, H', W']
        return out[:, :, :h, :w]
