"""SD outputs across commits, bit for bit: what a restructuring must leave unchanged.

    PYTHONPATH=CHECKOUT MIXGRAPH_CPU_FLAGS="sse4_2 avx avx2 fma" \\
        python tools/bitcheck.py run MODELS_DIR OUT.pt       # in each checkout (same models dir)
    python tools/bitcheck.py compare BEFORE.pt AFTER.pt      # "60/60 bit-identical" or the cases

`run` writes seeded tiny checkpoints (tests/fixtures: SD1.5, SD1.5 inpaint, SD2 v-prediction,
SDXL, SDXL refiner) into MODELS_DIR/checkpoints once, then samples each of them and the embedded
model with five samplers (euler, dpmpp_2m/karras, euler_ancestral, dpmpp_sde, uni_pc), in f32 and
in a `[bf16]` region, at 64x64, batch 2, and saves the latents and decoded images. Pin the CPU
flags as the test suite does so `auto` resolves alike; compare only runs from the same CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

CHECKPOINTS = ("sd15.safetensors", "sd15inp.safetensors", "sd2v.safetensors", "sdxl.safetensors",
               "refiner.safetensors", "mixgraph-shapes.safetensors")
SAMPLERS = (("euler", "normal"), ("dpmpp_2m", "karras"), ("euler_ancestral", "simple"),
            ("dpmpp_sde", "normal"), ("uni_pc", "sgm_uniform"))


def _write_models(folder: Path) -> None:
    from tests.fixtures import checkpoints as C

    writers = {"sd15.safetensors": lambda p: C.write_sd15(p, seed=3),
               "sd15inp.safetensors": lambda p: C.write_sd15(p, seed=5, inpaint=True),
               "sd2v.safetensors": lambda p: C.write_sd2(p, v_prediction=True, seed=4),
               "sdxl.safetensors": lambda p: C.write_sdxl(p, seed=6),
               "refiner.safetensors": lambda p: C.write_sdxl_refiner(p, seed=7)}
    folder.mkdir(parents=True, exist_ok=True)
    for name, write in writers.items():
        if not (folder / name).exists():
            write(folder / name)


def run(models: Path, out: Path) -> None:
    from mixgraph.ui import api

    _write_models(models / "checkpoints")
    results = {}
    for ckpt in CHECKPOINTS:
        for sampler, scheduler in SAMPLERS:
            for region in (None, "bf16"):
                g = api.Graph()
                m = g.add("CheckpointLoaderSimple", ckpt_name=ckpt)
                pos = g.add("CLIPTextEncode", text="a red circle on a blue background", clip=m[1])
                neg = g.add("CLIPTextEncode", text="", clip=m[1])
                lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=2)
                ks = g.add("KSampler", model=m[0], seed=11, steps=4, cfg=5.0, sampler_name=sampler,
                           scheduler=scheduler, positive=pos[0], negative=neg[0], latent_image=lat[0],
                           denoise=1.0)
                dec = g.add("VAEDecode", samples=ks[0], vae=m[2])
                g.add("PreviewImage", images=dec[0])
                if region:
                    g.region("r", [ks], region)
                r = api.run(g.build(), models=str(models))
                key = f"{ckpt}|{sampler}|{scheduler}|{region}"
                results[key] = (r[ks.node_id][0].samples.clone(), r[dec.node_id][0].clone())
                print(key, f"{float(results[key][0].abs().mean()):.6f}")
    torch.save(results, out)


def compare(before: Path, after: Path) -> int:
    a, b = torch.load(before), torch.load(after)
    bad = [k for k in a if k not in b or not (torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]))]
    print(f"{len(a) - len(bad)}/{len(a)} bit-identical")
    print("\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        run(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
