"""Precision as data: the SPEC grammar, the `Policy` type and the resolver. The one home for both.

A SPEC names how a model's weights are stored and what dtype its layers compute in:

    SPEC   := "auto" | "int8" | STORE [":" COMPUTE] ("+" FLAG)*
    STORE  := f32 | bf16 | f16 | fp8_e4m3fn | fp8_e5m2        (fp32/fp16/float32/... accepted)
    COMPUTE:= f32 | bf16 | f16                                 (default: the storage dtype)
    FLAG   := upcast (= upcast_attention + f32_norms) | upcast_attention | f32_norms

Examples: `f32`, `bf16`, `bf16:f32` (store bf16, compute f32), `fp8_e4m3fn:bf16`, `f16+upcast`.
fp8 formats are storage only, so an fp8 SPEC must name its compute dtype.

Resolution for one node and one model socket type, most specific first (DESIGN §4):
  1. a precision-cast node on the model handle (applied by the node library, not here);
  2. the innermost precision region holding the node (the smallest node set among those that
     hold it; equal sizes: the region listed later wins);
  3. the per-socket-type default (`--precision MODEL=bf16,VAE=f32`);
  4. the workflow default: the command line / API `precision=` when given, else the workflow
     file's `precision.default` (an explicit request for this run beats what the file suggests);
  5. `auto`: native bf16 (CUDA compute capability >= 8) -> bf16; CUDA without bf16 ->
     f16+upcast; anything else (CPU, where half precision is emulated and several times slower
     than f32) -> f32.

Policies are plain frozen data; `nodes/models/cast.py` reads them duck-typed (`PolicyLike`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Mapping

import torch

__all__ = [
    "Policy", "PrecisionError", "F32", "parse_spec", "format_spec", "parse_type_defaults",
    "parse_precision_arg", "DeviceCaps", "device_caps", "auto_spec", "emulation_warning",
    "Resolver", "NodePrecision",
]


class PrecisionError(ValueError):
    """A SPEC that cannot be parsed or used; the message says what is allowed."""


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

    def as_f32_compute(self) -> "Policy":
        """Same storage, f32 compute: what the NaN guard re-runs a node with."""
        if self.compute == torch.float32:
            return self
        return _make(self.storage, torch.float32, self.upcast_attention, self.f32_norms, self.int8)

    def with_storage(self, storage: torch.dtype) -> "Policy":
        """Same compute, other storage (a loader that pins how weights are kept, e.g. fp8)."""
        if storage == self.storage or self.int8:
            return self
        return _make(storage, self.compute, self.upcast_attention, self.f32_norms)

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
        file_default = getattr(config, "default", None) if config is not None else None
        self.default_spec = cli_default or file_default or "auto"
        self.default = parse_spec(self.default_spec, device)
        regions = tuple(getattr(config, "regions", ()) or ()) if config is not None else ()
        # Innermost first: the smallest set wins; among equals the later-listed region wins.
        ordered = sorted(enumerate(regions), key=lambda ir: (len(ir[1].nodes), -ir[0]))
        self._region_of: dict[str, Any] = {}
        for _, region in ordered:
            policy = parse_spec(region.precision, device)  # fail early on a bad region spec
            self._note(policy)
            for nid in region.nodes:
                self._region_of.setdefault(str(nid), region)
        self._region_policy = {id(r): parse_spec(r.precision, device) for r in regions}
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
