"""Precision as data: the SPEC grammar, the `Policy` type and the resolver. The one home for both.

A SPEC names how a model's weights are stored and what dtype its layers compute in:

    SPEC   := PRESET | "int8" [":" HALF] | STORE [":" COMPUTE] ("+" FLAG)*
    PRESET := auto | quality | balanced | memory | fast      (auto = balanced; see `preset_spec`)
    STORE  := f32 | bf16 | f16 | fp8_e4m3fn | fp8_e5m2        (fp32/fp16/float32/... accepted)
    COMPUTE:= f32 | bf16 | f16                                 (default: the storage dtype)
    FLAG   := upcast (= upcast_attention + f32_norms) | upcast_attention | f32_norms
    HALF   := bf16 | f16

`int8`: int8 Linear and Conv2d layers (int8 weights, activations quantised per call), every other
layer stored and computed in f32. `int8:bf16` (`int8:f16`): the same int8 layers, every other
layer (attention, norms, the layers `int8_skip` names) stored and computed in bf16 (f16): on a CPU
with native bf16 the attention then runs at bf16's speed beside the int8 GEMMs.

Examples: `f32`, `bf16`, `bf16:f32` (store bf16, compute f32), `fp8_e4m3fn:bf16`, `f16+upcast`.
fp8 formats are storage only, so an fp8 SPEC must name its compute dtype.

Resolution for one node and one model socket type, most specific first (DESIGN §4):
  1. a precision-cast node on the model handle (the handle's `precision`, passed to `resolve`);
  2. the innermost precision region holding the node (the smallest node set among those that
     hold it; equal sizes: the region listed later wins);
  3. the per-socket-type default (`--precision MODEL=bf16,VAE=f32`);
  4. the workflow default: the command line / API `precision=` when given, else the workflow
     file's `precision.default` (an explicit request for this run beats what the file suggests);
  5. `auto` (= the `balanced` preset), per socket type: the fastest native policy that keeps the
     picture (`preset_spec` evaluates it). Native arithmetic is detected per device
     (`device_caps`: CUDA compute capability, MPS, a CPU's flags: AVX512-BF16/AMX-BF16 for bf16,
     AVX512-FP16/AMX-FP16 for f16, VNNI/AMX-INT8 for int8). CUDA: bf16 from 8.0, else
     f16+upcast; a CPU with native bf16: bf16 for the roles that ask for it (the node library's
     UNet/ControlNet), f32 for the others (VAE, text encoders); a CPU without it (half precision
     emulated, slower than f32): f32. int8 only where `CPU_INT8_TABLE` lists the preset. A preset in any place a SPEC goes (default, region,
     `TYPE=`) resolves per socket type there, through the socket type's precision role.

Which socket types hold models and what each preset gives each of them is not known here: the
node library registers its socket types (`graph.spec.register_socket_type`) and precision roles
(`graph.roles`: `register_role`, `register_preset_role`, re-exported here). A socket type with no
role gets the careful default (`graph.roles.DEFAULT_PRESETS`); a caller may name one of a socket
type's further roles (`Resolver.policy(..., role=)`, `ctx.policy_for(TYPE, role=)`).

Every rule lives here once:
- the grammar: `parse_spec` (SPEC -> Policy), `parse_precision_arg` (`--precision`, `TYPE=SPEC`),
  `parse_config` (a workflow's default and regions: every problem, each named by where it is;
  `load_workflow` runs it, so `validate`, `run`, `serve` and `bench` accept the same files);
- the per-workflow order 2-5: `Resolver` (region > type default > default > auto);
- the per-use rules, in `resolve`: the handle's pinned precision beats the resolved one, a loader's
  pinned storage dtype (UNETLoader's `weight_dtype`) replaces the storage (and turns int8 off: see
  `resolve`), and a NaN-guard re-run computes in f32. Node bodies reach it through
  `Context.policy_for` (`nodes/helpers/precision.py: effective`); the executor calls it for the re-run's
  report. A model handle receives the finished policy and applies it as given.

Policies are plain frozen data; `nodes/weights/cast.py` reads them duck-typed (`PolicyLike`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from mixgraph.graph.roles import ROLES, RolePresets, register_preset_role, register_role

__all__ = [
    "Policy", "PrecisionError", "F32", "parse_spec", "format_spec", "parse_type_defaults",
    "parse_precision_arg", "parse_config", "ParsedConfig", "resolve", "DeviceCaps", "device_caps",
    "auto_spec", "emulation_warning", "Resolver", "NodePrecision", "cpu_flags",
    "cpu_caps_from_flags", "CPU_FLAGS_ENV", "PRESETS", "preset_name", "preset_spec", "preset_table",
    "hardware_section", "RolePresets", "register_role", "register_preset_role",
]


class PrecisionError(ValueError):
    """A SPEC that cannot be parsed or used; the message says what is allowed (and, from
    `parse_config`, where each bad SPEC is). `problems` lists them one by one."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.problems = problems or (message,)


