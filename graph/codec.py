"""The tensor-tree codec of the persistent output cache (DESIGN §5, last bullet).

A node's outputs are turned into named tensors plus a JSON tree that says where each tensor sits,
and back. The tree holds only what it can rebuild exactly: None, bools, ints, floats (NaN and
infinities included), strings, tuples, lists, dicts with scalar keys, CPU tensors, and instances
of dataclasses that were registered by name. Anything else (a model handle, a ControlNet chain, an
`ExecutionBlocker`, a subclass of list) raises `Unencodable`, and the persistent cache simply does
not store that result: refusing is always safe, guessing never is.

The engine knows nothing of the payloads: the node layer declares, per socket type name, which
outputs are worth storing and registers the dataclasses their values are made of:

    CODEC.declare("LATENT", Latent)                 # a payload type, its dataclass
    CODEC.declare("INT", payload=False)             # may ride along with a payload type

`storable(types)` is true when every declared output type of a node is declared and at least one
of them is a payload type. Registered classes are looked up by the name they were registered
under; nothing is ever imported by name, and nothing is unpickled.

Why hand-written: safetensors stores flat name -> tensor maps; the structure around the tensors
(frozen dataclasses, tuples of conds) needs a small, closed, JSON-only description of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from typing import Any, Iterable, Mapping

import torch

__all__ = ["TreeCodec", "CODEC", "Unencodable", "Undecodable", "FORMAT"]

#: Changes whenever the tree format changes; blobs of another format are misses.
FORMAT = "mixgraph-outputs/1"
_MAX_DEPTH = 64


class Unencodable(TypeError):
    """A value the codec cannot store exactly; the result is not persisted."""


class Undecodable(ValueError):
    """A stored tree that does not describe a value this process can rebuild (a miss)."""


class TreeCodec:
    """Socket types worth persisting, the dataclasses their values may hold, and the codec.
    Thread-safe to declare into; encoding and decoding need no lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._classes: dict[str, type] = {}
        self._names: dict[type, str] = {}
        self._payload: set[str] = set()
        self._plain: set[str] = set()

    # --- declarations ----------------------------------------------------------------------

    def declare(self, socket_type: str, *classes: type, payload: bool = True) -> None:
        """Outputs of `socket_type` may be stored; their values may hold `classes`. A payload
        type is worth a blob on its own; a plain one (INT, STRING...) only rides along."""
        self.register(*classes)
        with self._lock:
            (self._payload if payload else self._plain).add(socket_type)
            if payload:
                self._plain.discard(socket_type)

    def register(self, *classes: type, name: str | None = None) -> None:
        """Dataclasses the codec may rebuild, under `module.qualname` (or `name`, for one)."""
        for cls in classes:
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                raise TypeError(f"{cls!r} is not a dataclass; only dataclasses can be registered")
            if any(not f.init for f in dataclasses.fields(cls)):
                raise TypeError(f"{cls.__qualname__} has fields its constructor does not take")
            label = name if name and len(classes) == 1 else f"{cls.__module__}.{cls.__qualname__}"
            with self._lock:
                known = self._classes.get(label)
                if known is not None and known is not cls:
                    raise ValueError(f"another class is already registered as {label!r}")
                self._classes[label] = cls
                self._names[cls] = label

    def storable(self, types: Iterable[str]) -> bool:
        """Whether a node with these output types is stored at all."""
        types = tuple(types)
        payload, plain = self._payload, self._plain
        return any(t in payload for t in types) and all(t in payload or t in plain for t in types)

    def declared(self) -> dict[str, list[str]]:
        return {"payload": sorted(self._payload), "plain": sorted(self._plain)}

    # --- encoding ------------------------------------------------------------------------------

    def encode(self, value: Any) -> tuple[dict[str, torch.Tensor], str]:
        """`value` as (named CPU tensors, JSON tree). Raises Unencodable."""
        tensors: dict[str, torch.Tensor] = {}
        by_id: dict[int, str] = {}
        storages: set[int] = set()

        def tensor(t: torch.Tensor) -> dict:
            name = by_id.get(id(t))
            if name is None:
                name = by_id[id(t)] = str(len(tensors))
                tensors[name] = _standalone(t, storages)
            return {"tensor": name}

        def enc(o: Any, depth: int) -> Any:
            if o is None or type(o) in (bool, int, str):
                return o
            if type(o) is float:
                return o if math.isfinite(o) else {"float": repr(o)}
            if depth > _MAX_DEPTH:
                raise Unencodable(f"nested deeper than {_MAX_DEPTH} levels")
            t = type(o)
            if t is torch.Tensor:
                return tensor(o)
            if t is tuple:
                return {"tuple": [enc(x, depth + 1) for x in o]}
            if t is list:
                return {"list": [enc(x, depth + 1) for x in o]}
            if t is dict:
                items = []
                for k, v in o.items():
                    if not (k is None or type(k) in (bool, int, float, str)):
                        raise Unencodable(f"dict key of type {type(k).__qualname__}")
                    items.append([enc(k, depth + 1), enc(v, depth + 1)])
                return {"dict": items}
            label = self._names.get(t)
            if label is None:
                raise Unencodable(f"{t.__module__}.{t.__qualname__} is not a registered payload "
                                  f"class")
            return {"dc": label, "f": {f.name: enc(getattr(o, f.name), depth + 1)
                                       for f in dataclasses.fields(o)}}

        tree = enc(value, 0)
        return tensors, json.dumps(tree, separators=(",", ":"), ensure_ascii=False)

    # --- decoding ------------------------------------------------------------------------------

    def decode(self, tensors: Mapping[str, torch.Tensor], tree: str) -> Any:
        """The value `encode` was given. Raises Undecodable for a tree it cannot rebuild."""
        try:
            parsed = json.loads(tree)
        except ValueError as e:
            raise Undecodable(f"tree is not JSON: {e}") from None

        def dec(o: Any, depth: int) -> Any:
            if o is None or type(o) in (bool, int, float, str):
                return o
            if depth > _MAX_DEPTH + 1 or type(o) is not dict or len(o) not in (1, 2):
                raise Undecodable(f"unexpected node {str(o)[:80]!r}")
            if "tensor" in o:
                t = tensors.get(o["tensor"])
                if t is None:
                    raise Undecodable(f"tensor {o['tensor']!r} is missing")
                return t
            if "tuple" in o:
                return tuple(dec(x, depth + 1) for x in _items(o["tuple"]))
            if "list" in o:
                return [dec(x, depth + 1) for x in _items(o["list"])]
            if "dict" in o:
                out = {}
                for pair in _items(o["dict"]):
                    if type(pair) is not list or len(pair) != 2:
                        raise Undecodable("bad dict item")
                    out[dec(pair[0], depth + 1)] = dec(pair[1], depth + 1)
                return out
            if "float" in o:
                try:
                    return float(o["float"])
                except (TypeError, ValueError):
                    raise Undecodable(f"bad float {o['float']!r}") from None
            if "dc" in o:
                cls = self._classes.get(o["dc"])
                if cls is None:
                    raise Undecodable(f"class {o['dc']!r} is not registered in this process")
                fields = o.get("f")
                if type(fields) is not dict:
                    raise Undecodable("bad dataclass fields")
                try:
                    return cls(**{k: dec(v, depth + 1) for k, v in fields.items()})
                except TypeError as e:   # the class changed since the blob was written
                    raise Undecodable(f"cannot rebuild {o['dc']}: {e}") from None
            raise Undecodable(f"unknown node {str(o)[:80]!r}")

        return dec(parsed, 0)


def _items(x: Any) -> list:
    if type(x) is not list:
        raise Undecodable("expected a list")
    return x


def _standalone(t: torch.Tensor, storages: set[int]) -> torch.Tensor:
    """`t` on the CPU, owning exactly its own bytes (a view or a shared storage is copied), so a
    blob holds only what the value holds."""
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.is_sparse or t.layout != torch.strided or t.is_quantized:
        raise Unencodable(f"{t.layout} tensors are not stored")
    st = t.untyped_storage()
    ptr = st.data_ptr()
    whole = t.is_contiguous() and t.storage_offset() == 0 and \
        st.nbytes() == t.numel() * t.element_size()
    if not whole or ptr in storages or t.numel() == 0:
        t = t.clone(memory_format=torch.contiguous_format)
        ptr = t.untyped_storage().data_ptr()
    if t.numel():
        storages.add(ptr)
    return t


#: The process-wide codec; the node layer declares its payload types into it.
CODEC = TreeCodec()
