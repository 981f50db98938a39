"""Train the embedded model (nodes/models/data/models/checkpoints/mixgraph-shapes.safetensors) on a CPU.

A tiny Stable Diffusion 1.x: the real architecture and single-file key layout (KL VAE under
``first_stage_model.``, CLIP text transformer on the real CLIP tokenizer under
``cond_stage_model.transformer.text_model.``, UNet with cross-attention under
``model.diffusion_model.``), trained on the procedurally drawn captioned pictures of
``mixgraph.nodes.models.shapes``. The loader finds every size from the tensor shapes, as for any
checkpoint; nothing in mixgraph knows this model is special.

Four phases, each resumable (state in ``--work``; a killed run started again with the same
arguments continues from the last saved step, with the same data stream):

1. VAE: reconstruction (L1 + MSE) and a small KL term on the 64x64 pictures. Afterwards the latent
   space is re-scaled exactly (quant_conv / post_quant_conv are 1x1 convs) so latents have mean 0
   and standard deviation 1/0.18215 per channel: what SD1's latent scale expects.
2. Encode a fixed set of training pictures (training-split attribute combinations only) once.
3. UNet + text encoder, jointly from scratch, on SD1's discrete schedule (scaled-linear betas
   0.00085..0.012, 1000 steps, so every ComfyUI sampler and scheduler applies) with
   v-prediction (the file carries the ``v_pred`` marker key, as ComfyUI writes it; loaders
   switch to v-prediction on it). An epsilon-predicting net this small must reproduce its noisy
   input almost exactly at the highest noise levels, where the picture's colours are decided; a
   v-predicting one predicts the picture there (``--prediction eps`` trains the former, with an
   added x0 error term). min-SNR-5 loss weighting, 10% empty captions (classifier-free guidance works), an
   exponential moving average of the weights is what gets saved.
4. At the same time, in a second process on the second core, the decoder alone trains on, the
   encoder frozen so the latents the UNet learns do not move, with the error along shape outlines
   weighted 5x: a shape's class is in its corners, a few pixels each (`refine_decoder`).

The text encoder is trained jointly rather than frozen: a random frozen transformer would have
to carry which colour belongs to the shape and which to the background through random mixing;
a trained one learns it in a few hundred steps for the cost of a 2-layer, 32-wide transformer.
Rows of the token embedding for words the captions never use are zeroed in the saved file.

Usage (from a checkout; prints its loss curve, logs it to WORK/loss.csv):

    PYTHONPATH=. python tools/train_embedded.py            # the shipped model's settings
    PYTHONPATH=. python tools/train_embedded.py --quick    # a smoke run in about a minute
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from mixgraph.nodes.models import shapes as S
from mixgraph.nodes.encoders.clip import CLIPTextConfig, CLIPTextModel
from mixgraph.nodes.encoders.tokenizer import END_TOKEN, CLIPTokenizer
from mixgraph.nodes.families.sd.unet import UNetConfig, UNetModel
from mixgraph.nodes.vae.vae import AutoencoderKL, VAEConfig

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "nodes" / "models" / "data" / "models" / "checkpoints" / "mixgraph-shapes.safetensors"
LATENT_SCALE = 0.18215  # SD1's

VAE = VAEConfig(ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1)
CLIP = CLIPTextConfig(vocab_size=49408, width=32, layers=2, heads=2, max_positions=77, intermediate=128,
                      projection_dim=None, activation="quick_gelu")
UNET = UNetConfig(model_channels=64, channel_mult=(1, 1), num_res_blocks=(1, 1), transformer_depth=(1, 1),
                  transformer_depth_output=(1, 1, 1, 1), transformer_depth_middle=1, context_dim=32, num_heads=8)


def log(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# data


def scene_batch(seed: int, n: int) -> tuple[list[S.Scene], torch.Tensor]:
    """n training-split scenes and their pictures [n, 3, 64, 64] in -1..1, from `seed` alone."""
    rng = random.Random(seed)
    scenes = [S.random_scene(rng) for _ in range(n)]
    pics = np.stack([S.render(s, rng) for s in scenes])  # [n, 64, 64, 3] uint8
    x = torch.from_numpy(pics).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return scenes, x


def random_caption(scene: S.Scene, rng: random.Random) -> str:
    """A caption of `scene` with optional parts left out at random; '' 10% of the time."""
    if rng.random() < 0.1:
        return ""
    return S.caption(scene, size=rng.random() < 0.7, position=rng.random() < 0.7,
                     background=rng.random() < 0.8)


class Tokens:
    """Captions -> [B, 77] ids exactly as CLIPTextEncode makes them for SD1 (pad = end token)."""

    def __init__(self) -> None:
        self.tok = CLIPTokenizer()
        self.cache: dict[str, list[int]] = {}

    def __call__(self, captions: list[str]) -> torch.Tensor:
        rows = []
        for c in captions:
            if c not in self.cache:
                chunks = self.tok.tokenize_with_weights(c, pad_token=END_TOKEN)
                self.cache[c] = [t for t, _ in chunks[0]]
            rows.append(self.cache[c])
        return torch.tensor(rows)

    def vocabulary_ids(self) -> set[int]:
        words = ["a", "an", "on", "background", *S.COLORS, *S.SHAPES, *S.SIZES, *S.POSITIONS]
        ids = {t for w in words for t in self.tok.encode(w)}
        return ids | {49406, END_TOKEN}


# ----------------------------------------------------------------------------------------------
# state


def zero_init_residuals(module: torch.nn.Module) -> None:
    """Zero the last layer of every residual branch (and the UNet's output conv), as LDM does for
    its UNet: each block starts as the identity, so a deep net trains like a shallow one first.
    Without it the 24-conv VAE decoder needs thousands of steps to reproduce flat colours."""
    from mixgraph.nodes.families.sd import unet as U
    from mixgraph.nodes.vae import vae as V

    zero = []
    for m in module.modules():
        if isinstance(m, V.ResnetBlock):
            zero.append(m.conv2)
        elif isinstance(m, V.AttnBlock):
            zero.append(m.proj_out)
        elif isinstance(m, U.ResBlock):
            zero.append(m.out_layers[3])
        elif isinstance(m, U.SpatialTransformer):
            zero.append(m.proj_out)
    if isinstance(module, U.UNetModel):
        zero.append(module.out[2])
    with torch.no_grad():
        for layer in zero:
            layer.weight.zero_()
            if layer.bias is not None:
                layer.bias.zero_()


def save_state(path: Path, **state) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def resume_state(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, phase: str) -> tuple[int, bool]:
    """Load a phase's saved state into `model` and `opt`, if there is one: (step, finished)."""
    if not path.exists():
        return 0, False
    st = torch.load(path, weights_only=False)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    if not st.get("done"):
        log(f"{phase}: resuming at step {st['step']}")
    return st["step"], bool(st.get("done"))


class LossLog:
    """A phase's loss curve: running means printed every `every` steps (with the rate and the
    time left) and appended to WORK/loss.csv as `phase,step,value,...`."""

    def __init__(self, phase: str, work: Path, every: int, total: int, first: int, names: tuple[str, ...]):
        self.phase, self.csv, self.every, self.total, self.first = phase, work / "loss.csv", every, total, first
        self.names, self.sums, self.n, self.t0 = names, [0.0] * len(names), 0, time.time()

    def add(self, step: int, lr: float, *values: float) -> None:
        self.sums = [a + v for a, v in zip(self.sums, values)]
        self.n += 1
        if step % self.every and step != self.total:
            return
        means = [a / self.n for a in self.sums]
        rate = (time.time() - self.t0) / max(1, step - self.first)
        shown = "  ".join(f"{k} {v:.4f}" for k, v in zip(self.names, means))
        log(f"{self.phase:<7} step {step:5d}/{self.total}  {shown}  lr {lr:.1e}  {rate:.2f}s/step, "
            f"eta {rate * (self.total - step) / 60:.1f} min")
        with open(self.csv, "a") as f:
            f.write(",".join([self.phase, str(step)] + [f"{v:.5f}" for v in means]) + "\n")
        self.sums, self.n = [0.0] * len(self.names), 0


def ema_update(ema: torch.nn.Module, model: torch.nn.Module, step: int, decay: float = 0.998) -> None:
    d = min(decay, (1 + step) / (10 + step))
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(d).add_(p.detach(), alpha=1 - d)


# ----------------------------------------------------------------------------------------------
# phase 1: VAE


def vae_losses(vae: AutoencoderKL, x: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    moments = vae.quant_conv(vae.encoder(x))
    mean, logvar = moments.chunk(2, dim=1)
    logvar = logvar.clamp(-30, 20)
    z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, generator=gen)
    y = vae.decoder(vae.post_quant_conv(z))
    rec = (y - x).abs().mean() + F.mse_loss(y, x)
    kl = 0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar).mean()
    return rec, kl