_STORAGE = {
    "f32": torch.float32, "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f16": torch.float16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp8_e4m3fn": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2, "float8_e5m2": torch.float8_e5m2,
}
_COMPUTE = {k: v for k, v in _STORAGE.items() if v in (torch.float32, torch.bfloat16, torch.float16)}
_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e5m2: "fp8_e5m2"}
_HALF = (torch.float16, torch.bfloat16)

ALLOWED = ("f32, bf16, f16, STORE:COMPUTE (e.g. bf16:f32, fp8_e4m3fn:bf16, fp8_e5m2:f16), "
           "+upcast / +upcast_attention / +f32_norms flags (e.g. f16+upcast), int8, int8:bf16, auto, "
           "or a preset: quality, balanced, memory, fast")


@dataclass(frozen=True)
class Policy:
    """How one model computes. Hashable; `spec` is the canonical SPEC string."""

    storage: torch.dtype = torch.float32
    compute: torch.dtype = torch.float32
    upcast_attention: bool = False
    f32_norms: bool = False
    int8: bool = False
    spec: str = "f32"

    @property
    def is_half(self) -> bool:
        """Compute in f16 or bf16: the NaN guard watches such nodes."""
        return self.compute in _HALF

    def __str__(self) -> str:
        return self.spec


def _make(storage: torch.dtype, compute: torch.dtype, upcast_attention: bool = False,
          f32_norms: bool = False, int8: bool = False) -> Policy:
    p = Policy(storage, compute, upcast_attention, f32_norms, int8, "")
    return dataclasses.replace(p, spec=format_spec(p))


def format_spec(p: Any) -> str:
    """The canonical SPEC of any policy-like object (the inverse of `parse_spec`)."""
    if p.int8:
        return "int8" if p.compute == torch.float32 else "int8:" + _NAMES[p.compute]
    s = _NAMES[p.storage]
    if p.compute != p.storage:
        s += ":" + _NAMES[p.compute]
    if p.upcast_attention and p.f32_norms:
        s += "+upcast"
    elif p.upcast_attention:
        s += "+upcast_attention"
    elif p.f32_norms:
        s += "+f32_norms"
    return s


F32 = _make(torch.float32, torch.float32)


def _as_policy(p: Any) -> Policy:
    """A `Policy` for any policy-like object (a handle may hold another `PolicyLike`)."""
    if isinstance(p, Policy):
        return p
    return _make(p.storage, p.compute, bool(p.upcast_attention), bool(p.f32_norms), bool(p.int8))


def resolve(base: Any, *, pinned: Any = None, storage: torch.dtype | None = None,
            f32_compute: bool = False, warn: Callable[[str], None] | None = None,
            compute: torch.dtype | None = None) -> Policy:
    """The policy one model runs under in one node: the one home of the per-use rules.

    base:        what the `Resolver` gave the node for the model's socket type.
    pinned:      the handle's own precision (a `Set*Precision` node); beats `base`.
    storage:     a storage dtype the loader pinned (UNETLoader's `weight_dtype`); it replaces the
                 storage of whichever policy won, keeping its compute dtype and flags. int8 is a
                 storage format too (int8 Linear/Conv2d weights, f32 or half for the rest) and cannot
                 hold the pinned dtype, so the pin wins: the model stores `storage` and computes in
                 the int8 policy's dtype for the rest (`int8` + fp8_e4m3fn -> `fp8_e4m3fn:f32`),
                 and `warn` is told. What the report names is then what is stored and computed.
    compute:     a compute dtype pinned on the handle (ComfyUI's ModelComputeDtype); it replaces
                 the compute dtype of whichever policy won, keeping storage and flags. An int8
                 policy keeps its own dtypes (`warn` is told the pin does not apply).
    f32_compute: a NaN-guard re-run: same storage and flags, f32 compute; beats everything
                 (`int8:bf16` re-runs as `int8`: the int8 layers stay, the rest in f32).
    """
    policy = _as_policy(pinned if pinned is not None else base)
    if storage is not None and (storage != policy.storage or policy.int8):
        if storage not in _NAMES:
            raise PrecisionError(f"pinned storage dtype {storage} is not one of "
                                 f"{', '.join(_NAMES.values())}")
        if policy.int8 and warn is not None:
            name = _NAMES[storage]
            pinned_spec = format_spec(_make(storage, policy.compute))
            warn(f"int8 does not combine with the loader's weight_dtype {name}: the model is "
                 f"stored {name} and computes in {_NAMES[policy.compute]} ({pinned_spec}), without int8 layers")
        policy = _make(storage, policy.compute, policy.upcast_attention, policy.f32_norms)
    if compute is not None and compute != policy.compute:
        if compute not in _COMPUTE.values():
            raise PrecisionError(f"pinned compute dtype {compute} is not one of f32, bf16, f16")
        if policy.int8:
            if warn is not None:
                warn(f"{policy.spec} keeps its own compute dtypes (int8 layers, "
                     f"{_NAMES[policy.compute]} for the rest): the pinned compute dtype {_NAMES[compute]} "
                     f"does not apply")
        else:
            policy = _make(policy.storage, compute, policy.upcast_attention, policy.f32_norms)
    if f32_compute and policy.compute != torch.float32:
        if policy.int8:  # int8:bf16 -> int8: the int8 layers stay, the rest runs in f32
            policy = _make(torch.float32, torch.float32, int8=True)
        else:
            policy = _make(policy.storage, torch.float32, policy.upcast_attention, policy.f32_norms)
    return policy


