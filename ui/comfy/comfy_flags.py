"""ComfyUI's server flags on `mixgraph serve`, with ComfyUI's meaning (its `comfy/cli_args.py`), so
scripts, launchers and test harnesses that start ComfyUI can start mixgraph unchanged.

    add_comfy_flags(parser)              # in ui/cli.py's serve block
    options, notes = serve_options(args) # -> keyword arguments of ui.server.server.serve

What they do here:

* `--listen [IP[,IP...]]` (no value: `0.0.0.0,::`, all interfaces) replaces `--host`; the
  safety rule stays: any non-loopback address needs `--token` unless `--insecure`.
* `--port`, `--output-directory`, `--input-directory`, `--temp-directory`, `--models-directory`
  set those folders (aliases of `--output`, `--input`, `--models`); `--base-directory B` is the
  base of `models/`, `input/`, `output/`, `temp/`, `user/` (and `custom_nodes/`, for the
  custom-node loader), each overridden by its own flag.
* `--user-directory U` (must exist, as in ComfyUI): the editor's settings and files live in
  `U/default`, the job store in `U/mixgraph/`.
* `--extra-model-paths-config PATH [PATH ...]` (repeatable): extra model roots from each yaml.
* `--cpu` = device cpu; `--cuda-device N` = device `cuda:N` where CUDA exists.
* `--enable-cors-header [ORIGIN]` (no value: `*`): CORS headers for ORIGIN, and ORIGIN may make
  state-changing requests (the foreign-Origin refusal of DESIGN §7 stays for every other origin).
  `*` would let any web page drive the server, so it needs `--token` or `--insecure`.
* `--max-upload-size MB` (float, as ComfyUI); `--preview-method none|auto|latent2rgb|taesd` and
  `--preview-size N` are carried in `Env.settings` for the preview code.
* Memory (`memory_from_args`, applied by `apply_memory`): `--memory-budget GIB` (mixgraph's own)
  sets the budget of the run's device (`nodes/models/memory_budget.py`); `--reserve-vram GB`
  keeps GB free below the device's memory instead of the default reserve; `--lowvram` (blocks
  that do not fit stream: the default behaviour, said explicitly), `--novram` (every model's
  blocks stream), `--highvram` / `--gpu-only` (models stay resident, never streamed),
  `--normalvram` (the default) set the budget's mode, on a CPU as on CUDA; each prints a `note:`
  saying what it does. `--disable-smart-memory` releases the weight store's models after each
  prompt (`Env.settings["release_models"]`).
* Flags about CUDA allocators, attention kernels, global precision and other ComfyUI internals
  are accepted and each prints one `note:` line to stderr saying why it has no effect.

The cache flags (`add_cache_flags`, `cache_from_args`: ComfyUI's `--cache-*` modes, and the
persistent output cache `--output-cache DIR [--output-cache-gb N]` behind them) are added to
`run` and `serve` by ui/cli.py; custom-node flags are added elsewhere.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mixgraph.graph.cache import make_cache
from mixgraph.graph.persist import DEFAULT_BYTES, DiskCache, TieredCache

PREVIEW_METHODS = ("none", "auto", "latent2rgb", "taesd")
LISTEN_ALL = "0.0.0.0,::"
MB = 1024 * 1024
DISK_DEFAULT_GB = DEFAULT_BYTES / 2**30

_MEMORY = "mixgraph manages model memory itself"
_PRECISION = ("precision is per workflow here: precision tags on groups and subgraphs, "
              "or `mixgraph run --precision`")
_ATTENTION = "attention always uses PyTorch's scaled_dot_product_attention"
_CUDA = "a CUDA allocator setting"

#: Flags accepted for compatibility that change nothing here: flag -> (argparse kwargs, reason).
NO_EFFECT: dict[str, tuple[dict[str, Any], str]] = {
    **{f: ({}, _MEMORY) for f in ("--async-offload", "--cpu-vae",
                                  "--disable-mmap", "--mmap-torch-files", "--force-channels-last")},
    **{f: ({}, _PRECISION) for f in (
        "--force-fp32", "--force-fp16", "--fp32-unet", "--fp64-unet", "--bf16-unet", "--fp16-unet",
        "--fp8_e4m3fn-unet", "--fp8_e5m2-unet", "--fp8_e8m0fnu-unet", "--fp16-vae", "--fp32-vae",
        "--bf16-vae", "--fp8_e4m3fn-text-enc", "--fp8_e5m2-text-enc", "--fp16-text-enc",
        "--fp32-text-enc", "--bf16-text-enc", "--supports-fp8-compute")},
    "--fast": ({"nargs": "*", "metavar": "FEATURE"}, _PRECISION),
    **{f: ({}, _ATTENTION) for f in (
        "--use-split-cross-attention", "--use-quad-cross-attention", "--use-pytorch-cross-attention",
        "--use-sage-attention", "--use-flash-attention", "--disable-xformers",
        "--force-upcast-attention", "--dont-upcast-attention")},
    "--cuda-malloc": ({}, _CUDA), "--disable-cuda-malloc": ({}, _CUDA),
    "--directml": ({"type": int, "nargs": "?", "const": -1, "metavar": "DEVICE"},
                   "DirectML is not supported (devices: cpu, cuda, mps)"),
    "--oneapi-device-selector": ({"metavar": "SELECTOR"}, "oneAPI is not supported"),
    "--disable-ipex-optimize": ({}, "Intel Extension for PyTorch is not used"),
    "--deterministic": ({}, "samplers already draw from seeded generators"),
    "--auto-launch": ({}, "no browser is opened; open the printed URL"),
    "--disable-auto-launch": ({}, "no browser is opened anyway"),
    "--dont-print-server": ({}, "the one start-up line goes to stderr"),
    "--windows-standalone-build": ({}, "not a Windows standalone build"),
    "--quick-test-for-ci": ({}, "use `mixgraph validate` for CI checks"),
    "--multi-user": ({}, "single user: the `comfy-user` header is ignored"),
    "--disable-api-nodes": ({}, "there are no API nodes"),
    "--disable-metadata": ({}, "not supported yet: images always carry the prompt"),
    "--enable-compress-response-body": ({}, "responses are not compressed"),
    "--log-stdout": ({}, "logs go to stderr"),
    "--default-hashing-function": ({"choices": ["md5", "sha1", "sha256", "sha512"]},
                                   "uploads are compared byte for byte"),
    "--front-end-version": ({"metavar": "REPO@VERSION"},
                            "the editor comes from the installed comfyui-frontend-package"),
    "--comfy-api-base": ({"metavar": "URL"}, "there are no API nodes"),
    "--database-url": ({"metavar": "URL"}, "the job store lives in the user directory"),
}


#: ComfyUI's VRAM flags -> the memory budget's mode (``memory_budget.MODES``) and what it does here
VRAM_MODES: dict[str, tuple[str, str]] = {
    "--gpu-only": ("gpu_only", "models stay resident, never streamed"),
    "--highvram": ("high", "models stay resident, never streamed"),
    "--normalvram": ("normal", "blocks of a model that does not fit the budget stream"),
    "--lowvram": ("low", "blocks of a model that does not fit the budget stream"),
    "--novram": ("none", "every model's blocks stream, only the rest stays resident"),
}


def _gib(flag: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (0 < value < 1 << 20):
            raise argparse.ArgumentTypeError(
                f"{flag} needs a positive number of GiB (e.g. 6 or 7.5), not {text!r}")
        return value
    return parse


def add_memory_flag(p: argparse.ArgumentParser) -> None:
    """`--memory-budget GIB` (run, serve, estimate): the memory one run may hold on its device."""
    p.add_argument("--memory-budget", type=_gib("--memory-budget"), metavar="GIB",
                   help="memory a run may hold on its device, in GiB (default: the machine's RAM "
                        "or free VRAM less a reserve); models that do not fit stream their blocks")


@dataclass(frozen=True)
class MemoryFlags:
    """What the memory flags ask: a budget in GiB (None: the default), the reserve kept free
    (``--reserve-vram``), the mode, whether models are released after each prompt."""
    gib: float | None = None
    reserve_gib: float | None = None
    mode: str = "normal"
    release_models: bool = False


def memory_from_args(args: argparse.Namespace) -> tuple[MemoryFlags, list[str]]:
    """The memory flags of `run` / `serve` and the notes saying what each does here; FlagError
    for flags that disagree."""
    given = [f for f in VRAM_MODES if getattr(args, _dest(f), None)]
    if len(given) > 1:
        raise FlagError(f"{' and '.join(given)} disagree; give one of them (as in ComfyUI)")
    notes, mode = [], "normal"
    for f in given:
        mode, what = VRAM_MODES[f]
        notes.append(f"note: {f}: memory mode {mode!r} ({what})")
    gib = getattr(args, "memory_budget", None)
    reserve = getattr(args, _dest("--reserve-vram"), None)
    if reserve is not None and not (0 <= reserve < 1 << 20):
        raise FlagError(f"--reserve-vram {reserve}: give a size in GB of at least 0")
    if reserve is not None and gib is not None:
        notes.append("note: --reserve-vram has no effect with --memory-budget (the budget is given)")
    elif reserve is not None:
        notes.append(f"note: --reserve-vram {reserve:g}: the memory budget keeps {reserve:g} GiB free")
    release = bool(getattr(args, _dest("--disable-smart-memory"), False))
    if release:
        notes.append("note: --disable-smart-memory: models are released after each prompt")
    return MemoryFlags(gib, reserve if gib is None else None, mode, release), notes


def apply_memory(flags: MemoryFlags, device: str | None) -> Any:
    """Set the memory budget of ``device`` (default cpu) from ``flags``; returns the budget."""
    from mixgraph.nodes.models import memory_budget
    return memory_budget.set_budget(device or "cpu", flags.gib, reserve_gib=flags.reserve_gib,
                                    mode=flags.mode)


def add_comfy_flags(p: argparse.ArgumentParser) -> None:
    """Add ComfyUI's server flags to the `serve` parser (it already has --port, --models,
    --input, --output, --device)."""
    g = p.add_argument_group("ComfyUI's server flags (same meaning as in ComfyUI)")
    g.add_argument("--listen", nargs="?", const=LISTEN_ALL, metavar="IP",
                   help="address(es) to listen on, comma-separated; no value: all (0.0.0.0,::); "
                        "non-loopback needs --token or --insecure")
    g.add_argument("--output-directory", dest="output", metavar="DIR", help="= --output")
    g.add_argument("--input-directory", dest="input", metavar="DIR", help="= --input")
    g.add_argument("--models-directory", dest="models", metavar="DIR", help="= --models")
    g.add_argument("--temp-directory", dest="temp", metavar="DIR")
    g.add_argument("--user-directory", metavar="DIR",
                   help="editor settings and files (DIR/default) and the job store (DIR/mixgraph)")
    g.add_argument("--base-directory", metavar="DIR",
                   help="base of models/, input/, output/, temp/, user/, custom_nodes/")
    g.add_argument("--extra-model-paths-config", nargs="+", action="append", metavar="PATH",
                   help="extra_model_paths.yaml file(s); repeatable")
    g.add_argument("--cpu", action="store_true", help="= --device cpu")
    g.add_argument("--cuda-device", type=int, metavar="N", help="= --device cuda:N")
    g.add_argument("--enable-cors-header", nargs="?", const="*", metavar="ORIGIN",
                   help="allow ORIGIN (no value: any, needs --token or --insecure)")
    g.add_argument("--max-upload-size", type=float, metavar="MB", help="largest upload in MB")
    g.add_argument("--preview-method", choices=PREVIEW_METHODS, help="sampler previews")
    g.add_argument("--preview-size", type=int, metavar="N", help="largest preview side (512)")
    for flag, (mode, what) in VRAM_MODES.items():
        g.add_argument(flag, dest=_dest(flag), action="store_true", help=f"memory mode {mode}: {what}")
    g.add_argument("--reserve-vram", dest=_dest("--reserve-vram"), type=float, metavar="GB",
                   help="GB kept free below the device's memory (instead of the default reserve)")
    g.add_argument("--disable-smart-memory", dest=_dest("--disable-smart-memory"), action="store_true",
                   help="release models after each prompt")
    ignored = p.add_argument_group("ComfyUI flags accepted with no effect here (a note says why)")
    for flag, (kwargs, _) in NO_EFFECT.items():
        ignored.add_argument(flag, dest=_dest(flag), default=None,
                             **({"action": "store_true"} if not kwargs else kwargs),
                             help=argparse.SUPPRESS)


def _dest(flag: str) -> str:
    return "comfy_" + flag.lstrip("-").replace("-", "_")


class FlagError(ValueError):
    """A flag value that cannot be used; the message names the flag."""


def serve_options(args: argparse.Namespace, cuda_available: bool | None = None
                  ) -> tuple[dict[str, Any], list[str]]:
    """Keyword arguments for `ui.server.server.serve` from the parsed serve arguments, and the notes to
    print (one per accepted flag that has no effect). Raises FlagError for unusable values."""
    notes = []
    for flag, (_, why) in NO_EFFECT.items():
        value = getattr(args, _dest(flag), None)
        if value not in (None, False):
            notes.append(f"note: {flag} has no effect on this build ({why})")

    base = Path(args.base_directory) if getattr(args, "base_directory", None) else None
    if base is not None and not base.is_dir():
        raise FlagError(f"--base-directory {base}: no such folder")

    def folder(value: str | None, sub: str) -> str | None:
        return value if value else (str(base / sub) if base is not None else None)

    if base is None or getattr(args, "models", None):   # --base-directory's own models/ may be missing
        from mixgraph.graph.env import models_problem
        problem = models_problem(getattr(args, "models", None))
        if problem:
            raise FlagError(problem)

    user = getattr(args, "user_directory", None)
    if user is not None and not Path(user).is_dir():
        raise FlagError(f"--user-directory {user}: no such folder (ComfyUI requires it to exist)")
    user_root = Path(user) if user else (base / "user" if base is not None else None)

    device = getattr(args, "device", None)
    if getattr(args, "cpu", False):
        if device not in (None, "cpu"):
            raise FlagError(f"--cpu and --device {device} disagree; give one of them")
        device = "cpu"
    cuda_device = getattr(args, "cuda_device", None)
    if cuda_device is not None:
        if cuda_available is None:
            import torch
            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            notes.append(f"note: --cuda-device {cuda_device} has no effect on this build "
                         f"(no CUDA on this machine; running on {device or 'cpu'})")
        elif device not in (None, f"cuda:{cuda_device}") and not getattr(args, "cpu", False):
            raise FlagError(f"--cuda-device {cuda_device} and --device {device} disagree")
        elif not getattr(args, "cpu", False):
            device = f"cuda:{cuda_device}"

    extra: dict[str, list[Path]] = {}
    for path in (p for group in (getattr(args, "extra_model_paths_config", None) or []) for p in group):
        if not Path(path).is_file():
            raise FlagError(f"--extra-model-paths-config {path}: no such file")
        from mixgraph.nodes.helpers.folders import read_extra_model_paths
        try:
            found = read_extra_model_paths(Path(path))
        except Exception as e:  # noqa: BLE001 - a bad yaml is a clear error, not a traceback
            raise FlagError(f"--extra-model-paths-config {path}: {e}") from None
        for key, roots in found.items():
            extra.setdefault(key, []).extend(roots)

    upload = getattr(args, "max_upload_size", None)
    if upload is not None and not (0 < upload < 1 << 20):
        raise FlagError(f"--max-upload-size {upload}: give a size in MB above 0")

    settings = {}
    if getattr(args, "preview_method", None) is not None:
        settings["preview_method"] = args.preview_method
    if getattr(args, "preview_size", None) is not None:
        if args.preview_size < 1:
            raise FlagError(f"--preview-size {args.preview_size}: give a size of at least 1")
        settings["preview_size"] = args.preview_size
    if base is not None:
        settings["custom_nodes"] = str(base / "custom_nodes")
    if getattr(args, _dest("--disable-smart-memory"), False):
        settings["release_models"] = True

    options: dict[str, Any] = {
        "host": getattr(args, "listen", None) or args.host,
        "port": args.port,
        "models": folder(args.models, "models"),
        "input": folder(args.input, "input"),
        "output": folder(args.output, "output"),
        "temp": folder(getattr(args, "temp", None), "temp"),
        "device": device,
        "user_dir": str(user_root / "default") if user_root is not None else None,
        "extra_model_paths": {k: tuple(v) for k, v in extra.items()},
        "cors_origin": getattr(args, "enable_cors_header", None),
        "settings": settings,
    }
    if upload is not None:
        options["max_upload"] = round(upload * MB)
    return options, notes


def add_cache_flags(p: argparse.ArgumentParser) -> None:
    """ComfyUI's cache modes (graph.cache.make_cache); without one, the LRU by bytes."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cache-lru", type=int, metavar="N",
                   help="keep at most N node results (0: off, the default cache)")
    g.add_argument("--cache-none", action="store_true", help="keep nothing between prompts")
    g.add_argument("--cache-ram", type=float, nargs="?", const=4.0, metavar="GB",
                   help="keep results while GB of RAM stay available (default 4)")
    p.add_argument("--output-cache", metavar="DIR", help="also keep node outputs (CONDITIONING, "
                   "LATENT, IMAGE, MASK) in DIR across restarts, shared by processes (off unless "
                   "given)")
    p.add_argument("--output-cache-gb", type=float, metavar="N", help="byte budget of "
                   f"--output-cache, least recently used out first (default {DISK_DEFAULT_GB:g})")


