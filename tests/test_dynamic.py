"""ComfyUI's dynamic execution model on toy nodes: list mapping, lazy inputs, node expansion,
ExecutionBlocker, async nodes, IS_CHANGED NaN, DYNPROMPT, partial targets and cache modes."""

import threading

import pytest

from mixgraph.graph import events as ev
from mixgraph.graph.cache import LruCountCache, NoCache, OutputCache, RamPressureCache, make_cache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor, NodeError
from tests import toy_nodes as toy
from tests.toy_nodes import call, link

REG = toy.registry()


@pytest.fixture
def env(tmp_path):
    (tmp_path / "in").mkdir()
    return Env(models=(tmp_path / "models",), input=tmp_path / "in", output=tmp_path / "out",
               temp=tmp_path / "temp")


@pytest.fixture
def ex(env):
    toy.CALLS.clear()
    toy.TIMELINE.clear()
    toy.FINGERPRINTS.clear()
    return Executor(REG, env, OutputCache(2**26))


# --- list mapping -------------------------------------------------------------------------------

def test_lists_mapped_node_runs_once_per_element(ex):
    wf = {"1": call("Range", start=1, count=3), "2": call("Mul", a=link(1), factor=10),
          "3": call("ShowAll", value=link(2))}
    r = ex.run(wf)
    assert r.values["1"] == ([1, 2, 3],) and r.values["2"] == ([10, 20, 30],)
    assert toy.CALLS["Mul"] == 3 and toy.CALLS["ShowAll"] == 3
    assert r.ui["3"] == {"text": ["10", "20", "30"]}            # UI of the calls merged


def test_lists_longest_sets_count_shorter_repeats_last(ex):
    wf = {"1": call("Range", start=1, count=3), "2": call("Range", start=100, count=1),
          "3": call("Range", start=10, count=2),
          "4": call("Add", a=link(1), b=link(3)), "5": call("Add", a=link(4), b=link(2)),
          "6": call("ShowAll", value=link(5))}
    r = ex.run(wf)
    assert r.values["4"] == ([11, 13, 14],)                     # 3 + 11: 11 repeated
    assert r.values["5"] == ([111, 113, 114],)
    assert r.elements("5") == [111, 113, 114]


def test_lists_list_output_of_mapped_calls_is_flattened(ex):
    wf = {"1": call("Range", start=1, count=3), "2": call("Repeat", x=link(1), times=2),
          "3": call("ShowAll", value=link(2))}
    r = ex.run(wf)
    assert toy.CALLS["Repeat"] == 3
    assert r.values["2"] == ([1, 1, 2, 2, 3, 3],)


def test_lists_input_is_list_gets_whole_lists_once(ex):
    wf = {"1": call("Range", start=1, count=4), "2": call("SumList", values=link(1), factor=2),
          "c": call("Const", value=5), "3": call("SumList", values=link("c"), factor=3),
          "4": call("Show", value=link(2)), "5": call("Show", value=link(3))}
    r = ex.run(wf)
    assert toy.CALLS["SumList"] == 2
    assert r.values["2"] == (20, 4)                            # single call: not a list node
    assert r.values["3"] == (15, 1)                            # a single value is a 1-list
    assert "2" not in r.lists and "1" in r.lists


def test_lists_empty_list_calls_nothing(ex):
    wf = {"1": call("Range", start=1, count=0), "2": call("Mul", a=link(1), factor=10),
          "3": call("ShowAll", value=link(2))}
    r = ex.run(wf)
    assert r.values["2"] == ([],) and toy.CALLS["Mul"] == 0 and toy.CALLS["ShowAll"] == 0


def test_lists_cached_list_values_stay_lists(ex):
    wf = {"1": call("Range", start=1, count=3), "2": call("Mul", a=link(1), factor=10),
          "3": call("ShowAll", value=link(2))}
    ex.run(wf)
    wf["4"] = call("SumList", values=link(2), factor=1)
    wf["5"] = call("Show", value=link(4))
    r = ex.run(wf)
    assert set(r.cached) >= {"1", "2"} and r.values["4"] == (60, 3)


# --- lazy inputs --------------------------------------------------------------------------------