def parse_spec(spec: str, device: str = "cpu", socket: str | None = None, *,
               role: str | None = None) -> Policy:
    """Parse a SPEC into a Policy; a preset (`auto`, `quality`, `balanced`, `memory`, `fast`) is
    resolved for `device` and the model socket type `socket` (default: the primary one), or the
    precision `role` when given (`preset_spec`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise PrecisionError(f"empty precision spec; allowed: {ALLOWED}")
    preset = preset_name(spec)
    if preset is not None:   # not memoized: what a preset gives depends on the registered roles
        return _parse_plain(preset_spec(preset, socket, device_caps(device), role=role))
    return _parse_plain(spec)


@functools.lru_cache(maxsize=256)
def _parse_plain(spec: str) -> Policy:
    """A SPEC that names no preset, parsed (the grammar in the module docstring)."""
    text = spec.strip().lower()
    if text == "int8" or text.startswith("int8:"):
        # Dynamic int8 Linear and Conv2d layers (weights int8, activations quantized per call);
        # every other layer stores and computes in f32, or in the half dtype named after the colon.
        _, sep, rest = text.partition(":")
        rest = rest.strip() if sep else "f32"
        dtype = _COMPUTE.get(rest)
        if dtype is None or "+" in rest:
            raise PrecisionError(f"precision {spec!r}: int8 takes the dtype of its other layers after "
                                 f"the colon: int8 (f32), int8:bf16 or int8:f16, not {rest!r}")
        return _make(dtype, dtype, int8=True)
    base, *flags = text.split("+")
    store_name, sep, compute_name = base.partition(":")
    storage = _STORAGE.get(store_name.strip())
    if storage is None:
        raise PrecisionError(f"precision {spec!r}: unknown storage dtype {store_name!r}; allowed: {ALLOWED}")
    if sep:
        compute = _COMPUTE.get(compute_name.strip())
        if compute is None:
            raise PrecisionError(f"precision {spec!r}: compute dtype must be f32, bf16 or f16, "
                                 f"not {compute_name!r}; allowed: {ALLOWED}")
    elif storage in _COMPUTE.values():
        compute = storage
    else:
        raise PrecisionError(f"precision {spec!r}: {store_name} is a storage format only; name the "
                             f"compute dtype too, e.g. {store_name}:bf16 or {store_name}:f16")
    upcast_attention = f32_norms = False
    for flag in (f.strip() for f in flags):
        if flag == "upcast":
            upcast_attention = f32_norms = True
        elif flag in ("upcast_attention", "upcast_attn"):
            upcast_attention = True
        elif flag in ("f32_norms", "f32_norm"):
            f32_norms = True
        else:
            raise PrecisionError(f"precision {spec!r}: unknown flag +{flag}; flags are +upcast, "
                                 f"+upcast_attention, +f32_norms")
    return _make(storage, compute, upcast_attention, f32_norms)


def parse_type_defaults(text: str | Mapping[str, str] | None, device: str = "cpu") -> dict[str, Policy]:
    """`"MODEL=bf16,VAE=f32"` (or a mapping) -> {socket type: Policy}."""
    if not text:
        return {}
    items = text.items() if isinstance(text, Mapping) else _split_assignments(text)
    out: dict[str, Policy] = {}
    for socket, spec in items:
        if not socket or not socket.replace("_", "").isalnum():
            raise PrecisionError(f"precision default {socket}={spec}: expected SOCKET_TYPE=SPEC, "
                                 f"e.g. MODEL=bf16,VAE=f32")
        out[socket.upper()] = parse_spec(spec, device, socket.upper())
    return out


def _split_assignments(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        if not sep:
            raise PrecisionError(f"precision default {item!r}: expected SOCKET_TYPE=SPEC")
        pairs.append((key.strip(), value.strip()))
    return pairs


def parse_precision_arg(text: str | None, device: str = "cpu") -> tuple[str | None, dict[str, Policy]]:
    """The `--precision` argument: a SPEC, TYPE=SPEC pairs, or both (`bf16,VAE=f32`).

    Returns (default spec or None, per-type defaults). Every part is checked here, so a bad
    argument fails before anything runs.
    """
    if not text:
        return None, {}
    default: str | None = None
    typed: list[str] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        if "=" in item:
            typed.append(item)
        elif default is not None:
            raise PrecisionError(f"--precision {text!r}: two defaults ({default}, {item}); give one "
                                 f"SPEC and any number of TYPE=SPEC")
        else:
            parse_spec(item, device)
            default = item
    return default, parse_type_defaults(",".join(typed), device)


@dataclass(frozen=True)
class ParsedConfig:
    """A workflow's precision section, parsed: its default (None: the file sets none) and each
    region with its Policy, in the section's order."""

    default: Policy | None = None
    regions: tuple[tuple[Any, Policy], ...] = ()


