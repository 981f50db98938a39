"""The server tests again, with `--ray`: prompts run on one Ray worker (an actor in another
process) while the front server keeps the API, queue, history and WebSocket. Every test here is
one of tests/test_server.py's, unchanged; those that look into the front process's executor
(its cache, its call counters) stay local-only. Skipped without the ray package."""

from __future__ import annotations

import pytest

from mixgraph.ui.ray.ray_pool import RayConfig
from tests import test_server
from tests.test_server import (env,  # noqa: F401 - fixture
                               test_server_failing_prompt_keeps_worker_alive,
                               test_server_history_paging_delete_and_clear,
                               test_server_post_prompt_success_shape_and_history_entry,
                               test_server_post_prompt_validation_errors_are_comfyui_400,
                               test_server_queue_front_delete_clear_and_interrupt,
                               test_server_ws_message_sequence_for_a_run,
                               test_server_ws_preview_frames_with_and_without_metadata,
                               test_server_ws_progress_and_per_client_delivery)
from tests.test_server_dynamic import test_server_expanding_loop_outputs_in_history

__all__ = ["test_server_failing_prompt_keeps_worker_alive",
           "test_server_history_paging_delete_and_clear",
           "test_server_post_prompt_success_shape_and_history_entry",
           "test_server_post_prompt_validation_errors_are_comfyui_400",
           "test_server_queue_front_delete_clear_and_interrupt",
           "test_server_ws_message_sequence_for_a_run",
           "test_server_ws_preview_frames_with_and_without_metadata",
           "test_server_ws_progress_and_per_client_delivery",
           "test_server_expanding_loop_outputs_in_history"]


@pytest.fixture(autouse=True)
def ray_mode(ray_cluster):
    """Every app these tests build runs its prompts on one Ray worker with the toy registry."""
    test_server.SERVER_KW["ray"] = RayConfig(workers=1, registry=test_server.registry)
    yield
    test_server.SERVER_KW.pop("ray", None)