def lazy_switch(select):
    return {"1": call("Const", value=1), "2": call("Mul", a=link(1), factor=7),
            "3": call("Const", value=2), "4": call("Fail", x=link(3), message="boom"),
            "5": call("LazySwitch", select=select, on_true=link(2), on_false=link(4)),
            "6": call("Show", value=link(5))}


def test_lazy_switch_never_runs_the_unused_branch(ex):
    r = ex.run(lazy_switch(True))
    assert r.values["5"] == (7,)
    assert toy.CALLS["Fail"] == 0 and toy.CALLS["Mul"] == 1 and toy.CALLS["LazySwitch"] == 1
    assert "4" not in r.nodes and "3" not in r.nodes
    with pytest.raises(NodeError) as e:        # the other side is evaluated when selected
        ex.run(lazy_switch(False))
    assert e.value.node_id == "4"


def test_lazy_mix_evaluates_only_what_the_ratio_needs(ex):
    wf = {"1": call("Const", value=4), "2": call("Const", value=8),
          "3": call("LazyMix", a=link(1), b=link(2), ratio=0.0), "4": call("Show", value=link(3))}
    assert ex.run(wf).values["3"] == (4,) and toy.CALLS["Const"] == 1
    wf["3"] = call("LazyMix", a=link(1), b=link(2), ratio=0.25)
    r = ex.run(wf)
    assert r.values["3"] == (5,) and toy.CALLS["Const"] == 2     # "1" cached, "2" evaluated


def test_lazy_branch_used_elsewhere_counts_as_evaluated(ex):
    wf = lazy_switch(True)
    wf["7"] = call("Show", value=link(2))            # 2 is needed strongly too
    r = ex.run(wf)
    assert r.values["5"] == (7,) and toy.CALLS["Mul"] == 1 and toy.CALLS["Fail"] == 0


# --- expansion ----------------------------------------------------------------------------------

def loop(n, start=5, step=2):
    return {"1": call("Const", value=start), "2": call("CountLoop", value=link(1), step=step, n=n),
            "3": call("Show", value=link(2))}


def test_expansion_loop_runs_n_iterations(ex):
    seen = []
    r = ex.run(loop(4), on_event=seen.append)
    assert r.values["2"] == (13,) and r.ui["3"] == {"text": ["13"]}
    assert toy.CALLS["CountLoop"] == 5 and toy.CALLS["AddConst"] == 4
    assert "2.0.next.0.next" in r.values and r.nodes["2.0.add"].class_type == "AddConst"
    executing = [e for e in seen if isinstance(e, ev.Executing) and e.node]
    # expanded nodes run under their own ids and are shown as the node that expanded them
    shown = {e.node: e.to_comfy()[1]["display_node"] for e in executing}
    assert shown["2.0.add"] == "2" and shown["2.0.next.0.add"] == "2" and shown["1"] == "1"


def test_expansion_zero_iterations_returns_input(ex):
    assert ex.run(loop(0)).values["2"] == (5,)


def test_expansion_nested(ex):
    wf = {"1": call("Const", value=1), "2": call("NestedLoops", value=link(1), outer=3, inner=2),
          "3": call("Show", value=link(2))}
    r = ex.run(wf)
    assert r.values["2"] == (7,)
    assert toy.CALLS["AddConst"] == 6 and toy.CALLS["CountLoop"] == 9


def test_expansion_parent_cached_on_rerun(ex):
    ex.run(loop(3))
    toy.CALLS.clear()
    r = ex.run(loop(3))
    assert r.executed == [] and r.values["2"] == (11,) and not toy.CALLS


def test_expansion_expanded_nodes_hit_cache_when_parent_reruns(ex):
    def wf(label):
        return {"1": call("Const", value=1),
                "2": call("NestedLoops", value=link(1), outer=2, inner=3, label=label),
                "3": call("Show", value=link(2))}
    r1 = ex.run(wf("a"))
    toy.CALLS.clear()
    r2 = ex.run(wf("b"))                 # a new parent key, the same expanded graph
    assert r2.values["2"] == r1.values["2"] == (7,)
    assert toy.CALLS["NestedLoops"] == 1 and toy.CALLS["AddConst"] == 0
    assert toy.CALLS["CountLoop"] == 0
    assert r2.nodes["2.0.loop1"].status == "cached"