def parse_config(config: Any, device: str = "cpu") -> ParsedConfig:
    """Parse a workflow's `PrecisionConfig`: its default SPEC and every region's SPEC.

    Every bad SPEC is a problem naming where it is (`precision default`, `precision of region
    'Sampling'`, or `precision of group 'Sampling'` for a tagged UI group: `Region.origin`); one
    `PrecisionError` lists them all. The check `load_workflow` runs and the `Resolver` parse are this one function.
    """
    if config is None:
        return ParsedConfig()
    problems: list[str] = []

    def parse(spec: Any, where: str) -> Policy | None:
        try:
            return parse_spec(spec, device)
        except PrecisionError as e:
            reason = str(e).removeprefix(f"precision {spec!r}: ")
            problems.append(f"{where} is {spec!r}: {reason}")
            return None

    default_spec = getattr(config, "default", None)
    default = parse(default_spec, "precision default") if default_spec is not None else None
    regions = []
    for region in getattr(config, "regions", ()) or ():
        origin = getattr(region, "origin", "region")
        policy = parse(region.precision, f"precision of {origin} {region.name!r}")
        if policy is not None:
            regions.append((region, policy))
    if problems:
        raise PrecisionError("; ".join(problems), tuple(problems))
    return ParsedConfig(default, tuple(regions))


# --- devices ------------------------------------------------------------------------------------

#: CPU flags (as /proc/cpuinfo and torch spell them) that make each kind of arithmetic native.
CPU_NATIVE_FLAGS = {
    "bf16": ("avx512_bf16", "amx_bf16"),
    "f16": ("avx512_fp16", "amx_fp16"),
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8"),
}
#: Environment variable that replaces the detected CPU flags (space or comma separated), so a run
#: (or the test suite) can pin what `auto` sees: `MIXGRAPH_CPU_FLAGS=avx2` acts as a CPU without
#: native half precision; `MIXGRAPH_CPU_FLAGS=avx512_bf16,avx512_vnni` as one with it.
CPU_FLAGS_ENV = "MIXGRAPH_CPU_FLAGS"


#: Which presets pick int8 on a CPU: rows (flags all present, presets that pick int8, evidence);
#: the first row whose flags the CPU has decides; a CPU matching no row keeps int8 out of every
#: preset (an explicit `int8` SPEC still runs it). A preset is listed only where int8
#: (`Int8Conv2d`'s oneDNN kernel, `Int8Linear`'s `torch._int_mm`) measured faster than what that
#: preset gives the role otherwise (native bf16 where there is one, else f32), and `balanced`
#: only where the picture holds too (>= 40 dB PSNR against f32 on random and trained weights);
#: benchmarks/README.md, "int8 on a VNNI CPU", has the numbers. Data, not a timing at run time,
#: so a preset resolves alike on every run of one machine. Only roles that name `cpu_int8` (the
#: SD UNet's `sd_unet`) consult it.
CPU_INT8_TABLE: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("amx_int8", "amx_bf16"), (),
     "AMX: int8 tiles not measured against AMX-BF16; bf16 kept"),
    (("avx512_vnni", "avx512_bf16"), (),
     "AVX512-VNNI with AVX512-BF16 (measured, AMD EPYC Zen 4): the int8 SD1.5 UNet runs at bf16's "
     "speed (1.06x / 0.95x bf16 per call at 256 / 512 px; int8:bf16 1.21x / 1.02x, 45.5 vs 50.2 dB "
     "on the embedded model); bf16 kept. DiT Linears gain more (a Flux slice 1.5x / 1.2x bf16) but "
     "lose 11 dB SNR on random weights, with no trained DiT to check: opt-in (int8, int8:bf16)"),
    (("avx512_vnni",), ("fast",),
     "AVX512-VNNI without bf16: the int8 SD1.5 UNet 2.8x (256 px) / 1.9x (512 px) faster than "
     "f32 on a VNNI CPU, int8 GEMM 2.7-3.6x f32 on Cascade Lake (issue 27): `fast`; `balanced` "
     "stays f32 (int8 PSNR vs f32 on the embedded model 48.5 dB mean, 23 of 24 pictures >= 43 dB, one "
     "drawn differently; 28 dB on random weights)"),
)


