"""Tiny real nodes for engine tests, registered into a local Registry (never the global one).

`CALLS` counts executions per class, so tests can see exactly what ran.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from mixgraph.graph.blocker import ExecutionBlocker
from mixgraph.graph.fingerprint import fingerprint_file
from mixgraph.graph.node import Boolean, Float, Int, Result, Socket, String, node
from mixgraph.graph.registry import Registry
from mixgraph.graph.spec import Hidden, Output, register_socket_type

# The engine knows no model socket type; the toy nodes register the two they hold models on.
# They use the node library's names with the library's definitions (registering the same
# definition twice is a no-op), so precision arguments in the engine tests read as real ones
# (`MODEL=f32,VAE=bf16`); no node library is loaded for them.
register_socket_type("MODEL", model=True)
register_socket_type("VAE", model=True)
CALLS: Counter = Counter()
#: (node id, "start" | "end", time.monotonic()) recorded by the async nodes themselves
TIMELINE: list = []
#: how often Volatile's fingerprint (IS_CHANGED) was computed
FINGERPRINTS: Counter = Counter()
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


# --- dynamic execution ----------------------------------------------------------------------

@node(outputs=[Output("INT", "INT", is_list=True)], register=False)
def Range(start=Int(0, min=-10**9, max=10**9), count=Int(3, min=0, max=10**6)):
    """A list producer (OUTPUT_IS_LIST): start, start+1, ... (count elements)."""
    CALLS["Range"] += 1
    return (list(range(start, start + count)),)


@node(outputs=[Output("INT", "INT", is_list=True)], register=False)
def Repeat(x=Socket("INT"), times=Int(2, min=0, max=100)):
    """A list output produced per call: mapped over a list input, its lists are concatenated."""
    CALLS["Repeat"] += 1
    return ([x] * times,)


@node(outputs=["INT", "INT"], input_is_list=True, register=False)
def SumList(values=Socket("INT"), factor=Int(1, min=-100, max=100)):
    """INPUT_IS_LIST: gets every input as a list; returns (sum * factor, count)."""
    CALLS["SumList"] += 1
    return sum(values) * factor[0], len(values)


@node(output_node=True, register=False)
def ShowAll(value=Socket("INT")):
    CALLS["ShowAll"] += 1
    return Result((), {"text": [str(value)]})


def _switch_needs(select, on_true=None, on_false=None):
    return ["on_true"] if select and on_true is None else \
        ["on_false"] if not select and on_false is None else []


@node(outputs=["INT"], check_lazy_status=_switch_needs, register=False)
def LazySwitch(select=Boolean(True), on_true=Socket("INT", lazy=True),
               on_false=Socket("INT", lazy=True)):
    CALLS["LazySwitch"] += 1
    return on_true if select else on_false


def _mix_needs(ratio, a=None, b=None):
    need = []
    if ratio > 0 and b is None:
        need.append("b")
    if ratio < 1 and a is None:
        need.append("a")
    return need


@node(outputs=["INT"], check_lazy_status=_mix_needs, register=False)
def LazyMix(a=Socket("INT", lazy=True), b=Socket("INT", lazy=True),
            ratio=Float(0.5, min=0.0, max=1.0)):
    """round((1 - ratio) * a + ratio * b), evaluating only the inputs a ratio of 0 or 1 needs."""
    CALLS["LazyMix"] += 1
    return round((0.0 if ratio == 1 else (1 - ratio) * a) + (0.0 if ratio == 0 else ratio * b))


@node(outputs=["INT"], register=False)
def CountLoop(value=Socket("INT"), n=Int(3, min=0, max=10**6),
              step=Int(1, min=-100, max=100, optional=True),
              i=Int(0, min=0, max=10**6, optional=True)):
    """A while loop by expansion: adds `step` to `value` until i == n, re-expanding itself."""
    CALLS["CountLoop"] += 1
    if i >= n:
        return value
    graph = {"add": {"class_type": "AddConst", "inputs": {"a": value, "b": step}},
             "next": {"class_type": "CountLoop",
                      "inputs": {"value": ["add", 0], "step": step, "i": i + 1, "n": n}}}
    return Result((["next", 0],), expand=graph)


@node(outputs=["INT"], register=False)
def AddConst(a=Int(0, min=-10**9, max=10**9), b=Int(0, min=-10**9, max=10**9)):
    CALLS["AddConst"] += 1
    return a + b


@node(outputs=["INT"], register=False)
def NestedLoops(value=Socket("INT"), outer=Int(2, min=0, max=100), inner=Int(3, min=0, max=100),
                label=String("", optional=True)):
    """Expands into `outer` CountLoop nodes in a chain (each of `inner` steps): nested expansion.
    `label` does nothing but change this node's cache key."""
    CALLS["NestedLoops"] += 1
    graph, last = {}, value
    for k in range(outer):
        graph[f"loop{k}"] = {"class_type": "CountLoop",
                             "inputs": {"value": last if k == 0 else [f"loop{k - 1}", 0],
                                        "n": inner}}
        last = None
    if not graph:
        return value
    return Result(([f"loop{outer - 1}", 0],), expand=graph)


