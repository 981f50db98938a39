"""Test-wide settings: tiny models run fastest single-threaded (no thread start-up per op).

`auto` depends on the CPU (native bf16 makes the UNet compute in bf16), so the suite pins the CPU
flags it sees to a CPU without native half precision or int8: every test resolves `auto` the same
on every machine. The decision table itself is tested on synthetic capability sets
(tests/test_hardware.py). Child processes the tests start inherit the pin.
"""

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

os.environ["MIXGRAPH_CPU_FLAGS"] = "sse4_2 avx avx2 fma"

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance for the `--ray` tests, started once per session with 2 CPUs (one per
    worker) and no dashboard; skipped without the ray package. Workers inherit this process's
    environment: the source tree on PYTHONPATH (they import mixgraph and the tests' registries)
    and one thread each."""
    ray = pytest.importorskip("ray")
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None,
                                                             [os.environ.get("PYTHONPATH")])])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def pytest_sessionfinish(session, exitstatus):
    """A test that failed half-way may leave a multiprocessing child waiting for a peer; Python's
    exit joins such children, so the run would never end. Kill them, saying which."""
    for child in multiprocessing.active_children():
        print(f"\nconftest: killing {child.name} (pid {child.pid}), left running by a test")
        child.kill()
        child.join(30)


@pytest.fixture
def fresh_memory_budget():
    """No memory budget set and an empty weight store before and after the test (modules that
    set budgets ask for it with `pytestmark` or `autouse` wrappers)."""
    from mixgraph.nodes.models import memory_budget
    from mixgraph.nodes.weights import store

    memory_budget.reset()
    store.clear()
    yield
    memory_budget.reset()
    store.clear()


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-op tests: on a shared 2-core machine tiny ops are
    ~50x faster on one thread (no OpenMP contention). Modules ask for it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
