"""Precision as data: the SPEC grammar, the `Policy` type and the resolver. The one home for both.

A SPEC names how a model's weights are stored and what dtype its layers compute in:

    SPEC   := "auto" | "int8" | STORE [":" COMPUTE] ("+" FLAG)*
    STORE  := f32 | bf16 | f16 | fp8_e4m3fn | fp8_e5m2        (fp32/fp16/float32/... accepted)
    COMPUTE:= f32 | bf16 | f16                                 (default: the storage dtype)
    FLAG   := upcast (= upcast_attention + f32_norms) | upcast_attention | f32_norms

Examples: `f32`, `bf16`, `bf16:f32` (store bf16, compute f32), `fp8_e4m3fn:bf16`, `f16+upcast`.
fp8 formats are storage only, so an fp8 SPEC must name its compute dtype.

Resolution for one node and one model socket type, most specific first (DESIGN §4):
  1. a precision-cast node on the model handle (the handle's `precision`, passed to `resolve`);
  2. the innermost precision region holding the node (the smallest node set among those that
     hold it; equal sizes: the region listed later wins);
  3. the per-socket-type default (`--precision MODEL=bf16,VAE=f32`);
  4. the workflow default: the command line / API `precision=` when given, else the workflow
     file's `precision.default` (an explicit request for this run beats what the file suggests);
  5. `auto`: native bf16 (CUDA compute capability >= 8) -> bf16; CUDA without bf16 ->
     f16+upcast; anything else (CPU, where half precision is emulated and several times slower
     than f32) -> f32.

Every rule lives here once:
- the grammar: `parse_spec` (SPEC -> Policy), `parse_precision_arg` (`--precision`, `TYPE=SPEC`),
  `parse_config` (a workflow's default and regions: every problem, each named by where it is;
  `load_workflow` runs it, so `validate`, `run`, `serve` and `bench` accept the same files);
- the per-workflow order 2-5: `Resolver` (region > type default > default > auto);
- the per-use rules, in `resolve`: the handle's pinned precision beats the resolved one, a loader's
  pinned storage dtype (UNETLoader's `weight_dtype`) replaces the storage (and turns int8 off: see
  `resolve`), and a NaN-guard re-run computes in f32. Node bodies reach it through
  `Context.policy_for` (`nodes/precision.py: effective`); the executor calls it for the re-run's
  report. A model handle receives the finished policy and applies it as given.

Policies are plain frozen data; `nodes/models/cast.py` reads them duck-typed (`PolicyLike`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

__all__ = [
    "Policy", "PrecisionError", "F32", "parse_spec", "format_spec", "parse_type_defaults",
    "parse_precision_arg", "parse_config", "ParsedConfig", "resolve", "DeviceCaps", "device_caps",
    "auto_spec", "emulation_warning", "Resolver", "NodePrecision",
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
           "+upcast / +upcast_attention / +f32_norms flags (e.g. f16+upcast), int8, auto")


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
        return "int8"
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
            f32_compute: bool = False, warn: Callable[[str], None] | None = None) -> Policy:
    """The policy one model runs under in one node: the one home of the per-use rules.

    base:        what the `Resolver` gave the node for the model's socket type.
    pinned:      the handle's own precision (a `Set*Precision` node); beats `base`.
    storage:     a storage dtype the loader pinned (UNETLoader's `weight_dtype`); it replaces the
                 storage of whichever policy won, keeping its compute dtype and flags. int8 is a
                 storage format too (int8 Linear weights, f32 for the rest) and cannot hold the
                 pinned dtype, so the pin wins: the model stores `storage` and computes in f32,
                 int8's compute dtype (`int8` + fp8_e4m3fn -> `fp8_e4m3fn:f32`), and `warn` is
                 told. What the report names is then what is stored and computed.
    f32_compute: a NaN-guard re-run: same storage and flags, f32 compute; beats everything.
    """
    policy = _as_policy(pinned if pinned is not None else base)
    if storage is not None and (storage != policy.storage or policy.int8):
        if storage not in _NAMES:
            raise PrecisionError(f"pinned storage dtype {storage} is not one of "
                                 f"{', '.join(_NAMES.values())}")
        if policy.int8 and warn is not None:
            name = _NAMES[storage]
            warn(f"int8 does not combine with the loader's weight_dtype {name}: the model is "
                 f"stored {name} and computes in f32 ({name}:f32), without int8 layers")
        policy = _make(storage, policy.compute, policy.upcast_attention, policy.f32_norms)
    if f32_compute and policy.compute != torch.float32:
        policy = _make(policy.storage, torch.float32, policy.upcast_attention, policy.f32_norms,
                       policy.int8)
    return policy


@functools.lru_cache(maxsize=256)
def parse_spec(spec: str, device: str = "cpu") -> Policy:
    """Parse a SPEC into a Policy; `auto` is resolved for `device`."""
    if not isinstance(spec, str) or not spec.strip():
        raise PrecisionError(f"empty precision spec; allowed: {ALLOWED}")
    text = spec.strip().lower()
    if text == "auto":
        return parse_spec(auto_spec(device), device)
    if text == "int8":
        # Dynamic int8 Linear layers (weights int8, activations quantized per call, f32 math);
        # every other layer keeps f32 weights, hence storage f32.
        return _make(torch.float32, torch.float32, int8=True)
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
        out[socket.upper()] = parse_spec(spec, device)
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

@dataclass(frozen=True)
class DeviceCaps:
    kind: str            # "cpu" | "cuda" | "mps" | ...
    native_bf16: bool
    native_f16: bool


@functools.lru_cache(maxsize=16)
def device_caps(device: str) -> DeviceCaps:
    d = torch.device(device)
    if d.type == "cuda" and torch.cuda.is_available():
        major, _minor = torch.cuda.get_device_capability(d.index or 0)
        return DeviceCaps("cuda", native_bf16=major >= 8, native_f16=True)
    if d.type == "mps":
        return DeviceCaps("mps", native_bf16=False, native_f16=True)
    # CPUs (and an unavailable accelerator) emulate half precision: convolutions run several
    # times slower than in f32, so half precision only saves memory there.
    return DeviceCaps(d.type, native_bf16=False, native_f16=False)


def auto_spec(device: str) -> str:
    caps = device_caps(device)
    if caps.native_bf16:
        return "bf16"
    if caps.native_f16 and caps.kind == "cuda":
        return "f16+upcast"
    return "f32"


def emulation_warning(policy: Policy, device: str) -> str | None:
    """The one-line warning for half compute on a device that only emulates it, else None."""
    if not policy.is_half:
        return None
    caps = device_caps(device)
    native = caps.native_bf16 if policy.compute == torch.bfloat16 else caps.native_f16
    if native:
        return None
    name = _NAMES[policy.compute]
    return (f"{name} compute on {device} is emulated: it will be slower than f32 and saves memory "
            f"only")


# --- resolution ---------------------------------------------------------------------------------

class NodePrecision:
    """The policies one node gets, per model socket type (resolved lazily, memoized)."""

    __slots__ = ("_resolver", "_region", "_cache")

    def __init__(self, resolver: "Resolver", region: Any):
        self._resolver = resolver
        self._region = region
        self._cache: dict[str, Policy] = {}

    def for_type(self, socket: str) -> Policy:
        p = self._cache.get(socket)
        if p is None:
            p = self._cache[socket] = self._resolver._policy(self._region, socket)
        return p

    @property
    def region(self) -> str | None:
        return None if self._region is None else self._region.name


class Resolver:
    """Resolves each node's precision for one run (see the module docstring for the order).

    `config` is a workflow's `PrecisionConfig` (or None); `type_defaults` maps socket types to
    Policies or SPECs; `cli_default` is the run's default SPEC (beats the file's default).
    `warned` is a set shared across runs so the emulation warning is given once; new warnings
    collect in `self.warnings`.
    """

    def __init__(self, config: Any = None, type_defaults: Mapping[str, Any] | str | None = None,
                 cli_default: str | None = None, device: str = "cpu", warned: set | None = None):
        self.device = device
        self.warnings: list[str] = []
        self._warned = warned if warned is not None else set()
        if isinstance(type_defaults, str):
            type_defaults = parse_type_defaults(type_defaults, device)
        self.type_defaults: dict[str, Policy] = {
            k.upper(): (v if isinstance(v, Policy) else parse_spec(v, device))
            for k, v in (type_defaults or {}).items()}
        parsed = parse_config(config, device)
        file_default = getattr(config, "default", None) if config is not None else None
        self.default_spec = cli_default or file_default or "auto"
        if cli_default:
            self.default = parse_spec(cli_default, device)
        else:
            self.default = parsed.default or parse_spec("auto", device)
        # Innermost first: the smallest set wins; among equals the later-listed region wins.
        ordered = sorted(enumerate(parsed.regions), key=lambda ir: (len(ir[1][0].nodes), -ir[0]))
        self._region_of: dict[str, Any] = {}
        for _, (region, policy) in ordered:
            self._note(policy)
            for nid in region.nodes:
                self._region_of.setdefault(str(nid), region)
        self._region_policy = {id(r): p for r, p in parsed.regions}
        for p in (self.default, *self.type_defaults.values()):
            self._note(p)

    def _note(self, policy: Policy) -> None:
        msg = emulation_warning(policy, self.device)
        if msg and msg not in self._warned:
            self._warned.add(msg)
            self.warnings.append(msg)

    def _policy(self, region: Any, socket: str) -> Policy:
        if region is not None:
            return self._region_policy[id(region)]
        return self.type_defaults.get(socket, self.default)

    def region_of(self, node_id: str) -> Any:
        return self._region_of.get(node_id)

    def resolve(self, node_id: str, spec: Any = None) -> NodePrecision:
        """The node's precision: `.for_type(socket)` gives the Policy for a model socket type."""
        return NodePrecision(self, self._region_of.get(node_id))

    def policy(self, node_id: str, socket: str) -> Policy:
        return self._policy(self._region_of.get(node_id), socket)

    def describe(self) -> dict[str, Any]:
        """A summary for reports and logs."""
        return {"default": self.default.spec, "device": self.device,
                "types": {k: v.spec for k, v in self.type_defaults.items()},
                "regions": sorted({r.name for r in self._region_of.values()})}
