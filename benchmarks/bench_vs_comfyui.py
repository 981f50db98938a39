"""Seconds per SD 1.5 UNet step: mixgraph's precisions against ComfyUI's CPU default, in one run.

Issue 27 states its goal as a ratio to ComfyUI's CPU default measured in the same run (`fast` at
<= 0.5x ComfyUI's time per step). This script measures that ratio on this machine. ComfyUI is an
outside reference: it is not installed with mixgraph and not copied here (it is GPL); the script
imports it at run time from `--comfyui DIR` (a source checkout), with `--comfyui-path-extra` dirs
for its pure-Python dependencies and for stand-ins of torchvision / torchaudio, which ComfyUI's
core imports at module level only for models not run here (Stable Cascade, Cosmos, audio).
benchmarks/README.md ("Against ComfyUI") gives the setup.

What is timed, per side, is the diffusion-model call of one sampler step at batch 2 (cond +
uncond, as under CFG): SIZE x SIZE px, 77 tokens.

* ComfyUI: `load_checkpoint_guess_config` of `--checkpoint` with ComfyUI in its `--cpu` mode
  (its own argument parser, as `main.py` runs it, so its defaults pick the UNet dtype and the
  attention function; more flags with `--comfyui-flags`), the model loaded with
  `model_management.load_models_gpu` as its sampler does, then `model.apply_model(x, sigma,
  c_crossattn=context)`: the call its `calc_cond_batch` makes once per step for a batched
  cond/uncond pair (input scaling, sigma -> timestep, the UNet, the denoised output).
* mixgraph: `load_checkpoint` of the same file, the precision given (a SPEC or a preset, resolved
  for the MODEL type on this CPU by `graph.precision.Resolver` with the role the SD family names
  for its UNet, `sd_unet`, as a KSampler under `--precision P` resolves it; the node library's
  socket types are imported first, since they register the roles), `ModelHandle.runner(policy)`:
  the weight store and `apply_precision` path a workflow's KSampler gets, then `runner(x, timestep, context, {})`: the `FamilyRunner` call its
  CFG denoiser makes once per step. The input scaling ComfyUI's call includes is a few
  elementwise operations on a [2, 4, SIZE/8, SIZE/8] latent (microseconds against seconds).

Both run under `torch.inference_mode()` with `--threads` torch threads (default: all cores), each
side in its own child process (ComfyUI's top-level modules `nodes`, `utils`, ... must not meet
this checkout's folders), started once and kept: the parent sends one call at a time, so the two
never compute at once. Per size: one untimed warm-up call per model, then `--repeats` rounds of
ComfyUI, then each mixgraph precision, one call each (interleaved, so load from other processes
hits all alike); minimum and median per row, and the ratio of minima to ComfyUI's.

Sanity check (parity): the raw UNet output of mixgraph f32 against ComfyUI's for the same
(x, timestep, context) at each size (ComfyUI's `diffusion_model` called directly, untimed):
tiny when both run the same model. Each mixgraph precision's SNR against ComfyUI's output is in
the table too. Precisions that resolve to the same MODEL SPEC on this CPU are timed once.

    python benchmarks/bench_vs_comfyui.py --comfyui DIR [--comfyui-path-extra DIR[:DIR...]]
        [--comfyui-flags "--use-pytorch-cross-attention"] [--checkpoint FILE]
        [--precisions "f32;bf16;fast;balanced;int8"] [--sizes 256,512] [--repeats 3]
        [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
DEFAULT_PRECISIONS = "f32;bf16;fast;balanced;int8"
SEED = 1
TIMESTEP = 500.0
CONTEXT_DIM = 768  # SD 1.5's CLIP-L width


class BenchError(RuntimeError):
    """A setup problem the user can fix (ComfyUI missing, a module missing, a bad argument)."""


# --------------------------------------------------------------------------------------------
# children: line-delimited JSON over stdin / a private copy of stdout


def _serve(handlers: dict) -> None:
    """Answer one JSON command per stdin line on the original stdout; everything the libraries
    print goes to stderr (fd 1 is redirected), so nothing they write can break the protocol."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            return
        try:
            reply = {"ok": handlers[msg["cmd"]](**msg.get("args", {}))}
        except BenchError as e:
            reply = {"error": str(e)}
        except Exception as e:  # reported to the parent, which stops with it
            import traceback

            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(reply) + "\n")


def _load_inputs(path: str):
    import torch

    d = torch.load(path)
    return d["x"], d["timestep"], d["context"]