def cpu_int8_row(flags: frozenset[str] | set[str]) -> tuple[tuple[str, ...], str]:
    """(the presets that pick int8 on a CPU with `flags`, why): `CPU_INT8_TABLE`'s first
    matching row; no row: none."""
    for needed, presets, evidence in CPU_INT8_TABLE:
        if set(needed) <= set(flags):
            return presets, evidence
    native = sorted(set(CPU_NATIVE_FLAGS["int8"]) & set(flags))
    if native:
        return (), f"int8 native ({', '.join(native)}) but not measured faster (no row)"
    return (), "no native int8"


@dataclass(frozen=True)
class DeviceCaps:
    """What one device computes natively. `why` names the evidence (flags, compute capability)."""

    kind: str            # "cpu" | "cuda" | "mps" | ...
    native_bf16: bool
    native_f16: bool
    native_int8: bool = False
    name: str = ""
    why: str = ""
    #: the presets that pick int8 for the roles that ask for it (CPUs: `CPU_INT8_TABLE`)
    int8_presets: tuple[str, ...] = ()
    int8_why: str = ""

    def native(self, compute: torch.dtype) -> bool:
        """Whether half compute in `compute` is native (f32 always is)."""
        if compute == torch.bfloat16:
            return self.native_bf16
        if compute == torch.float16:
            return self.native_f16
        return True

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "native_bf16": self.native_bf16,
                "native_f16": self.native_f16, "native_int8": self.native_int8, "why": self.why,
                "int8_presets": list(self.int8_presets), "int8_why": self.int8_why}


