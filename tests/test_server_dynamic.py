"""Dynamic execution through the HTTP API: partial_execution_targets and an expanding loop."""

from tests import toy_nodes as toy
from tests.test_server import env, post_prompt, run, wait_history  # noqa: F401 - env: fixture
from tests.toy_nodes import call, link


def test_server_partial_execution_targets_run_only_those_outputs(env):
    wf = {"1": call("Const", value=2), "2": call("Mul", a=link(1), factor=3),
          "3": call("Show", value=link(2)), "4": call("Const", value=9),
          "5": call("Show", value=link(4))}

    async def body(c):
        toy.CALLS.clear()
        status, out = await post_prompt(c, wf, partial_execution_targets=["5"])
        assert status == 200
        entry = await wait_history(c, out["prompt_id"])
        assert entry["status"]["status_str"] == "success"
        assert set(entry["outputs"]) == {"5"} and toy.CALLS["Mul"] == 0

    run(body, env)


def test_server_expanding_loop_outputs_in_history(env):
    wf = {"1": call("Const", value=5), "2": call("CountLoop", value=link(1), n=3, step=2),
          "3": call("Show", value=link(2))}

    async def body(c):
        status, out = await post_prompt(c, wf)
        assert status == 200
        entry = await wait_history(c, out["prompt_id"])
        assert entry["status"]["status_str"] == "success"
        assert entry["outputs"]["3"] == {"text": ["11"]}

    run(body, env)
