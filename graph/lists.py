"""List mapping (ComfyUI's INPUT_IS_LIST / OUTPUT_IS_LIST rules), as pure functions.

Every node output is, in principle, a list of values. A node called once with no list input
keeps its outputs unwrapped (the engine's fast path: a one-element list in all but
representation); a node becomes list-valued when it declares a list output or is called once
per element. The rules:

* a node without `input_is_list` whose inputs include lists (outputs of list-valued nodes) is
  called once per element: the longest list sets the count, shorter lists repeat their last
  element, single values repeat; an empty list input means no call and empty outputs;
* the results are gathered per output into lists; an output declared `is_list` returns a list
  per call, and those lists are concatenated (flattened);
* a node with `input_is_list` gets every input as a list (single values as one-element lists)
  and is called once.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from mixgraph.graph.blocker import ExecutionBlocker

__all__ = ["Elements", "call_kwargs", "merge_results", "merge_ui", "find_blocker"]


class Elements:
    """Several elements standing for one call's output (an expansion result linked to a
    list-valued node): merging splices them in."""

    __slots__ = ("items",)

    def __init__(self, items: Iterable[Any]):
        self.items = list(items)


def call_kwargs(kwargs: dict[str, Any], listed: Sequence[str], input_is_list: bool) -> list[dict]:
    """The keyword arguments of each call. `listed`: the names whose value is a list of
    elements (from list-valued nodes); the other values are single."""
    if input_is_list:
        return [{k: (v if k in listed else [v]) for k, v in kwargs.items()}]
    if not listed:
        return [kwargs]
    count = min((len(kwargs[k]) for k in listed), default=1)
    if count == 0:
        return []
    count = max(len(kwargs[k]) for k in listed)
    calls = []
    for i in range(count):
        kw = dict(kwargs)
        for k in listed:
            v = kwargs[k]
            kw[k] = v[i] if i < len(v) else v[-1]
        calls.append(kw)
    return calls


def find_blocker(kwargs: dict[str, Any], input_is_list: bool) -> ExecutionBlocker | None:
    """The first blocker among one call's inputs (inside the lists, for `input_is_list`)."""
    for v in kwargs.values():
        if isinstance(v, ExecutionBlocker):
            return v
        if input_is_list and isinstance(v, list):
            for e in v:
                if isinstance(e, ExecutionBlocker):
                    return e
    return None


def merge_results(results: list[tuple], list_out: Sequence[bool], n_out: int) -> tuple:
    """Per-call output tuples gathered into one list per output (`is_list` outputs flattened;
    a blocker in place of a list stays one element)."""
    outs = []
    for i in range(n_out):
        acc: list = []
        flatten = list_out[i]
        for r in results:
            v = r[i]
            if type(v) is Elements:
                acc.extend(v.items)
            elif flatten and not isinstance(v, ExecutionBlocker):
                if not isinstance(v, (list, tuple)):
                    raise TypeError(f"output {i} is declared as a list but the node returned a "
                                    f"{type(v).__name__}")
                acc.extend(v)
            else:
                acc.append(v)
        outs.append(acc)
    return tuple(outs)


def merge_ui(uis: list[dict]) -> dict | None:
    """ComfyUI's merge of the UI payloads of several calls: per key, the items concatenated."""
    if not uis:
        return None
    if len(uis) == 1:
        return uis[0]
    out: dict[str, list] = {}
    for ui in uis:
        for k, items in ui.items():
            out.setdefault(k, []).extend(items if isinstance(items, (list, tuple)) else [items])
    return out
