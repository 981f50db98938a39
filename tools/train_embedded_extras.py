"""Train a LoRA and a ControlNet for the embedded model (on a CPU, minutes each).

* ``lora``: `mixgraph-shapes-night.safetensors` (kohya keys, rank 4, on the UNet's transformer
  Linear layers): the model paints every background black, whatever colour the prompt names.
  At strength 0 the picture is the base model's; the pixel check reads "black" at strength 1.
* ``controlnet``: `mixgraph-shapes-mask.safetensors` (LDM ControlNet layout, ``control_model.*``),
  a trainable copy of the UNet's encoder initialised from it, steered by a mask image (white
  where the shape goes, black elsewhere): the shape is drawn where the mask is.

Both go to ``nodes/models/data/models/{loras,controlnet}/`` (listed in every models folder).
The base model stays frozen; only the LoRA / ControlNet weights train, seeded, with the same
objective (v or epsilon, as the base file says) and schedule as ``train_embedded.py``.

    PYTHONPATH=. python tools/train_embedded_extras.py lora
    PYTHONPATH=. python tools/train_embedded_extras.py controlnet
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import train_embedded as T
from mixgraph.nodes.models import shapes as S
from mixgraph.nodes.encoders.clip import CLIPTextModel
from mixgraph.nodes.adapters.controlnet import ControlNetConfig, ControlNetModel
from mixgraph.nodes.families.sd.unet import UNetModel, SpatialTransformer
from mixgraph.nodes.vae.vae import AutoencoderKL
from mixgraph.nodes.payloads.conditioning import Control

DATA = T.ROOT / "nodes" / "models" / "data" / "models"
LORA_OUT = DATA / "loras" / "mixgraph-shapes-night.safetensors"
CONTROLNET_OUT = DATA / "controlnet" / "mixgraph-shapes-mask.safetensors"


def load_base(path: Path):
    sd = {k: v.float() for k, v in load_file(str(path)).items()}
    Schedule.v = "v_pred" in sd  # the base model's prediction type, as loaders read it

    def sub(prefix: str) -> dict:
        return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}

    unet, clip, vae = UNetModel(T.UNET), CLIPTextModel(T.CLIP), AutoencoderKL(T.VAE)
    unet.load_state_dict(sub("model.diffusion_model."))
    clip.load_state_dict(sub("cond_stage_model.transformer."), strict=False)
    vae.load_state_dict(sub("first_stage_model."))
    for m in (unet, clip, vae):
        m.requires_grad_(False).eval()
    return unet, clip, vae


class Schedule:
    """SD1's discrete schedule; `noisy` returns (x_t, t, target): eps, or v for a v model."""

    v = True

    def __init__(self) -> None:
        betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
        self.abar = torch.cumprod(1 - betas, 0).float()
        snr = self.abar / (1 - self.abar)
        self.weight = torch.clamp(snr, max=5.0) / (snr + 1 if self.v else snr)

    def noisy(self, x0: torch.Tensor, gen: torch.Generator):
        t = torch.randint(0, 1000, (x0.shape[0],), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = self.abar[t][:, None, None, None]
        target = a.sqrt() * noise - (1 - a).sqrt() * x0 if self.v else noise
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, target


def pictures(scenes: list[S.Scene], rng: random.Random, **override) -> torch.Tensor:
    pics = np.stack([S.render(S.Scene(**{**s.__dict__, **override}), random.Random(rng.random())) for s in scenes])
    return torch.from_numpy(pics).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def mask_of(scenes: list[S.Scene], rng_seeds: list[float]) -> torch.Tensor:
    """White shape on black, [B, 3, 64, 64] in 0..1, drawn with the same jitter as the picture."""
    out = []
    for s, r in zip(scenes, rng_seeds):
        img = S.render(S.Scene("white", s.shape, s.size, s.position, "black"), random.Random(r))
        out.append(img)
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 255.0


# ----------------------------------------------------------------------------------------------


def train_lora(args) -> None:
    unet, clip, vae = load_base(args.base)
    targets = {}
    for name, module in unet.named_modules():
        if isinstance(module, SpatialTransformer):
            for sub, lin in module.named_modules():
                if isinstance(lin, torch.nn.Linear):
                    targets[f"{name}.{sub}"] = lin
    gen = torch.Generator().manual_seed(args.seed)
    adapters = {}
    for name, lin in targets.items():
        down = torch.nn.Parameter(torch.randn(args.rank, lin.in_features, generator=gen) / lin.in_features ** 0.5)
        up = torch.nn.Parameter(torch.zeros(lin.out_features, args.rank))
        adapters[name] = (down, up)
        lin.register_forward_hook(lambda m, inp, out, d=down, u=up: out + (inp[0] @ d.t()) @ u.t())
    params = [p for pair in adapters.values() for p in pair]
    opt = torch.optim.Adam(params, lr=args.lr)
    sched, tokens = Schedule(), T.Tokens()
    t0 = time.time()
    acc = 0.0
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 7 + step)
        scenes = [S.random_scene(rng) for _ in range(args.batch)]
        scenes = [s if s.color != "black" else S.Scene("white", *list(s.__dict__.values())[1:]) for s in scenes]
        with torch.no_grad():
            x0 = vae.quant_conv(vae.encoder(pictures(scenes, rng, background="black")))[:, :4] * T.LATENT_SCALE
            context, _ = clip(tokens([T.random_caption(s, rng) for s in scenes]), None, norm_hidden=True,
                              project_pooled=False)
        xt, t, noise = sched.noisy(x0, gen)
        loss = ((unet(xt, t, context) - noise).pow(2).mean(dim=(1, 2, 3)) * sched.weight[t]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc += loss.item()
        if step % 25 == 0:
            print(f"lora step {step}/{args.steps}  loss {acc / 25:.4f}  {time.time() - t0:.0f}s", flush=True)
            acc = 0.0
    sd = {}
    for name, (down, up) in adapters.items():
        key = "lora_unet_" + name.replace(".", "_")
        sd[f"{key}.lora_down.weight"] = down.detach().to(torch.float16).contiguous()
        sd[f"{key}.lora_up.weight"] = up.detach().to(torch.float16).contiguous()
        sd[f"{key}.alpha"] = torch.tensor(float(args.rank), dtype=torch.float16)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(args.out), metadata={"format": "pt", "mixgraph.description":
                                          "LoRA for mixgraph-shapes: every background black."})
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB) in {(time.time() - t0) / 60:.1f} min")


