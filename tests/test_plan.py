"""graph.plan on small hand-made graphs: needed set, Kahn order, components and cycles."""

from __future__ import annotations

from mixgraph.graph.plan import Cycle, components, needed_in_order, topological, walk

# b <- a, c <- a, d <- b + c, e <- d; x is unrelated
UPS = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "x": []}


def test_plan_walk_reaches_ancestors_once_and_stops_where_told():
    calls = []

    def upstream(n):
        calls.append(n)
        return UPS[n]
    assert set(walk(["e"], upstream)) == {"a", "b", "c", "d", "e"}
    assert sorted(calls) == ["a", "b", "c", "d", "e"]        # each node asked once
    assert set(walk(["e"], UPS.__getitem__, stop={"d"})) == {"d", "e"}


def test_plan_topological_ties_in_given_order_and_stuck_nodes():
    order, stuck = topological(UPS, ["x", "c", "b", "a", "d", "e"])
    assert order == ["x", "a", "c", "b", "d", "e"] and stuck == []
    ups = {"1": ["3"], "2": ["1"], "3": ["2"], "4": ["3"], "0": []}
    order, stuck = topological(ups, ["0", "1", "2", "3", "4"])
    assert order == ["0"] and stuck == ["1", "2", "3", "4"]
    assert needed_in_order(["x", "a", "c", "b", "d", "e"], ["b"], UPS.__getitem__) == ("a", "b")


def test_plan_components_one_cycle_per_component_in_link_order():
    # cycle 1 -> 2 -> 3 -> 1 (3 feeds 1), 4 hangs behind it; 5 links to itself
    ups = {"1": ["3"], "2": ["1"], "3": ["2"], "4": ["3"], "5": ["5"]}
    units, cycles = components(["1", "2", "3", "4", "5"], ups, ["4", "5", "2", "1", "3"])
    assert units.index(("2", "1", "3")) < units.index(("4",))   # members in the given order
    assert sorted(cycles, key=lambda c: c.nodes) == [Cycle(("2", "3", "1"), 3), Cycle(("5",), 1)]
    assert Cycle(("2", "3", "1"), 3).describe() == "2 -> 3 -> 1 -> 2"


def test_plan_cycle_description_is_bounded():
    c = Cycle(tuple(str(i) for i in range(25)), 25)
    assert c.describe(limit=3) == "0 -> 1 -> 2 -> ... (22 more) -> 0"
    assert c.listed(limit=3) == ["0", "1", "2"]
