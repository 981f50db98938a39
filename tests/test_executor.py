"""The executor on tiny real nodes: caching, interrupts, failures, NaN guard, precision."""

import os
import threading

import pytest
import torch

from mixgraph.graph import events as ev
from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor, Interrupted, NodeError, ValidationFailed
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
    return Executor(REG, env, OutputCache(2**26))


def diamond(factor_b=5):
    return {"1": call("Const", value=2), "2": call("Mul", a=link(1), factor=3),
            "3": call("Mul", a=link(1), factor=factor_b), "4": call("Add", a=link(2), b=link(3)),
            "5": call("Show", value=link(4))}


def test_executor_diamond_runs_in_order_and_caches(ex):
    seen = []
    r = ex.run(diamond(), on_event=seen.append)
    assert r.status == "success" and r.values["4"] == (16,) and r.ui["5"] == {"text": ["16"]}
    assert sorted(r.executed) == ["1", "2", "3", "4", "5"]
    assert [e.node for e in seen if isinstance(e, ev.Executing)][-1] is None
    types = [e.to_comfy()[0] for e in seen]
    assert types[:2] == ["execution_start", "execution_cached"] and types[-2:] == ["execution_success", "executing"]
    again = ex.run(diamond())
    assert again.executed == [] and sorted(again.cached) == ["1", "2", "3", "4", "5"]
    assert again.ui["5"] == {"text": ["16"]}


def test_executor_diamond_literal_change_reruns_exactly_affected_nodes(ex):
    ex.run(diamond(5))
    toy.CALLS.clear()
    r = ex.run(diamond(7))
    assert sorted(r.executed) == ["3", "4", "5"]
    assert r.values["4"] == (6 + 14,)
    assert toy.CALLS == {"Mul": 1, "Add": 1, "Show": 1}


def test_executor_reuses_across_workflows_and_node_ids(ex):
    a = {"1": call("Const", value=1), "2": call("Mul", a=link(1), factor=3), "3": call("Show", value=link(2))}
    b = {"10": call("Const", value=1), "11": call("Mul", a=link(10), factor=3),
         "12": call("Const", value=4), "13": call("Add", a=link(11), b=link(12)),
         "14": call("Show", value=link(13))}
    assert len(ex.run(a).executed) == 3
    rb = ex.run(b)
    assert sorted(rb.executed) == ["12", "13", "14"]      # 10, 11 hit a's entries
    assert rb.values["13"] == (7,)
    for wf in (a, b, a, b):                                # switching back and forth
        assert ex.run(wf).executed == []


def test_executor_file_replacement_invalidates_dependents(ex, env):
    f = env.input / "a.txt"
    f.write_text("one")
    wf = {"1": call("ReadText", path="a.txt"), "2": call("ShowText", text=link(1))}
    assert ex.run(wf).values["1"] == ("one",)
    assert ex.run(wf).executed == []
    tmp = env.input / "b.txt"
    tmp.write_text("two")
    os.replace(tmp, f)                                     # same name, new content
    r = ex.run(wf)
    assert sorted(r.executed) == ["1", "2"] and r.values["1"] == ("two",)


def test_executor_interrupt_stops_inside_a_node_and_keeps_finished(ex):
    stop = threading.Event()
    wf = {"1": call("Const", value=3), "2": call("Slow", x=link(1), steps=1000),
          "3": call("Show", value=link(2))}
    seen = []

    def on_event(e):
        seen.append(e)
        if isinstance(e, ev.Progress) and e.value == 5:
            stop.set()

    with pytest.raises(Interrupted) as info:
        ex.run(wf, on_event=on_event, interrupt=stop)
    assert info.value.report.status == "interrupted"
    assert max(e.value for e in seen if isinstance(e, ev.Progress)) == 5
    assert isinstance(seen[-1], ev.Executing) and seen[-1].node is None
    last = seen[-2]
    assert isinstance(last, ev.ExecutionInterrupted) and last.node_id == "2"
    assert last.to_comfy()[1]["executed"] == ["1"]
    assert toy.CALLS["Show"] == 0
    stop.clear()
    r = ex.run({**wf, "2": call("Slow", x=link(1), steps=3)}, interrupt=stop)
    assert r.cached == ["1"]


def test_executor_interrupt_between_nodes(ex):
    wf = {"1": call("Const", value=3), "2": call("Mul", a=link(1), factor=2), "3": call("Show", value=link(2))}

    def on_event(e):
        if isinstance(e, ev.Executing) and e.node == "2":
            ex.interrupt()

    with pytest.raises(Interrupted):
        ex.run(wf, on_event=on_event)
    assert toy.CALLS == {"Const": 1, "Mul": 1}
    assert ex.run(wf).cached == ["1", "2"]                 # the flag was cleared