def budget_cache(budget: Any, **modes: Any) -> Any:
    """The in-memory output cache for the cache `modes` (`graph.cache.make_cache`'s) under the
    memory `budget`: the default mode's bound is a share of it, recorded so weight streaming
    leaves that share out of a model's weights allowance (`memory_budget.set_output_share`)."""
    from mixgraph.nodes.models import memory_budget
    memory = make_cache(**modes, memory_bytes=budget.nbytes)
    memory_budget.set_output_share(budget, memory.max_bytes if memory.budget_share else 0)
    return memory


def cache_from_args(args: argparse.Namespace) -> Any:
    """The executor's output cache for the cache flags (ValueError for an unusable value): the
    in-memory mode, behind which `--output-cache DIR` puts the persistent level. The default
    mode's byte bound is a share (`graph.cache.BUDGET_SHARE`) of the CPU memory budget (node
    outputs are CPU tensors, as `nodes/media/memory_guards.py` counts them), so call it after
    the budget is set (`apply_memory`); env `MIXGRAPH_CACHE_BYTES` still wins."""
    from mixgraph.nodes.models import memory_budget
    memory = budget_cache(memory_budget.budget("cpu"), lru=getattr(args, "cache_lru", None),
                          none=getattr(args, "cache_none", False), ram=getattr(args, "cache_ram", None))
    directory, gb = getattr(args, "output_cache", None), getattr(args, "output_cache_gb", None)
    if directory is None:
        if gb is not None:
            raise ValueError("--output-cache-gb needs --output-cache DIR")
        return memory
    gb = DISK_DEFAULT_GB if gb is None else gb
    if not 0 < gb < 2**40:
        raise ValueError(f"--output-cache-gb needs a number of GB above 0, not {gb}")
    return TieredCache(memory, DiskCache(directory, int(gb * 2**30)))
