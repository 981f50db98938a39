"""A real crash: `mixgraph serve` killed with SIGKILL while a prompt runs, then started again on
the same user directory. The job store (ui/server/jobstore.py) must bring back the history (with the
image still viewable), mark the running prompt interrupted, run the pending ones, and let the
interrupted one be re-queued. Tiny generated SD1.5 checkpoint, CPU, no network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_editor_browser import free_port, get_json, txt2img

ROOT = Path(__file__).resolve().parents[1]
SLOW_STEPS = 100        # the prompt that is running at the kill: seconds of sampling on CPU


def _spawn(tmp: Path, deadline: float) -> tuple[subprocess.Popen, str]:
    """`python -m mixgraph serve` in `tmp` (so its user directory is tmp/user), answering."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")    # a tiny model: more threads only fight over shared cores
    log = open(tmp / "server.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mixgraph", "serve", "--port", str(port), "--models",
         str(tmp / "models"), "--input", str(tmp / "input"), "--output", str(tmp / "output")],
        cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {_log(tmp)}")
        try:
            get_json(url + "/api/system_stats", timeout=1)
            return proc, url
        except OSError:
            if time.monotonic() > deadline:
                _stop(proc)
                raise AssertionError(f"server did not answer in time: {_log(tmp)}") from None
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def _log(tmp: Path) -> str:
    return (tmp / "server.log").read_text(errors="replace")[-3000:]


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data = r.read()
    return json.loads(data) if data else {}


def _prompt(seed: int, steps: int = 2) -> dict:
    p = txt2img()
    p["3"]["inputs"].update(seed=seed, steps=steps)
    return p


def _wait(what: str, check, deadline: float):
    """Poll `check()` until it returns something truthy; fail naming `what` at the deadline."""
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


def _entry(url: str, pid: str) -> dict | None:
    return get_json(f"{url}/history/{pid}").get(pid)


def test_jobs_survive_kill_9_and_interrupted_prompt_requeues(tmp_path):
    from mixgraph.nodes.weights.synthetic import write_sd15_checkpoint
    from mixgraph.ui.server.queue import STOPPED_MESSAGE
    write_sd15_checkpoint(tmp_path / "models" / "checkpoints" / "sd15.safetensors", "tiny")
    deadline = time.monotonic() + 240
    proc, url = _spawn(tmp_path, time.monotonic() + 60)
    try:
        done = _post(url, "/prompt", {"prompt": _prompt(1), "client_id": "c1"})["prompt_id"]
        slow = _post(url, "/prompt", {"prompt": _prompt(2, SLOW_STEPS)})["prompt_id"]
        pending = [_post(url, "/prompt", {"prompt": _prompt(s)})["prompt_id"] for s in (3, 4)]
        _wait("the first prompt finished", lambda: _entry(url, done), deadline)

        def slow_running() -> bool:
            q = get_json(url + "/queue")
            if _entry(url, slow):
                raise AssertionError("the slow prompt finished before the kill; raise SLOW_STEPS")
            return [i[1] for i in q["queue_running"]] == [slow]
        _wait("the slow prompt is running", slow_running, deadline)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        assert (tmp_path / "user" / "mixgraph" / "jobs.sqlite3").is_file()

        proc, url = _spawn(tmp_path, time.monotonic() + 60)
        first = _entry(url, done)
        assert first is not None, "the finished prompt is not in the history after the restart"
        assert first["status"]["status_str"] == "success" and first["status"]["completed"]
        assert first["prompt"][1] == done and first["prompt"][3]["client_id"] == "c1"
        image = first["outputs"]["9"]["images"][0]
        with urllib.request.urlopen(f"{url}/view?filename={image['filename']}&type=output",
                                    timeout=10) as r:
            assert r.status == 200 and r.read().startswith(b"\x89PNG")

        cut = _entry(url, slow)
        assert cut is not None, "the prompt running at the kill is not in the history"
        assert cut["status"]["status_str"] == "error" and cut["status"]["completed"] is False
        messages = dict(cut["status"]["messages"])
        assert messages["execution_error"]["exception_message"] == STOPPED_MESSAGE
        assert messages["execution_interrupted"]["prompt_id"] == slow
        assert cut["prompt"][2] == _prompt(2, SLOW_STEPS)
        job = get_json(f"{url}/api/jobs/{slow}")
        assert job["status"] == "failed"
        assert job["execution_error"]["exception_message"] == STOPPED_MESSAGE

        for pid in pending:       # queued before the kill, run after the restart
            entry = _wait(f"pending prompt {pid} ran after the restart",
                          lambda: _entry(url, pid), deadline)
            assert entry["status"]["status_str"] == "success", entry["status"]
            assert entry["outputs"]["9"]["images"]

        again = _post(url, f"/history/{slow}/requeue", {})
        assert again["prompt_id"] != slow and again["node_errors"] == {}
        entry = _wait("the re-queued prompt finished",
                      lambda: _entry(url, again["prompt_id"]), deadline)
        assert entry["status"]["status_str"] == "success", entry["status"]
        assert entry["prompt"][2] == _prompt(2, SLOW_STEPS) and entry["outputs"]["9"]["images"]
        history = get_json(url + "/history")
        assert list(history) == [done, slow, *pending, again["prompt_id"]]
        with pytest.raises(urllib.error.HTTPError) as e:
            _post(url, "/history/unknown/requeue", {})
        assert e.value.code == 404
    finally:
        _stop(proc)