def train_vae(args, work: Path) -> AutoencoderKL:
    path = work / "vae.pt"
    torch.manual_seed(args.seed)
    vae = AutoencoderKL(VAE)
    zero_init_residuals(vae)
    with torch.no_grad():  # start with little posterior noise, or the decoder first sees mostly noise
        vae.quant_conv.bias[VAE.embed_dim:] = -6.0
    opt = torch.optim.Adam(vae.parameters(), lr=1e-3)
    step, done = resume_state(path, vae, opt, "vae")
    if done:
        return vae
    curve = LossLog("vae", work, args.log_every, args.vae_steps, step, ("rec", "kl"))
    while step < args.vae_steps:
        lr = args.vae_lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.vae_lr_steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        _, x = scene_batch(args.seed * 1_000_003 + step, args.vae_batch)
        gen = torch.Generator().manual_seed(args.seed + step)
        if args.vae_crop < S.IMAGE_SIZE:  # convolutions: a crop teaches the same at a fraction of the cost
            y0, x0 = (int(v) for v in torch.randint(0, S.IMAGE_SIZE - args.vae_crop + 1, (2,), generator=gen))
            x = x[:, :, y0:y0 + args.vae_crop, x0:x0 + args.vae_crop]
        rec, kl = vae_losses(vae, x, gen)
        (rec + 1e-4 * kl).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        curve.add(step, lr, rec.item(), kl.item())
        if step % args.save_every == 0:
            save_state(path, model=vae.state_dict(), opt=opt.state_dict(), step=step)
    normalise_latents(vae, args)
    save_state(path, model=vae.state_dict(), opt=opt.state_dict(), step=step, done=True)
    return vae