def test_expansion_dynamic_cycle_is_an_error_not_a_hang(ex):
    wf = {"1": call("Const", value=1), "2": call("ExpandInto", value=link(1), target="3"),
          "3": call("Mul", a=link(2), factor=2), "4": call("Show", value=link(3))}
    seen = []
    with pytest.raises(NodeError) as e:
        ex.run(wf, on_event=seen.append)
    assert "cycle" in str(e.value).lower()
    assert [x.to_comfy()[0] for x in seen][-2:] == ["execution_error", "executing"]


def test_expansion_cycle_inside_graph_is_an_error(ex):
    wf = {"1": call("Const", value=1), "2": call("ExpandCycle", value=link(1)),
          "3": call("Show", value=link(2))}
    with pytest.raises(NodeError, match="cycle"):
        ex.run(wf)


def test_expansion_endless_loop_is_bounded(ex):
    ex.max_expanded_nodes = 50
    wf = {"1": call("Const", value=1), "2": call("Forever", value=link(1)),
          "3": call("Show", value=link(2))}
    with pytest.raises(NodeError, match="more than 50 nodes"):
        ex.run(wf)
    assert toy.CALLS["Forever"] == 51


def test_expansion_inherits_precision_region(ex):
    def wf():
        return {"format": "mixgraph/1",
                "prompt": {"1": call("Const", value=1),
                           "2": call("AddIfHalfVaeExpands", x=link(1)),
                           "3": call("Show", value=link(2))},
                "precision": {"default": "f32",
                              "regions": [{"name": "r", "nodes": ["2"], "precision": "bf16"}]}}
    r = ex.run(wf())
    assert r.values["2"] == (2,)                           # the expanded node saw bf16
    assert r.nodes["2.0.inner"].precision == "bf16"
    plain = {"1": call("Const", value=1), "2": call("AddIfHalfVaeExpands", x=link(1)),
             "3": call("Show", value=link(2))}
    assert ex.run(plain, precision="f32").values["2"] == (1,)


def test_expansion_dynprompt_shows_expanded_nodes(ex):
    wf = {"1": call("Const", value=1), "2": call("WhoAmIExpands", x=link(1)),
          "3": call("WhoAmI", x=link(1)), "4": call("ShowText", text=link(2)),
          "5": call("ShowText", text=link(3))}
    r = ex.run(wf)
    assert r.values["3"] == ("3 WhoAmI 5",)
    assert r.values["2"] == ("2.0.who WhoAmI 5",)


# --- ExecutionBlocker ---------------------------------------------------------------------------

def gated(open_, message=""):
    return {"1": call("Const", value=3), "2": call("Gate", x=link(1), open=open_, message=message),
            "3": call("Mul", a=link(2), factor=2), "4": call("Show", value=link(3)),
            "5": call("Show", value=link(1))}


def test_blocker_without_message_is_silent(ex):
    seen = []
    r = ex.run(gated(False), on_event=seen.append)
    assert r.status == "success" and toy.CALLS["Mul"] == 0 and toy.CALLS["Show"] == 1
    assert "4" not in r.ui and r.ui["5"] == {"text": ["3"]}
    assert not any(isinstance(e, ev.ExecutionError) for e in seen)


def test_blocker_with_message_reports_an_error_once_and_the_prompt_goes_on(ex):
    seen = []
    r = ex.run(gated(False, "no way"), on_event=seen.append)
    errors = [e.to_comfy()[1] for e in seen if isinstance(e, ev.ExecutionError)]
    assert len(errors) == 1 and errors[0]["node_id"] == "3"
    assert errors[0]["exception_message"] == "Execution Blocked: no way"
    assert errors[0]["exception_type"] == "ExecutionBlocked"
    assert r.status == "success" and toy.CALLS["Show"] == 1 and "4" not in r.ui
    assert [e.to_comfy()[0] for e in seen][-2:] == ["execution_success", "executing"]


def test_blocker_open_gate_passes(ex):
    assert ex.run(gated(True)).ui["4"] == {"text": ["6"]}


