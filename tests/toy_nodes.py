"""Tiny real nodes for engine tests, registered into a local Registry (never the global one).

`CALLS` counts executions per class, so tests can see exactly what ran.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Float, Int, Result, Socket, String, node
from mixgraph.graph.registry import Registry
from mixgraph.graph.spec import Hidden

CALLS: Counter = Counter()
_random = itertools.count(1000)


@node(outputs=["INT"], register=False)
def Const(value=Int(0, min=-10**9, max=10**9)):
    CALLS["Const"] += 1
    return value


@node(outputs=["INT"], register=False)
def Add(a=Socket("INT"), b=Socket("INT")):
    CALLS["Add"] += 1
    return a + b


@node(outputs=["INT"], register=False)
def Mul(a=Socket("INT"), factor=Int(2, min=-100, max=100)):
    CALLS["Mul"] += 1
    return a * factor


def _text_fingerprint(env, path=None, **_):
    return fingerprint_file(Path(env.input) / path)


@node(outputs=["STRING"], fingerprint=_text_fingerprint, register=False)
def ReadText(path=String("a.txt"), ctx=None):
    CALLS["ReadText"] += 1
    return (Path(ctx.env.input) / path).read_text()


@node(outputs=["INT"], register=False)
def Fail(x=Socket("INT"), message=String("boom")):
    CALLS["Fail"] += 1
    raise RuntimeError(message)


@dataclass(frozen=True)
class ToyModel:
    weight: torch.Tensor  # [4] float32


@node(outputs=["MODEL"], register=False)
def ToyModelLoader(scale=Float(1.0, min=-10.0, max=10.0)):
    CALLS["ToyModelLoader"] += 1
    return ToyModel(torch.full((4,), float(scale)))


@node(outputs=["IMAGE"], register=False)
def NanIfHalf(model=Socket("MODEL"), x=Socket("INT"), ctx=None):
    """Behaves like a model that overflows in half precision: NaN unless compute is f32."""
    CALLS["NanIfHalf"] += 1
    policy = ctx.policy_for("MODEL")
    ctx.used_precision(policy)
    out = model.weight * x
    if policy.is_half:
        out = out.clone()
        out[0] = float("nan")
    return out


@node(outputs=["IMAGE"], register=False)
def AlwaysNan(model=Socket("MODEL"), ctx=None):
    CALLS["AlwaysNan"] += 1
    ctx.used_precision(ctx.policy_for("MODEL"))
    return torch.full((2,), float("nan"))


@node(outputs=["INT"], precision_types=("VAE",), register=False)
def AddIfHalfVae(x=Socket("INT"), ctx=None):
    """Reads the VAE policy with no VAE input (declared): x + 1 when VAE compute is half."""
    CALLS["AddIfHalfVae"] += 1
    return x + int(ctx.policy_for("VAE").is_half)


@node(outputs=["INT"], register=False)
def AsksUndeclared(x=Socket("INT"), ctx=None):
    CALLS["AsksUndeclared"] += 1
    ctx.policy_for("VAE")
    return x


@node(outputs=["INT"], register=False)
def Slow(x=Socket("INT"), steps=Int(50, min=1, max=10**6), ctx=None):
    CALLS["Slow"] += 1
    for i in range(steps):
        ctx.progress(i + 1, steps)
    return x


@node(outputs=["INT"], register=False)
def CtrlC(x=Socket("INT")):
    """Stands in for the user pressing Ctrl-C while a node runs."""
    CALLS["CtrlC"] += 1
    raise KeyboardInterrupt


@node(outputs=["INT"], deterministic=False, register=False)
def Random(x=Socket("INT")):
    CALLS["Random"] += 1
    return x + next(_random)


@node(output_node=True, register=False)
def Show(value=Socket("INT")):
    CALLS["Show"] += 1
    return Result((), {"text": [str(value)]})


@node(output_node=True, register=False)
def ShowText(text=Socket("STRING")):
    CALLS["ShowText"] += 1
    return Result((), {"text": [text]})


@node(output_node=True, register=False)
def ShowImage(image=Socket("IMAGE")):
    CALLS["ShowImage"] += 1
    return Result((), {"text": [str(image.tolist())]})


@node(output_node=True, register=False)
def SaveNumber(value=Socket("INT"), filename_prefix=String("num"), ctx=None,
               unique_id=Hidden("UNIQUE_ID")):
    """Writes the number to `<output>/<prefix>_<node id>.txt` and lists it like SaveImage."""
    CALLS["SaveNumber"] += 1
    out = Path(ctx.env.output)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{filename_prefix}_{unique_id}.txt"
    (out / name).write_text(str(value))
    return Result((), {"images": [{"filename": name, "subfolder": "", "type": "output"}]})


ALL = [Const, Add, Mul, ReadText, Fail, CtrlC, ToyModelLoader, NanIfHalf, AlwaysNan, AddIfHalfVae,
       AsksUndeclared, Slow, Random, Show, ShowText, ShowImage, SaveNumber]


def registry() -> Registry:
    reg = Registry()
    for fn in ALL:
        reg.add(fn.spec)
    return reg


def link(node_id, slot=0) -> list:
    return [str(node_id), slot]


def call(class_type: str, **inputs) -> dict:
    return {"class_type": class_type, "inputs": inputs}