@torch.no_grad()
def normalise_latents(vae: AutoencoderKL, args) -> None:
    """Re-scale the latent space exactly: per channel mean 0, std 1/LATENT_SCALE."""
    _, x = scene_batch(args.seed + 777, 512)
    mean = vae.quant_conv(vae.encoder(x))[:, :4]
    mu = mean.mean(dim=(0, 2, 3))
    sd = mean.std(dim=(0, 2, 3))
    k = (1.0 / LATENT_SCALE) / sd  # new = (old - mu) * k
    qw, qb = vae.quant_conv.weight, vae.quant_conv.bias  # [8, 8, 1, 1]
    qw[:4] *= k[:, None, None, None]
    qb[:4] = (qb[:4] - mu) * k
    qb[4:] += 2 * torch.log(k)  # log-variance follows the scale
    pw, pb = vae.post_quant_conv.weight, vae.post_quant_conv.bias  # [4, 4, 1, 1]; old = new / k + mu
    pb += (pw[:, :, 0, 0] @ mu)
    pw /= k[None, :, None, None]
    rec = vae.decoder(vae.post_quant_conv(vae.quant_conv(vae.encoder(x[:64]))[:, :4]))
    psnr = -10 * math.log10(F.mse_loss((rec + 1) / 2, (x[:64] + 1) / 2).item())
    log(f"vae: latent mean {mu.tolist()} std {sd.tolist()} re-scaled; reconstruction PSNR {psnr:.1f} dB")