@node(outputs=["INT"], register=False)
def ExpandInto(value=Socket("INT"), target=String("")):
    """Expands into an Add of `value` and node `target`'s output 0 (an existing node): used to
    make a cycle at run time when `target` consumes this node."""
    CALLS["ExpandInto"] += 1
    return Result((["sum", 0],), expand={"sum": {"class_type": "Add",
                                                 "inputs": {"a": [target, 0], "b": value}}})


@node(outputs=["INT"], register=False)
def ExpandCycle(value=Socket("INT")):
    """Expands into two nodes linked to each other."""
    CALLS["ExpandCycle"] += 1
    return Result((["a", 0],), expand={
        "a": {"class_type": "Add", "inputs": {"a": ["b", 0], "b": value}},
        "b": {"class_type": "Add", "inputs": {"a": ["a", 0], "b": value}}})


@node(outputs=["INT"], register=False)
def Forever(value=Socket("INT")):
    """Re-expands itself without end."""
    CALLS["Forever"] += 1
    return Result((["again", 0],), expand={"again": {"class_type": "Forever",
                                                     "inputs": {"value": value}}})


@node(outputs=["INT"], precision_types=("VAE",), register=False)
def AddIfHalfVaeExpands(x=Socket("INT")):
    """Expands into AddIfHalfVae: the expanded node must see the parent's precision region."""
    CALLS["AddIfHalfVaeExpands"] += 1
    return Result((["inner", 0],), expand={"inner": {"class_type": "AddIfHalfVae",
                                                     "inputs": {"x": x}}})


@node(outputs=["INT"], register=False)
def Gate(x=Socket("INT"), open=Boolean(True), message=String("")):
    """Passes x, or blocks it (ExecutionBlocker, with `message` unless empty)."""
    CALLS["Gate"] += 1
    return x if open else ExecutionBlocker(message or None)


@node(outputs=["INT"], register=False)
def BlockOdd(x=Socket("INT")):
    """Blocks odd elements only (for per-call blocking under list mapping)."""
    CALLS["BlockOdd"] += 1
    return ExecutionBlocker(None) if x % 2 else x


@node(outputs=["INT"], register=False)
async def Sleep(x=Socket("INT"), seconds=Float(0.3, min=0.0, max=10.0),
                unique_id=Hidden("UNIQUE_ID")):
    """An async node: records its own start and end."""
    CALLS["Sleep"] += 1
    TIMELINE.append((unique_id, "start", time.monotonic()))
    await asyncio.sleep(seconds)
    TIMELINE.append((unique_id, "end", time.monotonic()))
    return x


def _volatile_fingerprint(env, value=None, **_):
    FINGERPRINTS["Volatile"] += 1
    return float("nan")


@node(outputs=["INT"], fingerprint=_volatile_fingerprint, register=False)
def Volatile(value=Int(0, min=-10**9, max=10**9)):
    """IS_CHANGED returns NaN: always re-run."""
    CALLS["Volatile"] += 1
    return value


@node(outputs=["STRING"], register=False)
def WhoAmI(x=Socket("INT"), unique_id=Hidden("UNIQUE_ID"), dynprompt=Hidden("DYNPROMPT")):
    """Reads its own node from DYNPROMPT: "<id> <class_type> <original node count>"."""
    CALLS["WhoAmI"] += 1
    me = dynprompt.get_node(unique_id)
    assert dynprompt.has_node(unique_id)
    return f"{unique_id} {me['class_type']} {len(dynprompt.get_original_prompt())}"


@node(outputs=["STRING"], register=False)
def WhoAmIExpands(x=Socket("INT")):
    CALLS["WhoAmIExpands"] += 1
    return Result((["who", 0],), expand={"who": {"class_type": "WhoAmI", "inputs": {"x": x}}})


DYNAMIC = [Range, Repeat, SumList, ShowAll, LazySwitch, LazyMix, CountLoop, AddConst, NestedLoops,
           ExpandInto, ExpandCycle, Forever, AddIfHalfVaeExpands, Gate, BlockOdd, Sleep, Volatile,
           WhoAmI, WhoAmIExpands]

ALL = [Const, Add, Mul, ReadText, Fail, CtrlC, ToyModelLoader, NanIfHalf, AlwaysNan, AddIfHalfVae,
       AsksUndeclared, Slow, Random, Show, ShowText, ShowImage, SaveNumber, *DYNAMIC]


def registry() -> Registry:
    reg = Registry()
    for fn in ALL:
        reg.add(fn.spec)
    return reg


def link(node_id, slot=0) -> list:
    return [str(node_id), slot]


def call(class_type: str, **inputs) -> dict:
    return {"class_type": class_type, "inputs": inputs}