def comfy_child(cfg: dict) -> None:
    """ComfyUI's side. Imports only ComfyUI (and torch), never this checkout."""
    import torch

    torch.set_num_threads(cfg["threads"])
    state: dict[str, Any] = {}

    def setup() -> dict:
        try:  # fix transformers' "is torchvision installed" answers before any stand-in is importable
            import transformers.utils.import_utils  # noqa: F401
        except ImportError:
            pass
        sys.path[:0] = [cfg["comfyui"], *cfg["extra"]]
        sys.argv = ["main.py", "--cpu", *cfg["flags"]]  # ComfyUI's own parser, as main.py runs it
        try:
            import comfy.options

            comfy.options.enable_args_parsing()
            import comfy.cli_args  # noqa: F401 - parses sys.argv
            import comfy.ldm.modules.attention as attention
            import comfy.model_management as mm
            import comfy.sd
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            fix = (f"give a stand-in package for {top} in a --comfyui-path-extra folder (ComfyUI's core "
                   f"imports it only for models not run here; never install it beside this torch)"
                   if top in ("torchvision", "torchaudio") else
                   f"install ComfyUI's pure-Python dependency with `pip install --target DEPS --no-deps "
                   f"{top}` and pass --comfyui-path-extra DEPS")
            raise BenchError(f"ComfyUI could not be imported from {cfg['comfyui']}: module {e.name!r} is "
                             f"missing ({fix}; see benchmarks/README.md, 'Against ComfyUI')") from e
        try:
            import comfyui_version

            version = comfyui_version.__version__
        except ImportError:
            version = "unknown"
        t0 = time.perf_counter()
        patcher = comfy.sd.load_checkpoint_guess_config(cfg["checkpoint"], output_vae=False, output_clip=False)[0]
        mm.load_models_gpu([patcher])  # what its sampler does before the first step
        state.update(patcher=patcher, mm=mm)
        model = patcher.model
        return {"version": version, "load_s": time.perf_counter() - t0, "argv": sys.argv[1:],
                "cpu_state": str(mm.cpu_state), "vram_state": str(mm.vram_state),
                "model": type(model).__name__, "unet_dtype": str(model.get_dtype()),
                "manual_cast_dtype": str(model.manual_cast_dtype),
                "device": str(mm.get_torch_device()), "attention": attention.optimized_attention.__name__,
                "threads": torch.get_num_threads()}

    def prepare(inputs: str, out: str) -> dict:
        """Per size: the raw UNet output for parity (untimed), then one warm-up step."""
        x, t, c = _load_inputs(inputs)
        model = state["patcher"].model
        with torch.inference_mode():
            raw = model.diffusion_model(x, t, context=c).float()  # same (x, t, context) as mixgraph's
            torch.save(raw, out)
            sigma = model.model_sampling.sigma(t)  # the sigma whose timestep is t
            state["call"] = (x, sigma, c)
            t0 = time.perf_counter()
            model.apply_model(x, sigma, c_crossattn=c)
        return {"warmup_s": time.perf_counter() - t0,
                "timestep_of_sigma": model.model_sampling.timestep(sigma).tolist()}

    def step() -> float:
        x, sigma, c = state["call"]
        model = state["patcher"].model
        with torch.inference_mode():
            t0 = time.perf_counter()
            model.apply_model(x, sigma, c_crossattn=c)
            return time.perf_counter() - t0

    _serve({"setup": setup, "prepare": prepare, "step": step})


def mixgraph_child(cfg: dict) -> None:
    """mixgraph's side: one runner per distinct resolved MODEL SPEC (f32 always, for parity)."""
    sys.path.insert(0, str(ROOT))
    import torch

    import mixgraph.nodes.socket_types  # noqa: F401 - registers the precision roles the presets resolve by
    from mixgraph.graph.precision import Resolver, hardware_section, parse_precision_arg
    from mixgraph.nodes.helpers.precision import family_role
    from mixgraph.nodes.models.loader import load_checkpoint

    torch.set_num_threads(cfg["threads"])
    runners: dict[str, Any] = {}
    state: dict[str, Any] = {}

    def setup() -> dict:
        t0 = time.perf_counter()
        handle, _, _ = load_checkpoint(cfg["checkpoint"])
        resolved = {}
        role = family_role(handle, "MODEL")  # "sd_unet": the role a KSampler asks its MODEL's policy for
        for prec in ["f32", *cfg["precisions"]]:
            default, types = parse_precision_arg(prec)
            policy = Resolver(None, types, default).policy("bench", "MODEL", role)
            resolved[prec] = policy.spec
            if policy.spec not in runners:
                runners[policy.spec] = handle.runner(policy)
        hw = hardware_section("cpu")
        return {"resolved": resolved, "role": role, "load_s": time.perf_counter() - t0,
                "threads": torch.get_num_threads(), "cpu": hw.get("name"), "native": {k: hw.get(k) for k in ("native_bf16", "native_f16", "native_int8")},
                "auto": hw.get("auto")}

    def prepare(inputs: str, out: str) -> dict:
        """Per size: one warm-up call per runner; its output is kept for the comparison."""
        x, t, c = _load_inputs(inputs)
        state["call"] = (x, t, c)
        outs, warm = {}, {}
        with torch.inference_mode():
            for spec, runner in runners.items():
                t0 = time.perf_counter()
                outs[spec] = runner(x, t, c, {}).float()
                warm[spec] = time.perf_counter() - t0
        torch.save(outs, out)
        return {"warmup_s": warm}

    def step(spec: str) -> float:
        x, t, c = state["call"]
        with torch.inference_mode():
            t0 = time.perf_counter()
            runners[spec](x, t, c, {})
            return time.perf_counter() - t0

    _serve({"setup": setup, "prepare": prepare, "step": step})


