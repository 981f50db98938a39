"""Planning: the nodes that requested outputs need, their order, and the cycles that stop it.

The one place that walks a prompt's links (DESIGN §5: only ancestors of output nodes run, in
topological order). Validation plans with it while it checks nodes; the executor uses the order
validation found and walks again here for what its cache misses need.

    needed = walk(outputs, upstream)          # every ancestor, once
    order, stuck = topological(ups, prompt)   # Kahn; ties in prompt order, first ready first out
    units, cycles = components(stuck, ups, prompt)   # only when something is stuck

Everything is iterative and linear in nodes + links: a 100,000-node chain plans without
recursion. Kahn's algorithm is written out here (graphlib's ready-set order is not the prompt
order ComfyUI users see, and it raises on the first cycle instead of placing what it can); only
the nodes it cannot place (on or behind a cycle) go to networkx for strongly connected
components (iterative too), and one cycle per component is traced by following its links. A
cycle is described once and in bounded size (`Cycle.describe`), however long it is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import networkx as nx

from mixgraph.graph.prompt import Link

#: How many node ids a cycle's description lists before "... and N more".
CYCLE_LISTED = 10


def links_of(inputs: Mapping[str, Any]) -> list[str]:
    """The upstream node ids of one node's inputs (its `Link` values)."""
    return [v.node_id for v in inputs.values() if type(v) is Link]


def walk(roots: Iterable[str], upstream: Callable[[str], Iterable[str]],
         stop: Collection[str] = ()) -> dict[str, None]:
    """Every node reachable from `roots` against the links, each once (an ordered set, in visit
    order). `upstream(n)` is called once per reached node; nodes in `stop` are reached but not
    followed further (a cache hit needs none of its inputs)."""
    seen: dict[str, None] = {}
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen[n] = None
        if n not in stop:
            stack.extend(upstream(n))
    return seen


def topological(ups: Mapping[str, Sequence[str]], node_order: Iterable[str]
                ) -> tuple[list[str], list[str]]:
    """Kahn's algorithm over the nodes of `ups` (node -> the ids its links come from; every such
    id is itself a key, as `walk` leaves it). Ties follow `node_order` (first ready, first out);
    `node_order` must hold every node of `ups`. Returns the order and the nodes it could not
    place (on or behind a cycle), both in `node_order`. A node linked twice to one upstream node
    counts that edge twice on both sides."""
    if isinstance(node_order, Collection) and len(ups) == len(node_order):
        nodes = list(node_order)
    else:
        nodes = [n for n in node_order if n in ups]
    indeg: dict[str, int] = {}
    downs: dict[str, list[str]] = {}
    for n in nodes:
        linked = ups[n]
        indeg[n] = len(linked)
        for u in linked:
            d = downs.get(u)
            if d is None:
                downs[u] = [n]
            else:
                d.append(n)
    ready = deque(n for n in nodes if not indeg[n])
    order: list[str] = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for d in downs.get(n, ()):
            k = indeg[d] - 1
            indeg[d] = k
            if not k:
                ready.append(d)
    stuck = [n for n in nodes if indeg[n]] if len(order) < len(nodes) else []
    return order, stuck


def needed_in_order(order: Sequence[str], roots: Iterable[str],
                    upstream: Callable[[str], Iterable[str]]) -> tuple[str, ...]:
    """The part of an existing topological `order` that `roots` need through `upstream`."""
    need = walk(roots, upstream)
    return tuple(n for n in order if n in need)


@dataclass(frozen=True)
class Cycle:
    """One cycle of links. `nodes` in link order (each feeds the next, the last feeds the
    first), starting at the one first in prompt order; `component`: how many nodes its strongly
    connected component holds (other cycles through them are not listed)."""

    nodes: tuple[str, ...]
    component: int

    def listed(self, limit: int = CYCLE_LISTED) -> list[str]:
        return list(self.nodes[:limit])

    def describe(self, limit: int = CYCLE_LISTED) -> str:
        """`a -> b -> c -> a`; past `limit` nodes, `a -> ... -> j -> ... (N more) -> a`."""
        shown = " -> ".join(self.nodes[:limit])
        if len(self.nodes) > limit:
            shown += f" -> ... ({len(self.nodes) - limit} more)"
        return f"{shown} -> {self.nodes[0]}"


def components(stuck: Sequence[str], ups: Mapping[str, Sequence[str]], node_order: Iterable[str]
               ) -> tuple[list[tuple[str, ...]], list[Cycle]]:
    """The nodes Kahn could not place, grouped into strongly connected components in topological
    order (a component's upstream components first; members in `node_order`), and one `Cycle`
    per component that holds one (several nodes, or one linked to itself)."""
    if not stuck:
        return [], []
    left = set(stuck)
    g = nx.DiGraph()
    g.add_nodes_from(stuck)
    g.add_edges_from((u, n) for n in stuck for u in ups[n] if u in left)
    cond = nx.condensation(g)
    rank = {n: i for i, n in enumerate(n for n in node_order if n in left)}
    units: list[tuple[str, ...]] = []
    cycles: list[Cycle] = []
    for c in nx.topological_sort(cond):
        members = tuple(sorted(cond.nodes[c]["members"], key=rank.__getitem__))
        units.append(members)
        if len(members) > 1 or g.has_edge(members[0], members[0]):
            found = _cycle_in(members, ups)
            start = min(range(len(found)), key=lambda i: rank[found[i]])
            cycles.append(Cycle(tuple(found[start:] + found[:start]), len(members)))
    return units, cycles


def _cycle_in(members: tuple[str, ...], ups: Mapping[str, Sequence[str]]) -> list[str]:
    """A cycle through the strongly connected `members`, in link order. Every member has an
    upstream link inside the component, so following those from any member must come back to a
    node already passed; what lies between is a cycle. Linear in the component's links."""
    inside = set(members)
    at: dict[str, int] = {}
    path: list[str] = []
    n = members[0]
    while n not in at:
        at[n] = len(path)
        path.append(n)
        n = next(u for u in ups[n] if u in inside)
    found = path[at[n]:]
    found.reverse()   # the walk went against the links
    return found