def test_blocker_per_element_under_mapping(ex):
    wf = {"1": call("Range", start=1, count=4), "2": call("BlockOdd", x=link(1)),
          "3": call("Mul", a=link(2), factor=10), "4": call("ShowAll", value=link(3))}
    r = ex.run(wf)
    assert toy.CALLS["Mul"] == 2 and r.ui["4"] == {"text": ["20", "40"]}


# --- async --------------------------------------------------------------------------------------

def test_async_nodes_overlap(ex):
    wf = {"1": call("Const", value=1), "a": call("Sleep", x=link(1), seconds=0.3),
          "b": call("Sleep", x=link(1), seconds=0.3), "2": call("Add", a=link("a"), b=link("b")),
          "3": call("Show", value=link(2))}
    r = ex.run(wf)
    assert r.values["2"] == (2,)
    t = {(nid, what): at for nid, what, at in toy.TIMELINE}
    assert t[("a", "start")] < t[("b", "end")] and t[("b", "start")] < t[("a", "end")]


def test_async_node_from_a_plain_thread(ex):
    wf = {"1": call("Const", value=4), "a": call("Sleep", x=link(1), seconds=0.0),
          "3": call("Show", value=link("a"))}
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", ex.run(wf)))
    th.start()
    th.join(30)
    assert out["r"].values["a"] == (4,)


# --- IS_CHANGED, partial targets ----------------------------------------------------------------

def test_fingerprint_nan_always_reruns_and_is_computed_once(ex):
    wf = {"1": call("Volatile", value=3), "2": call("Mul", a=link(1), factor=2),
          "3": call("Show", value=link(2))}
    ex.run(wf)
    r = ex.run(wf)
    assert toy.CALLS["Volatile"] == 2 and toy.CALLS["Mul"] == 2
    assert toy.FINGERPRINTS["Volatile"] == 2 and r.values["2"] == (6,)


def test_partial_targets_run_only_what_they_need(ex):
    wf = {"1": call("Const", value=1), "2": call("Mul", a=link(1), factor=3),
          "3": call("Show", value=link(2)), "4": call("Const", value=9), "5": call("Show", value=link(4))}
    r = ex.run(wf, targets=["5"])
    assert sorted(r.executed) == ["4", "5"] and toy.CALLS["Mul"] == 0


# --- cache modes --------------------------------------------------------------------------------

def mixed():
    return {"1": call("Range", start=1, count=3), "2": call("Mul", a=link(1), factor=10),
            "3": call("ShowAll", value=link(2)), "4": call("Const", value=2),
            "5": call("CountLoop", value=link(4), n=2), "6": call("Show", value=link(5)),
            "7": call("LazySwitch", select=True, on_true=link(5), on_false=link(2)),
            "8": call("Show", value=link(7))}


@pytest.mark.parametrize("cache", [OutputCache(2**26), LruCountCache(2), NoCache(),
                                   RamPressureCache(2**70, available=lambda: 0, poll_seconds=0)])
def test_cache_modes_give_identical_results(env, cache):
    base = Executor(REG, env, OutputCache(2**26)).run(mixed())
    r = Executor(REG, env, cache).run(mixed())
    assert r.values == base.values and r.ui == base.ui


def test_cache_modes_differ_in_what_they_keep(env):
    def kept(cache):
        Executor(REG, env, cache).run(mixed())
        return len(cache)
    assert kept(OutputCache(2**26)) > 5
    assert kept(LruCountCache(2)) == 2
    assert kept(NoCache()) == 0
    assert kept(RamPressureCache(100, available=lambda: 0, poll_seconds=0)) == 0
    assert kept(RamPressureCache(100, available=lambda: 10**12, poll_seconds=0)) > 5
    again = Executor(REG, env, NoCache())
    again.run(mixed())
    toy.CALLS.clear()
    again.run(mixed())
    assert toy.CALLS["Range"] == 1                     # nothing kept between prompts


def test_make_cache_from_flags():
    assert type(make_cache()) is OutputCache
    assert make_cache(lru=5).max_entries == 5
    assert type(make_cache(lru=0)) is OutputCache      # ComfyUI: --cache-lru 0 is LRU off
    assert type(make_cache(none=True)) is NoCache
    assert make_cache(ram=2.0).headroom == 2 * 2**30
    with pytest.raises(ValueError, match="one cache mode"):
        make_cache(lru=3, none=True)