class Child:
    """A child process of this script serving one side."""

    def __init__(self, name: str, cfg: dict):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, str(HERE), f"{name}-child", json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def call(self, cmd: str, **args) -> Any:
        self.proc.stdin.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"the {self.name} child exited (status {self.proc.wait()}) during {cmd!r}; "
                             f"its stderr is above")
        reply = json.loads(line)
        if "error" in reply:
            raise BenchError(f"{self.name}: {reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --------------------------------------------------------------------------------------------
# parent


def _comfyui_dir(text: str | None) -> Path:
    if not text:
        raise BenchError("--comfyui DIR is required: a ComfyUI source checkout (the folder holding "
                         "main.py and comfy/); see benchmarks/README.md, 'Against ComfyUI'")
    d = Path(text).expanduser().resolve()
    if not (d / "comfy" / "sd.py").is_file():
        raise BenchError(f"--comfyui {text}: no ComfyUI source there (expected {d}/comfy/sd.py)")
    return d


def _inputs(size: int, path: Path) -> None:
    """x [2,4,S/8,S/8], timestep [2], context [2,77,768]: one CFG batch, seeded."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    lat = size // 8
    torch.save({"x": torch.randn(2, 4, lat, lat, generator=g), "timestep": torch.full((2,), TIMESTEP),
                "context": torch.randn(2, 77, CONTEXT_DIM, generator=g)}, path)


def _compare(y, ref) -> dict:
    diff = (y.double() - ref.double())
    noise = diff.pow(2).mean().item()
    return {"max_abs_diff": diff.abs().max().item(), "rel_err": (diff.norm() / ref.double().norm()).item(),
            "snr_db": math.inf if noise == 0 else 10 * math.log10(ref.double().pow(2).mean().item() / noise)}


def _default_checkpoint() -> Path:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE.parent))
    from bench_runtime import full_checkpoint

    return full_checkpoint()


def run(args: argparse.Namespace) -> dict:
    import torch

    comfyui = _comfyui_dir(args.comfyui)
    extra = [str(Path(p).expanduser().resolve()) for p in (args.comfyui_path_extra or "").split(os.pathsep) if p]
    for p in extra:
        if not Path(p).is_dir():
            raise BenchError(f"--comfyui-path-extra: {p} is not a folder")
    ckpt = Path(args.checkpoint) if args.checkpoint else _default_checkpoint()
    if not ckpt.is_file():
        raise BenchError(f"--checkpoint {ckpt}: no such file")
    precisions = [p.strip() for p in args.precisions.split(";") if p.strip()]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    threads = args.threads or os.cpu_count() or 1
    with open(ckpt, "rb") as f:  # page cache: neither side's load time is the disk's
        while f.read(64 << 20):
            pass
    comfy = Child("comfy", {"comfyui": str(comfyui), "extra": extra, "flags": shlex.split(args.comfyui_flags),
                            "checkpoint": str(ckpt), "threads": threads})
    mg = None
    try:
        comfy_info = comfy.call("setup")
        print(f"ComfyUI {comfy_info['version']}: unet {comfy_info['unet_dtype']}, attention "
              f"{comfy_info['attention']}, loaded in {comfy_info['load_s']:.1f} s", file=sys.stderr)
        mg = Child("mixgraph", {"checkpoint": str(ckpt), "precisions": precisions, "threads": threads})
        mg_info = mg.call("setup")
        resolved = mg_info["resolved"]
        print(f"mixgraph: {resolved}, loaded in {mg_info['load_s']:.1f} s", file=sys.stderr)
        timed: list[str] = []  # distinct resolved SPECs, in the order given
        for p in precisions:
            if resolved[p] not in timed:
                timed.append(resolved[p])
        rows, parity = [], []
        with tempfile.TemporaryDirectory(prefix="mixgraph-vs-comfyui-") as tmp:
            for size in sizes:
                inputs = Path(tmp) / f"inputs_{size}.pt"
                _inputs(size, inputs)
                comfy.call("prepare", inputs=str(inputs), out=f"{tmp}/comfy_{size}.pt")
                mg.call("prepare", inputs=str(inputs), out=f"{tmp}/mixgraph_{size}.pt")
                ref = torch.load(f"{tmp}/comfy_{size}.pt")
                outs = torch.load(f"{tmp}/mixgraph_{size}.pt")
                parity.append({"size": size, **_compare(outs["f32"], ref)})
                times: dict[str, list[float]] = {"comfyui": [], **{s: [] for s in timed}}
                for r in range(args.repeats):
                    times["comfyui"].append(comfy.call("step"))
                    for spec in timed:
                        times[spec].append(mg.call("step", spec=spec))
                    print(f"{size} px round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                          file=sys.stderr)
                base = min(times["comfyui"])
                rows.append({"size": size, "side": "ComfyUI", "precision": "default (--cpu)",
                             "resolved": comfy_info["unet_dtype"].replace("torch.", ""),
                             "min_s": base, "median_s": statistics.median(times["comfyui"]),
                             "vs_comfyui": 1.0, "snr_db": None})
                for p in precisions:
                    spec = resolved[p]
                    first = next(q for q in precisions if resolved[q] == spec)
                    rows.append({"size": size, "side": "mixgraph", "precision": p, "resolved": spec,
                                 "min_s": min(times[spec]), "median_s": statistics.median(times[spec]),
                                 "vs_comfyui": min(times[spec]) / base,
                                 "snr_db": _compare(outs[spec], ref)["snr_db"],
                                 "same_as": first if first != p else None})
    finally:
        comfy.close()
        if mg is not None:
            mg.close()
    return {"checkpoint": str(ckpt), "batch": 2, "repeats": args.repeats, "threads": threads,
            "comfyui": {**comfy_info, "dir": str(comfyui), "path_extra": extra},
            "mixgraph": mg_info, "parity_f32": parity, "rows": rows}


def _plain(v: Any) -> Any:
    """`res` as strict JSON: an infinite SNR (identical outputs) becomes the string "inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", help="ComfyUI source folder (holds main.py, comfy/)")
    ap.add_argument("--comfyui-path-extra", default="",
                    help=f"'{os.pathsep}'-separated folders put on ComfyUI's sys.path after it (its "
                         f"dependencies, torchvision/torchaudio stand-ins)")
    ap.add_argument("--comfyui-flags", default="", help="more ComfyUI command-line flags (after --cpu)")
    ap.add_argument("--checkpoint", help="SD 1.5 single-file checkpoint (default: the seeded random "
                    "full-size one of bench_runtime.py, written on first use)")
    ap.add_argument("--precisions", default=DEFAULT_PRECISIONS, help="';'-separated mixgraph --precision arguments")
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads on both sides (default: all cores)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        res = run(args)
    except BenchError as e:
        sys.exit(f"bench_vs_comfyui: {e}")
    if args.json:
        print(json.dumps(_plain(res), indent=1, default=str))
        return
    sys.path.insert(0, str(ROOT))
    from mixgraph.ui.bench.bench_precision import fmt_s, format_table

    c = res["comfyui"]
    print(f"ComfyUI {c['version']} ({c['dir']}, flags {' '.join(c['argv'])}): unet {c['unet_dtype']}, "
          f"manual cast {c['manual_cast_dtype']}, attention {c['attention']}, device {c['device']}")
    m = res["mixgraph"]
    print(f"mixgraph on {m['cpu']} ({m['native']}); MODEL role {m['role']}; {res['threads']} threads; batch 2; "
          f"{res['repeats']} rounds, interleaved")
    for p in res["parity_f32"]:
        print(f"parity {p['size']} px, mixgraph f32 vs ComfyUI raw UNet output: max |diff| "
              f"{p['max_abs_diff']:.2e}, relative error {p['rel_err']:.2e}")
    print(format_table(res["rows"], [
        ("size", "size", str), ("side", "side", str), ("precision", "precision", str),
        ("resolved", "MODEL", str), ("min_s", "min s/step", fmt_s), ("median_s", "median", fmt_s),
        ("vs_comfyui", "vs ComfyUI", lambda x: f"{x:.2f}x"),
        ("snr_db", "SNR vs ComfyUI", lambda x: "identical" if math.isinf(x) else f"{x:.1f} dB"),
        ("same_as", "same as", str)]))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "comfy-child":
        comfy_child(json.loads(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "mixgraph-child":
        mixgraph_child(json.loads(sys.argv[2]))
    else:
        main()
