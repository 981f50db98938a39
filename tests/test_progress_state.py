"""ComfyUI's `progress_state` WebSocket message (ui/server/progress_state.py): the node states of
one prompt as newer ComfyUI's WebUIProgressHandler sends them, from mixgraph's execution events."""

from __future__ import annotations

from mixgraph.graph import events as ev
from mixgraph.ui.server.progress_state import ProgressStates


def states(msgs):
    assert [t for t, _ in msgs] == ["progress_state"] * len(msgs)
    return [{n: (s["state"], s["value"], s["max"]) for n, s in d["nodes"].items()} for _, d in msgs]


def test_start_progress_finish_and_success():
    p = ProgressStates("p1")
    assert states(p.before(ev.Executing("p1", "3", "KSampler"))) == [{"3": ("running", 0.0, 1.0)}]
    assert p.after(ev.Executing("p1", "3")) == []
    assert states(p.before(ev.Progress("p1", "3", 2, 20))) == [{"3": ("running", 2.0, 20.0)}]
    # the next node's start finishes the one before it (value set to max, as ComfyUI's finish)
    assert states(p.before(ev.Executing("p1", "8", "VAEDecode"))) == [
        {"3": ("finished", 20.0, 20.0), "8": ("running", 0.0, 1.0)}]
    assert states(p.before(ev.Executing("p1", "9", "SaveImage"))) == [
        {"3": ("finished", 20.0, 20.0), "8": ("finished", 1.0, 1.0), "9": ("running", 0.0, 1.0)}]
    assert p.before(ev.Executed("p1", "9", {"images": []})) == []
    assert states(p.after(ev.Executed("p1", "9", {"images": []})))[0]["9"] == ("finished", 1.0, 1.0)
    assert p.before(ev.ExecutionSuccess("p1")) == []          # nothing left running
    assert p.before(ev.Executing("p1", None)) == [] and p.after(ev.Executing("p1", None)) == []


def test_success_finishes_what_still_runs_and_payload_fields():
    p = ProgressStates("p2")
    _, data = p.before(ev.Executing("p2", "12:5", "KSampler", display_node="12"))[0]
    assert data == {"prompt_id": "p2", "nodes": {"12:5": {
        "value": 0.0, "max": 1.0, "state": "running", "node_id": "12:5", "prompt_id": "p2",
        "display_node_id": "12", "parent_node_id": "12", "real_node_id": "12"}}}
    assert states(p.before(ev.ExecutionSuccess("p2"))) == [{"12:5": ("finished", 1.0, 1.0)}]


def test_cached_output_nodes_and_errors():
    p = ProgressStates("p3")
    # an output node replayed from the cache (`executed` only) is reported finished
    assert states(p.after(ev.Executed("p3", "5", {"text": ["16"]}))) == [{"5": ("finished", 1.0, 1.0)}]
    assert p.after(ev.Executed("p3", "5", {"text": ["16"]})) == []  # already finished: no message
    p.before(ev.Executing("p3", "6"))
    # ComfyUI never marks a node `error`: an error or an interrupt sends no state
    assert p.before(ev.ExecutionError("p3", "6", "Boom")) == []
    assert p.after(ev.ExecutionInterrupted("p3", "6")) == []
    assert p.before(ev.ExecutionCached("p3", ("1",))) == [] and p.before(ev.ExecutionStart("p3")) == []