def test_executor_failing_node_names_node_and_keeps_siblings_cached(ex):
    wf = {"1": call("Const", value=2), "2": call("Mul", a=link(1), factor=3),
          "3": call("Show", value=link(2)), "4": call("Fail", x=link(1), message="bad input"),
          "5": call("Show", value=link(4))}
    seen = []
    with pytest.raises(NodeError) as info:
        ex.run(wf, on_event=seen.append)
    err = info.value
    assert (err.node_id, err.class_type) == ("4", "Fail")
    assert "node 4 (Fail)" in str(err) and "bad input" in str(err)
    assert isinstance(err.__cause__, RuntimeError)
    assert err.report.status == "error"
    kind, data = next(e for e in seen if isinstance(e, ev.ExecutionError)).to_comfy()
    assert kind == "execution_error" and data["node_id"] == "4" and data["exception_type"] == "RuntimeError"
    finished = set(err.report.executed)
    assert {"1", "2"} <= finished
    toy.CALLS.clear()
    fixed = {**wf, "4": call("Mul", a=link(1), factor=5)}
    r = ex.run(fixed)
    assert set(r.cached) >= finished and toy.CALLS["Const"] == 0


def nan_wf(cli=None):
    return {"1": call("ToyModelLoader", scale=1.0), "2": call("Const", value=3),
            "3": call("NanIfHalf", model=link(1), x=link(2)), "4": call("ShowImage", image=link(3))}


def test_executor_nan_guard_reruns_only_offending_node_in_f32(ex):
    seen = []
    r = ex.run(nan_wf(), precision="bf16", on_event=seen.append)
    assert toy.CALLS == {"ToyModelLoader": 1, "Const": 1, "NanIfHalf": 2, "ShowImage": 1}
    node = r.nodes["3"]
    assert node.nan_fallback is True and node.precision == "bf16:f32"
    assert torch.equal(r.values["3"][0], torch.full((4,), 3.0))
    fb = [e for e in seen if isinstance(e, ev.NanFallback)]
    assert len(fb) == 1 and fb[0].node_id == "3" and fb[0].precision == "bf16"
    assert r.to_json()["nodes"]["3"]["nan_fallback"] is True
    assert not r.nodes["4"].nan_fallback
    again = ex.run(nan_wf(), precision="bf16")
    assert again.executed == [] and again.nodes["3"].nan_fallback is True


def test_executor_nan_guard_error_when_f32_still_non_finite(ex):
    wf = {"1": call("ToyModelLoader", scale=1.0), "2": call("AlwaysNan", model=link(1)),
          "3": call("ShowImage", image=link(2))}
    with pytest.raises(NodeError, match=r"node 2 \(AlwaysNan\).*NaN/Inf even with f32"):
        ex.run(wf, precision="f16")
    assert toy.CALLS["AlwaysNan"] == 2
    r = ex.run(wf, precision="f32")                        # not a precision problem: no guard
    assert toy.CALLS["AlwaysNan"] == 3 and not r.nodes["2"].nan_fallback


def test_executor_resolved_precision_is_in_key_and_report(ex):
    r = ex.run(nan_wf(), precision="f32")
    assert r.nodes["3"].precision == "f32" and r.nodes["1"].precision is None
    toy.CALLS.clear()
    r = ex.run(nan_wf(), precision="bf16:f32")
    assert sorted(r.executed) == ["3", "4"] and r.nodes["3"].precision == "bf16:f32"
    toy.CALLS.clear()
    r = ex.run(nan_wf(), precision="MODEL=f32")            # per-type default: same as f32
    assert r.executed == []


def test_executor_cache_key_same_in_fresh_executor_and_after_runs(ex, env):
    prompt = {"1": call("Const", value=2), "2": call("AddIfHalfVae", x=link(1)),
              "3": call("Show", value=link(2))}
    first = ex.run(prompt, precision="f32")
    assert sorted(first.executed) == ["1", "2", "3"] and first.values["2"] == (2,)
    assert ex.run(prompt, precision="f32").executed == []        # after a run: same keys
    fresh = Executor(REG, env, ex.cache)
    assert fresh.run(prompt, precision="f32").executed == []     # fresh executor: same keys
    toy.CALLS.clear()
    half = fresh.run(prompt, precision="f32,VAE=bf16")            # the declared type is in the key
    assert sorted(half.executed) == ["2", "3"] and half.values["2"] == (3,)
    assert ex.run(prompt, precision="f32,VAE=bf16").executed == []


def test_executor_undeclared_precision_type_is_an_error(ex):
    with pytest.raises(NodeError, match="asks for the VAE precision but declares only none") as e:
        ex.run({"1": call("Const", value=2), "2": call("AsksUndeclared", x=link(1)),
                "3": call("Show", value=link(2))})
    assert isinstance(e.value.__cause__, LookupError)
    assert e.value.node_id == "2"


def test_executor_region_beats_run_default(ex):
    from mixgraph.graph.prompt import PrecisionConfig, Region, Workflow
    from mixgraph.graph.formats.workflow import load_workflow
    wf = load_workflow(nan_wf(), REG)
    wf = Workflow(wf.prompt, PrecisionConfig("bf16", (Region("vae", frozenset({"3"}), "f16:f32"),)))
    r = ex.run(wf, precision="bf16")
    assert r.nodes["3"].precision == "f16:f32" and not r.nodes["3"].nan_fallback


