"""List-making nodes for the fan-out tests (ComfyUI's OUTPUT_IS_LIST, as custom node packs such as
outputlists-combiner give them) and a registry of the node library plus these, which a Ray
worker can build (`registry` is picklable by reference)."""

from __future__ import annotations

import random

from mixgraph.graph.node import Int, String, node
from mixgraph.graph.registry import Registry
from mixgraph.graph.spec import Output

_REG: Registry | None = None


@node(outputs=[Output("INT", "seeds", is_list=True)], register=False)
def SeedList(seeds=String("1,2,3")):
    """The comma-separated seeds, one list item each."""
    return ([int(s) for s in seeds.split(",") if s.strip()],)


@node(outputs=[Output("STRING", "texts", is_list=True)], register=False)
def PromptList(texts=String("", multiline=True)):
    """One list item per non-empty line."""
    return ([line for line in texts.splitlines() if line.strip()],)


@node(outputs=["INT"], deterministic=False, register=False)
def RandomSeed(high=Int(2**31 - 1, min=1, max=2**63 - 1)):
    """A fresh seed on every run (like the random-seed nodes of custom packs)."""
    return (random.randrange(high),)


def registry() -> Registry:
    """The node library and SeedList, PromptList, RandomSeed (a fresh registry, not the global
    one)."""
    global _REG
    if _REG is None:
        from mixgraph.ui.api import default_registry
        reg = Registry()
        for spec in default_registry().specs():
            reg.add(spec)
        reg.add(SeedList.spec)
        reg.add(PromptList.spec)
        reg.add(RandomSeed.spec)
        _REG = reg
    return _REG