def train_controlnet(args) -> None:
    unet, clip, vae = load_base(args.base)
    torch.manual_seed(args.seed)
    cn = ControlNetModel(ControlNetConfig(unet=T.UNET, hint_channels=3, hint_block_channels=(16, 32, 64, 64)))
    own = cn.state_dict()
    own.update({k: v for k, v in unet.state_dict().items() if k in own and own[k].shape == v.shape})
    cn.load_state_dict(own)
    with torch.no_grad():  # zero convs and the hint block's last conv start at zero (ControlNet's init)
        for m in [*cn.zero_convs, cn.middle_block_out]:
            m[0].weight.zero_()
            m[0].bias.zero_()
        cn.input_hint_block[-1].weight.zero_()
        cn.input_hint_block[-1].bias.zero_()
    opt = torch.optim.Adam(cn.parameters(), lr=args.lr)
    sched, tokens = Schedule(), T.Tokens()
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    acc = 0.0
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 11 + step)
        scenes = [S.random_scene(rng) for _ in range(args.batch)]
        seeds = [rng.random() for _ in scenes]
        pics = np.stack([S.render(s, random.Random(r)) for s, r in zip(scenes, seeds)])
        x = torch.from_numpy(pics).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        hint = mask_of(scenes, seeds)
        with torch.no_grad():
            x0 = vae.quant_conv(vae.encoder(x))[:, :4] * T.LATENT_SCALE
            caps = [T.random_caption(s, rng) if rng.random() < 0.3 else
                    S.caption(s, position=False, size=rng.random() < 0.5) for s in scenes]
            context, _ = clip(tokens(caps), None, norm_hidden=True, project_pooled=False)
        xt, t, noise = sched.noisy(x0, gen)
        res = cn(xt, hint, t, context)
        pred = unet(xt, t, context, control=Control(input=res[:-1], middle=res[-1]))
        loss = ((pred - noise).pow(2).mean(dim=(1, 2, 3)) * sched.weight[t]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc += loss.item()
        if step % 25 == 0:
            print(f"controlnet step {step}/{args.steps}  loss {acc / 25:.4f}  {time.time() - t0:.0f}s", flush=True)
            acc = 0.0
    sd = {"control_model." + k: v.detach().to(torch.float16).contiguous() for k, v in cn.state_dict().items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(args.out), metadata={"format": "pt", "mixgraph.description":
                                          "ControlNet for mixgraph-shapes: the shape goes where the mask is white."})
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB) in {(time.time() - t0) / 60:.1f} min")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("lora", "controlnet"))
    p.add_argument("--base", type=Path, default=S.EMBEDDED_CHECKPOINT)
    p.add_argument("--out", type=Path)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.what == "lora":
        args.out = args.out or LORA_OUT
        args.steps, args.lr = args.steps or 300, args.lr or 1e-3
        train_lora(args)
    else:
        args.out = args.out or CONTROLNET_OUT
        args.steps, args.lr = args.steps or 400, args.lr or 3e-4
        train_controlnet(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