def cpu_flags(cpuinfo: str | None = None, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The CPU's feature flags: `MIXGRAPH_CPU_FLAGS` when set (in `env`, default os.environ), else
    the `flags` line of /proc/cpuinfo (or the given `cpuinfo` text) joined with what torch's own
    CPU probe reports (it also works where /proc is missing)."""
    import os

    env = os.environ if env is None else env
    override = env.get(CPU_FLAGS_ENV)
    if override is not None:
        return frozenset(f for f in override.replace(",", " ").lower().split() if f)
    flags: set[str] = set()
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read(1 << 20)
        except OSError:
            cpuinfo = ""
        flags |= _torch_cpu_flags()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags |= set(value.lower().split())
            break
    return frozenset(flags)


def _torch_cpu_flags() -> set[str]:
    probe = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    try:
        caps = probe() if probe is not None else {}
    except Exception:  # noqa: BLE001 - an older torch without the probe: /proc/cpuinfo decides
        caps = {}
    return {k for k, v in caps.items() if v is True}


def cpu_caps_from_flags(flags: frozenset[str] | set[str], name: str = "cpu",
                        onednn: bool = True) -> DeviceCaps:
    """The decision table for a CPU: bf16 is native with AVX512-BF16 or AMX-BF16, f16 with
    AVX512-FP16 or AMX-FP16, int8 with VNNI (AVX512 or AVX) or AMX-INT8. Half precision needs
    torch's oneDNN (mkldnn) backend too: without it the same flags buy nothing. Whether the
    presets pick int8 is `CPU_INT8_TABLE`'s row (`int8_presets`, `int8_why`)."""
    got = {what: sorted(set(names) & set(flags)) for what, names in CPU_NATIVE_FLAGS.items()}
    bf16 = bool(got["bf16"]) and onednn
    f16 = bool(got["f16"]) and onednn
    int8 = bool(got["int8"])
    why = "; ".join(f"{what}: {', '.join(names) if names else 'no ' + '/'.join(CPU_NATIVE_FLAGS[what])}"
                    for what, names in got.items())
    if not onednn:
        why += "; torch built without oneDNN"
    presets, int8_why = cpu_int8_row(flags)
    if not onednn and presets:
        presets, int8_why = (), "torch built without oneDNN (its int8 convolution is what was measured)"
    return DeviceCaps("cpu", native_bf16=bf16, native_f16=f16, native_int8=int8, name=name, why=why,
                      int8_presets=presets, int8_why=int8_why)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "cpu"


@functools.lru_cache(maxsize=16)
def device_caps(device: str) -> DeviceCaps:
    """What `device` computes natively: CUDA from its compute capability (bf16 from 8.0, int8
    tensor cores from 7.5, f16 always), MPS bf16 where torch supports it (macOS 14+), a CPU from
    its flags (`cpu_flags`, `cpu_caps_from_flags`). An unavailable accelerator is treated as a CPU
    without native half precision."""
    d = torch.device(device)
    if d.type == "cuda" and torch.cuda.is_available():
        index = d.index or 0
        major, minor = torch.cuda.get_device_capability(index)
        return DeviceCaps("cuda", native_bf16=major >= 8, native_f16=True,
                          native_int8=(major, minor) >= (7, 5),
                          name=torch.cuda.get_device_name(index),
                          why=f"compute capability {major}.{minor}")
    if d.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        newer = getattr(mps, "is_macos_or_newer", None)
        bf16 = bool(mps is not None and mps.is_available() and newer is not None and newer(14, 0))
        return DeviceCaps("mps", native_bf16=bf16, native_f16=True, name="mps",
                          why="macOS 14+" if bf16 else "bf16 needs macOS 14+")
    if d.type == "cpu":
        return cpu_caps_from_flags(cpu_flags(), _cpu_name(), torch.backends.mkldnn.is_available())
    return DeviceCaps(d.type, native_bf16=False, native_f16=False, name=str(d),
                      why="device not available")


# --- presets: `auto` and the named policies, per precision role (graph/roles.py) ---------------

#: Named presets, usable wherever a SPEC is: `--precision`, envelopes, regions, group tags.
#: `auto` is `balanced`.
PRESETS = ("quality", "balanced", "memory", "fast")
PRESET_ALIASES = {"auto": "balanced"}


def preset_name(spec: str) -> str | None:
    """The preset a SPEC names (`auto` -> `balanced`), or None for a plain SPEC."""
    text = spec.strip().lower() if isinstance(spec, str) else ""
    text = PRESET_ALIASES.get(text, text)
    return text if text in PRESETS else None


def _native_half(caps: DeviceCaps) -> str | None:
    """The device's native half-precision compute, or None: bf16 where native (an accelerator's
    first), f16+upcast on CUDA without bf16 (f16 overflows in attention and norms)."""
    if caps.kind in ("cuda", "mps") and caps.native_bf16:
        return "bf16"
    if caps.kind == "cuda" and caps.native_f16:
        return "f16+upcast"
    return "bf16" if caps.native_bf16 else None


def _candidate(choice: str, caps: DeviceCaps, preset: str = "") -> str | None:
    """One of a role's candidates on a device: a `DEVICE_CHOICES` name evaluated, or the SPEC."""
    if choice == "native_half":
        return _native_half(caps)
    if choice == "accelerator_half":
        return _native_half(caps) if caps.kind in ("cuda", "mps") else None
    if choice == "native_f16":
        return "f16" if caps.native_f16 else None
    if choice == "native_bf16":
        return "bf16" if caps.native_bf16 else None
    if choice == "cpu_int8":
        return "int8" if caps.kind == "cpu" and preset in caps.int8_presets else None
    return choice


def preset_spec(preset: str, socket: str | None, caps: DeviceCaps, *, role: str | None = None) -> str:
    """The SPEC a preset gives one model socket type (or, given, one precision `role`) on a device.

    The socket type's role (`graph.roles`: the node library registers them; `socket=None` means
    the primary socket type) says what each preset gives it: the first of its candidates the
    device runs. The presets, as the node library's roles use them:

    quality  f32 everywhere (ComfyUI's CPU parity).
    balanced (= auto) the fastest native policy that keeps the picture: on CUDA (and MPS with bf16)
             bf16 where native, else f16+upcast on CUDA, for every model; on a CPU with native
             bf16 only the roles that ask for it (a denoiser) compute in bf16 (the NaN guard
             re-runs a non-finite step in f32), the others stay f32; a CPU without native bf16
             -> f32 everywhere.
    memory   the smallest storage that keeps the picture: 16-bit weights everywhere (fp8 costs
             visible detail), computing natively in half where the role asks for it, else
             `bf16:f32`.
    On a CPU whose `CPU_INT8_TABLE` row lists the preset, the roles that name `cpu_int8` (the
    SD UNet) get `int8` before native half.

    fast     the fastest native compute everywhere: native half (bf16, f16+upcast on CUDA
             without bf16), or f16 first where the role prefers it (an image decoder: the NaN
             guard is its fallback), else f32.
    """
    if preset not in PRESETS:
        raise PrecisionError(f"unknown precision preset {preset!r}; presets: {', '.join(PRESETS)}, auto")
    if role is None:
        role = ROLES.role_of(socket if socket is not None else ROLES.primary)
    for choice in ROLES.presets(role).candidates(preset):
        spec = _candidate(choice, caps, preset)
        if spec is not None:
            return spec
    return "f32"


def auto_spec(device: str, socket: str | None = None, caps: DeviceCaps | None = None) -> str:
    """What `auto` gives `socket` (default: the primary socket type) on `device` (or on the
    capabilities `caps`)."""
    return preset_spec("balanced", socket, caps or device_caps(device))


def preset_table(device: str = "cpu", caps: DeviceCaps | None = None,
                 sockets: tuple[str, ...] | None = None) -> dict[str, dict[str, str]]:
    """{preset: {socket type: SPEC}} on a device, for `sockets` (default: every socket type the
    node library gave a role), each further role of a socket type as `TYPE.role` (a CLIP's large
    encoders: `CLIP.text_large`): what `nodes --json`, `/system_stats` and the benchmarks print."""
    caps = caps or device_caps(device)
    sockets = ROLES.sockets() if sockets is None else sockets
    keys = [(s, None) for s in sockets] + [(s, r) for s in sockets for r in ROLES.roles_of(s)[1:]]
    return {p: {(s if r is None else f"{s}.{r}"): preset_spec(p, s, caps, role=r) for s, r in keys}
            for p in PRESETS}


def emulation_warning(policy: Policy, device: str, caps: DeviceCaps | None = None) -> str | None:
    """The one-line warning for a compute dtype the device only emulates (half precision, or int8
    without VNNI/AMX), else None. It names what is lost: speed, not the memory saving."""
    caps = caps or device_caps(device)
    if policy.int8 and not caps.native_int8:
        return (f"int8 on {device} is emulated (no VNNI/AMX-INT8): expect it slower than f32; "
                f"it still stores Linear and conv weights in a quarter of the memory")
    if not policy.is_half or caps.native(policy.compute):
        return None
    name = _NAMES[policy.compute]
    hint = "/".join(CPU_NATIVE_FLAGS["bf16" if policy.compute == torch.bfloat16 else "f16"]) \
        if caps.kind == "cpu" else caps.why
    return (f"{name} compute on {device} is emulated ({'no ' + hint if caps.kind == 'cpu' else hint}): "
            f"it will be slower than f32 and saves memory only")


def hardware_section(device: str = "cpu") -> dict[str, Any]:
    """The `precision` section of `mixgraph nodes --json`'s system part, `/system_stats` and
    `bench precision`: the device's native arithmetic and what each preset resolves to."""
    caps = device_caps(device)
    return {"device": device, **caps.to_json(), "auto": preset_table(caps=caps)["balanced"],
            "presets": preset_table(caps=caps)}


# --- resolution ---------------------------------------------------------------------------------

class NodePrecision:
    """The policies one node gets, per model socket type and role (resolved lazily, memoized)."""

    __slots__ = ("_resolver", "_region", "_cache")

    def __init__(self, resolver: "Resolver", region: Any):
        self._resolver = resolver
        self._region = region
        self._cache: dict[Any, Policy] = {}

    def for_type(self, socket: str, role: str | None = None) -> Policy:
        """The policy for a model of socket type `socket`; `role` names one of the socket type's
        registered roles other than its own (`graph.roles`), which presets then decide for."""
        key = socket if role is None else (socket, role)
        p = self._cache.get(key)
        if p is None:
            p = self._cache[key] = self._resolver._policy(self._region, socket, role)
        return p

    @property
    def region(self) -> str | None:
        return None if self._region is None else self._region.name


class Resolver:
    """Resolves each node's precision for one run (see the module docstring for the order).

    `config` is a workflow's `PrecisionConfig` (or None); `type_defaults` maps socket types to
    Policies or SPECs; `cli_default` is the run's default SPEC (beats the file's default).
    A preset SPEC (`auto`, `memory`, ...) as the default, a region's SPEC or a type default
    resolves per precision role (`preset_spec`): the socket type's own role, or the `role` a
    caller names. `warned` is a set shared across runs so the emulation warning is given once;
    new warnings collect in `self.warnings`. `caps` replaces the device's detected capabilities
    (tests, `mixgraph estimate` for another machine).
    """

    def __init__(self, config: Any = None, type_defaults: Mapping[str, Any] | str | None = None,
                 cli_default: str | None = None, device: str = "cpu", warned: set | None = None,
                 caps: DeviceCaps | None = None):
        self.device = device
        self.caps = caps or device_caps(device)
        self.warnings: list[str] = []
        self._warned = warned if warned is not None else set()
        self._memo: dict[tuple[str, str | None, str | None], Policy] = {}
        if isinstance(type_defaults, str):
            parse_type_defaults(type_defaults, device)  # checks the names and SPECs
            type_defaults = dict(_split_assignments(type_defaults))
        # as given (a SPEC or a Policy): a preset type default resolves per role asked for
        self._type_specs: dict[str, Any] = {k.upper(): v for k, v in (type_defaults or {}).items()}
        self.type_defaults: dict[str, Policy] = {
            k: (v if isinstance(v, Policy) else self._parse(v, k))
            for k, v in self._type_specs.items()}
        parsed = parse_config(config, device)
        file_default = getattr(config, "default", None) if config is not None else None
        self.default_spec = cli_default or file_default or "auto"
        self._default_preset = preset_name(self.default_spec)
        self.default = self._parse(self.default_spec, None)   # a preset: the primary socket type's
        # Innermost first: the smallest set wins; among equals the later-listed region wins.
        ordered = sorted(enumerate(parsed.regions), key=lambda ir: (len(ir[1][0].nodes), -ir[0]))
        self._region_of: dict[str, Any] = {}
        for _, (region, policy) in ordered:
            for nid in region.nodes:
                self._region_of.setdefault(str(nid), region)
        self._region_spec = {id(r): r.precision for r, _ in parsed.regions}
        for _, (region, _p) in ordered:
            for socket, role in self._targets(region.precision):
                self._note(self._parse(region.precision, socket, role))
        for socket, role in self._targets(self.default_spec):
            self._note(self._parse(self.default_spec, socket, role))
        for p in self.type_defaults.values():
            self._note(p)

    @staticmethod
    def _targets(spec: str) -> list[tuple[str | None, str | None]]:
        """The (socket type, role) pairs a SPEC can resolve differently for: every registered
        one for a preset (the default role alone when none is), one for a plain SPEC."""
        if not preset_name(spec):
            return [(None, None)]
        return [(s, r) for s in ROLES.sockets() for r in ROLES.roles_of(s)] or [(None, None)]

    def _parse(self, spec: str, socket: str | None, role: str | None = None) -> Policy:
        """A SPEC for one socket type (and role) on this resolver's device capabilities."""
        key = (spec, socket, role)
        p = self._memo.get(key)
        if p is None:
            preset = preset_name(spec)
            text = preset_spec(preset, socket, self.caps, role=role) if preset else spec
            p = self._memo[key] = parse_spec(text, self.device)
        return p

    def _note(self, policy: Policy) -> None:
        msg = emulation_warning(policy, self.device, self.caps)
        if msg and msg not in self._warned:
            self._warned.add(msg)
            self.warnings.append(msg)

    def _policy(self, region: Any, socket: str, role: str | None = None) -> Policy:
        if region is not None:
            return self._parse(self._region_spec[id(region)], socket, role)
        p = self.type_defaults.get(socket)
        if p is not None:
            if role is None:
                return p
            given = self._type_specs[socket]
            return p if isinstance(given, Policy) else self._parse(given, socket, role)
        if self._default_preset is None:
            return self.default
        return self._parse(self.default_spec, socket, role)

    def region_of(self, node_id: str) -> Any:
        return self._region_of.get(node_id)

    def resolve(self, node_id: str, spec: Any = None) -> NodePrecision:
        """The node's precision: `.for_type(socket)` gives the Policy for a model socket type."""
        return NodePrecision(self, self._region_of.get(node_id))

    def policy(self, node_id: str, socket: str, role: str | None = None) -> Policy:
        return self._policy(self._region_of.get(node_id), socket, role)

    def key_spec(self, node_id: str, socket: str) -> str:
        """What a node's cache key holds for one of its precision types: the policy's SPEC, and
        for a socket type with further registered roles each of theirs (`|role=SPEC`), since
        the node may ask for any of them."""
        region = self._region_of.get(node_id)
        spec = self._policy(region, socket).spec
        roles = ROLES.roles_of(socket)
        if len(roles) < 2:
            return spec
        return spec + "".join(f"|{r}={self._policy(region, socket, r).spec}" for r in roles[1:])

    def describe(self) -> dict[str, Any]:
        """A summary for reports and logs; a preset default lists what it gave each type."""
        out = {"default": self.default.spec, "device": self.device,
               "types": {k: v.spec for k, v in self.type_defaults.items()},
               "regions": sorted({r.name for r in self._region_of.values()})}
        if self._default_preset is not None:
            out["preset"] = self.default_spec.strip().lower()
            out["preset_types"] = {s: self._parse(self.default_spec, s).spec
                                   for s in ROLES.sockets()}
        return out