def edge_weighted_loss(vae: AutoencoderKL, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Reconstruction error with the pixels along the shape's outline weighted 5x: the class of
    a shape is in its corners (a triangle's tip, a square's corners), a few pixels each, which an
    unweighted loss leaves to the last steps."""
    with torch.no_grad():
        moments = vae.quant_conv(vae.encoder(x))
        mean, logvar = moments.chunk(2, dim=1)
        z = mean + torch.exp(0.5 * logvar.clamp(-30, 20)) * torch.randn(mean.shape, generator=gen)
        spread = F.max_pool2d(x, 3, 1, 1) + F.max_pool2d(-x, 3, 1, 1)  # local max - local min
        weight = 1.0 + 4.0 * (spread.abs().sum(dim=1, keepdim=True) > 0.1).float()
    y = vae.decoder(vae.post_quant_conv(z))
    err = (y - x).abs() + (y - x).pow(2)
    return (err * weight).mean() / weight.mean()


def refine_decoder(args, work: Path) -> AutoencoderKL:
    """Phase 3b, in a second process while the UNet trains (the UNet only needs the encoder's
    latents, which are fixed by now): more training of the decoder alone, the encoder frozen, so
    the latent space the UNet learns stays exactly the same. Sharp corners on the smallest shapes
    (2x2 latent cells) are what the decoder learns last; this buys it the steps for free on the
    second core."""
    torch.set_num_threads(args.threads)
    path = work / "decoder.pt"
    vae = AutoencoderKL(VAE)
    vae.load_state_dict(torch.load(work / "vae.pt", weights_only=False)["model"])
    trained = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    for m in (vae.encoder, vae.quant_conv):
        m.requires_grad_(False)
    opt = torch.optim.Adam(trained, lr=args.decoder_lr)
    step, done = resume_state(path, vae, opt, "decoder")
    if done:
        return vae
    curve = LossLog("decoder", work, args.log_every, args.decoder_steps, step, ("rec",))
    while step < args.decoder_steps:
        lr = args.decoder_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.decoder_steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        _, x = scene_batch(args.seed * 2_000_029 + 500_000 + step, args.vae_batch)
        rec = edge_weighted_loss(vae, x, torch.Generator().manual_seed(args.seed + 900_000 + step))
        rec.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        curve.add(step, lr, rec.item())
        if step % args.save_every == 0:
            save_state(path, model=vae.state_dict(), opt=opt.state_dict(), step=step)
    save_state(path, model=vae.state_dict(), opt=opt.state_dict(), step=step, done=True)
    return vae


# ----------------------------------------------------------------------------------------------
# phase 2 + 3: UNet and text encoder


@torch.no_grad()
def encode_dataset(vae: AutoencoderKL, args, work: Path) -> tuple[torch.Tensor, list[S.Scene]]:
    path = work / "latents.pt"
    if path.exists():
        st = torch.load(path, weights_only=False)
        return st["latents"], [S.Scene(*s) for s in st["scenes"]]
    lat, scenes = [], []
    chunk = 128
    for i in range(args.dataset // chunk):
        sc, x = scene_batch(args.seed * 7919 + 10_000_019 + i, chunk)
        lat.append(vae.quant_conv(vae.encoder(x))[:, :4] * LATENT_SCALE)
        scenes += sc
        if (i + 1) % 20 == 0:
            log(f"encode {len(scenes)}/{args.dataset} pictures  {time.time() - args.start:.0f}s")
    latents = torch.cat(lat)
    save_state(path, latents=latents, scenes=[tuple(s.__dict__.values()) for s in scenes])
    return latents, scenes


def train_unet(args, work: Path, latents: torch.Tensor, scenes: list[S.Scene]):
    path = work / "unet.pt"
    torch.manual_seed(args.seed + 1)
    unet, clip = UNetModel(UNET), CLIPTextModel(CLIP)
    zero_init_residuals(unet)
    with torch.no_grad():  # CLIP's own init: small token and position embeddings (nn.Embedding's
        # default N(0, 1) positions would drown the words: captions then barely change the output)
        clip.text_model.embeddings.token_embedding.weight.normal_(0, 0.02)
        clip.text_model.embeddings.position_embedding.weight.normal_(0, 0.01)
    ema_u, ema_c = UNetModel(UNET), CLIPTextModel(CLIP)
    ema_u.load_state_dict(unet.state_dict())
    ema_c.load_state_dict(clip.state_dict())
    params = list(unet.parameters()) + list(clip.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    step = 0
    if path.exists():
        st = torch.load(path, weights_only=False)
        for m, k in ((unet, "unet"), (clip, "clip"), (ema_u, "ema_unet"), (ema_c, "ema_clip")):
            m.load_state_dict(st[k])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        log(f"unet: resuming at step {step}")
    if step >= args.unet_steps:
        return ema_u, ema_c
    tokens = Tokens()
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    abar = torch.cumprod(1 - betas, 0).float()
    snr = abar / (1 - abar)
    if args.prediction == "v":
        weight = torch.clamp(snr, max=5.0) / (snr + 1)  # min-SNR-5 for v prediction
        x0_weight = torch.zeros_like(snr)
    else:
        weight = torch.clamp(snr, max=5.0) / snr  # min-SNR-5 for epsilon prediction
        # + the x0 error (= eps error / SNR, capped): at the highest noise levels an eps error is
        # amplified ~15x in x0, and that is where the picture's colours are decided
        x0_weight = args.x0_weight * torch.clamp(1.0 / snr, max=100.0)
    curve = LossLog("unet", work, args.log_every, args.unet_steps, step, ("loss",))
    while step < args.unet_steps:
        lr = args.lr * min(1.0, (step + 1) / 200)
        for g in opt.param_groups:
            g["lr"] = lr
        rng = random.Random(args.seed * 104_729 + step)
        gen = torch.Generator().manual_seed(args.seed * 31 + step)
        idx = torch.randint(0, len(latents), (args.batch,), generator=gen)
        x0 = latents[idx]
        ids = tokens([random_caption(scenes[i], rng) for i in idx.tolist()])
        t = torch.randint(0, 1000, (args.batch,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = abar[t][:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        context, _ = clip(ids, None, norm_hidden=True, project_pooled=False)
        pred = unet(xt, t, context)
        if args.prediction == "v":
            noise = a.sqrt() * noise - (1 - a).sqrt() * x0  # the target: v = sqrt(a) eps - sqrt(1-a) x0
        w = weight[t] + (x0_weight[t] if step >= args.x0_weight_from else 0.0)
        loss = ((pred - noise).pow(2).mean(dim=(1, 2, 3)) * w).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        ema_update(ema_u, unet, step)
        ema_update(ema_c, clip, step)
        curve.add(step, lr, loss.item())
        if step % args.save_every == 0 or step == args.unet_steps:
            save_state(path, unet=unet.state_dict(), clip=clip.state_dict(), ema_unet=ema_u.state_dict(),
                       ema_clip=ema_c.state_dict(), opt=opt.state_dict(), step=step)
    return ema_u, ema_c


# ----------------------------------------------------------------------------------------------
# the single file


def write_checkpoint(out: Path, unet: UNetModel, clip: CLIPTextModel, vae: AutoencoderKL, args) -> None:
    keep = torch.tensor(sorted(Tokens().vocabulary_ids()))
    sd: dict[str, torch.Tensor] = {}
    for k, v in unet.state_dict().items():
        sd["model.diffusion_model." + k] = v
    for k, v in vae.state_dict().items():
        sd["first_stage_model." + k] = v
    for k, v in clip.state_dict().items():
        if k.endswith("token_embedding.weight"):
            v = torch.zeros_like(v).index_copy(0, keep, v[keep])  # words never seen: zero vectors
        sd["cond_stage_model.transformer." + k] = v
    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in sd.items()}
    if args.prediction == "v":
        sd["v_pred"] = torch.tensor([])  # the marker key loaders (ComfyUI's, ours) read as v-prediction
    meta = {"format": "pt", "mixgraph.model": "mixgraph-shapes",
            "mixgraph.description": S.vocabulary_text(),
            "mixgraph.training": json.dumps({k: v for k, v in vars(args).items() if k not in ("start", "out", "work")}, default=str)}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out), metadata=meta)
    log(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def check_layout(out: Path, args) -> None:
    """The written file loads through the ordinary loader with the configs used for training."""
    from mixgraph.nodes.models.loader import load_checkpoint

    model, clip, vae = load_checkpoint(out)
    assert model.config == UNET, (model.config, UNET)
    want = "v_prediction" if args.prediction == "v" else "eps"
    assert model.prediction == want, (model.prediction, want)
    assert clip is not None and clip.encoder("clip_l").config == CLIP, (clip and clip.encoder("clip_l").config, CLIP)
    assert vae is not None and vae.config == VAE, (vae and vae.config, VAE)
    log("layout check: CheckpointLoaderSimple derives the training configs from the file")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--work", type=Path, default=ROOT / "build" / "train_embedded")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; 1 is fastest on a shared 2-core machine (more threads than free cores stall)")
    p.add_argument("--vae-steps", type=int, default=3600)
    p.add_argument("--vae-lr-steps", type=int, default=3600, help="length of the VAE's cosine LR schedule")
    p.add_argument("--vae-batch", type=int, default=8)
    p.add_argument("--vae-lr", type=float, default=1e-3)
    p.add_argument("--vae-crop", type=int, default=64,
                   help="VAE training crop size (pixels); below 64 the decoder's attention sees fewer\n                   positions than at use and full-size colours drift: crops reconstruct worse")
    p.add_argument("--dataset", type=int, default=12800, help="pictures encoded for the UNet phase")
    p.add_argument("--unet-steps", type=int, default=5400)
    p.add_argument("--decoder-steps", type=int, default=4000,
                   help="decoder-only steps, run in a second process while the UNet trains (0: none)")
    p.add_argument("--decoder-lr", type=float, default=5e-4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--prediction", choices=("v", "eps"), default="v")
    p.add_argument("--x0-weight", type=float, default=1.0, help="eps prediction: weight of the x0 error term")
    p.add_argument("--x0-weight-from", type=int, default=500, help="UNet step the x0 term starts at")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="a smoke run: a few steps of each phase")
    p.add_argument("--init-only", action="store_true", help="write the untrained checkpoint and stop")
    args = p.parse_args(argv)
    if args.quick:
        args.vae_steps, args.dataset, args.unet_steps, args.log_every, args.save_every = 20, 256, 20, 5, 10
        args.decoder_steps = 10
    torch.set_num_threads(args.threads)
    args.start = time.time()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.init_only:
        torch.manual_seed(args.seed)
        write_checkpoint(args.out, UNetModel(UNET), CLIPTextModel(CLIP), AutoencoderKL(VAE), args)
        check_layout(args.out, args)
        return 0
    log(f"training the embedded model: {args.threads} threads, work dir {args.work}")
    vae = train_vae(args, args.work)
    latents, scenes = encode_dataset(vae, args, args.work)
    second = None
    if args.decoder_steps:  # the decoder refines on the second core while the UNet trains
        import multiprocessing

        second = multiprocessing.get_context("spawn").Process(target=refine_decoder, args=(args, args.work))
        second.start()
    unet, clip = train_unet(args, args.work, latents, scenes)
    if second is not None:
        second.join()
        if second.exitcode != 0:
            raise SystemExit(f"the decoder phase failed (exit code {second.exitcode}); run again to resume it")
        vae = refine_decoder(args, args.work)  # done: loads the refined decoder
    write_checkpoint(args.out, unet, clip, vae, args)
    check_layout(args.out, args)
    log(f"done in {(time.time() - args.start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