def test_executor_non_deterministic_node_and_descendants_rerun(ex):
    wf = {"1": call("Const", value=1), "2": call("Random", x=link(1)), "3": call("Mul", a=link(2), factor=2),
          "4": call("Show", value=link(3))}
    first = ex.run(wf)
    second = ex.run(wf)
    assert second.cached == ["1"] and sorted(second.executed) == ["2", "3", "4"]
    assert first.values["2"] != second.values["2"]


def test_executor_output_files_in_report(ex, env):
    wf = {"1": call("Const", value=42), "2": call("SaveNumber", value=link(1), filename_prefix="n")}
    r = ex.run(wf)
    path = env.output / "n_2.txt"
    assert r.outputs == {"2": [str(path)]} and path.read_text() == "42"
    assert r.to_json()["outputs"] == {"2": [str(path)]}


def test_executor_invalid_workflow_runs_nothing(ex):
    with pytest.raises(ValidationFailed):
        ex.run({"1": call("Const", value=1), "2": call("Show", value=link(9))})
    assert not toy.CALLS


def test_executor_long_chain_has_no_recursion(ex):
    n = 20_000
    wf = {"0": call("Const", value=0)}
    wf.update({str(i): call("Mul", a=link(i - 1), factor=1) for i in range(1, n)})
    wf[str(n)] = call("Show", value=link(n - 1))
    r = ex.run(wf)
    assert len(r.executed) == n + 1 and ex.run(wf).executed == []


def test_api_run_builds_graph_in_code_and_shares_cache(ex, env):
    from mixgraph.ui import api
    g = api.Graph(precision="f32")
    one = g.add("Const", value=4)
    loader = g.add("ToyModelLoader", scale=0.5)
    out = g.add("NanIfHalf", model=loader, x=one)
    g.add("ShowImage", image=out)
    g.region("half", [out], "bf16")
    result = api.run(g, executor=ex, output=env.output)
    assert torch.equal(result[out.node_id][0], torch.full((4,), 2.0))
    assert result.report.nodes[out.node_id].nan_fallback is True
    again = api.run(g.build(), executor=ex, set={f"{one.node_id}.value": 4})
    assert again.report.executed == []
    changed = api.run(g.build(), executor=ex, set=[f"{one.node_id}.value=6"])
    assert torch.equal(changed[out.node_id][0], torch.full((4,), 3.0))
    with pytest.raises(ValueError, match="no node"):
        api.set_inputs(g.build(), {"99.value": 1})


def test_executor_same_workflow_object_rechecks_file_and_literals_each_run(ex, env):
    from mixgraph.graph.formats.workflow import load_workflow
    f = env.input / "a.txt"
    f.write_text("one")
    wf = load_workflow({"1": call("ReadText", path="a.txt"), "2": call("ShowText", text=link(1)),
                        "3": call("Const", value=2), "4": call("Mul", a=link(3), factor=3),
                        "5": call("Show", value=link(4))}, REG)
    assert ex.run(wf).values["1"] == ("one",) and ex.run(wf).executed == []
    tmp = env.input / "b.txt"
    tmp.write_text("two")
    os.replace(tmp, f)                                     # same name, same size, new content
    r = ex.run(wf)
    assert sorted(r.executed) == ["1", "2"] and r.values["1"] == ("two",)
    wf.prompt["3"].inputs["value"] = 5                     # the same NodeCall, changed in place
    r = ex.run(wf)
    assert sorted(r.executed) == ["3", "4", "5"] and r.values["4"] == (15,)
    wf.prompt["4"].inputs["factor"] = 101                  # now out of range: validation says so
    with pytest.raises(ValidationFailed, match="bigger than max"):
        ex.run(wf)


def test_executor_order_is_topological_with_prompt_order_ties(ex):
    seen = []
    wf = {"5": call("Show", value=link(4)), "1": call("Const", value=1),
          "4": call("Add", a=link(2), b=link(3)), "3": call("Mul", a=link(1), factor=2),
          "2": call("Mul", a=link(1), factor=3)}
    ex.run(wf, on_event=seen.append)
    assert [e.node for e in seen if isinstance(e, ev.Executing)] == ["1", "3", "2", "4", "5", None]


def test_executor_cached_rerun_sends_one_cached_event_and_no_per_node_events(ex):
    ex.run(diamond())
    seen = []
    r = ex.run(diamond(), on_event=seen.append)
    assert [e.to_comfy()[0] for e in seen] == ["execution_start", "execution_cached", "executed",
                                               "execution_success", "executing"]
    assert sorted(seen[1].nodes) == ["1", "2", "3", "4", "5"] and seen[0].planned == ()
    assert seen[-1].node is None and seen[2].node == "5" and r.ui["5"] == {"text": ["16"]}
