"""ComfyUI's jobs API (`GET /jobs`, `GET /jobs/{id}`): one list of queued, running and finished
prompts, which the web editor's queue and history panels read.

    GET /jobs?status=in_progress,pending&limit=200&offset=0&sort_by=created_at&sort_order=desc
        -> {"jobs": [job...], "pagination": {"offset", "limit", "total", "has_more"}}
    GET /jobs/{prompt_id} -> the job with "outputs", "execution_status" and "workflow"; 404 if none

A job is `{id, status, priority, create_time, outputs_count, [execution_start_time,
execution_end_time, execution_error, preview_output, workflow_id]}`; `status` is one of
pending, in_progress, completed, failed, cancelled (an interrupted prompt). Built from the same
queue items and history entries as `/queue` and `/history`; creation times come from the job
store (ui/server/jobstore.py), which records when each prompt was queued.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from mixgraph.ui.server.params import query_int

__all__ = ["STATUSES", "queue_job", "history_job", "list_jobs", "JobRoutes"]

STATUSES = ("pending", "in_progress", "completed", "failed", "cancelled")
_PREVIEWABLE = frozenset({"images", "video", "audio"})
_END_EVENTS = ("execution_success", "execution_error", "execution_interrupted")


def _meta(extra: dict, created: dict[str, int], prompt_id: str) -> dict:
    workflow = (extra.get("extra_pnginfo") or {}).get("workflow") or {}
    return {"create_time": extra.get("create_time") or created.get(prompt_id) or 0,
            "workflow_id": workflow.get("id") if isinstance(workflow, dict) else None}


def _prune(job: dict) -> dict:
    return {k: v for k, v in job.items() if v is not None}


def queue_job(item: list, status: str, created: dict[str, int] | None = None) -> dict:
    """A queue item `[number, prompt_id, prompt, extra_data, outputs]` as a job.
    `created`: creation times (ms) by prompt id, for items whose extra_data has none."""
    number, prompt_id, _prompt, extra, _outputs = item
    return _prune({"id": prompt_id, "status": status, "priority": number, "outputs_count": 0,
                   **_meta(extra, created or {}, prompt_id)})


def _outputs_summary(outputs: dict) -> tuple[int, dict | None]:
    """(number of output files, the first previewable one, preferring type "output")."""
    count, preview, fallback = 0, None, None
    for node_id, node_out in outputs.items():
        if not isinstance(node_out, dict):
            continue
        for media, items in node_out.items():
            if media == "animated" or not isinstance(items, list):
                continue
            for entry in items:
                if not isinstance(entry, dict):
                    continue
                count += 1
                if preview is None and media in _PREVIEWABLE:
                    rich = {**entry, "nodeId": str(node_id), "mediaType": media}
                    if entry.get("type") == "output":
                        preview = rich
                    elif fallback is None:
                        fallback = rich
    return count, preview or fallback


def history_job(prompt_id: str, entry: dict, details: bool = False,
                created: dict[str, int] | None = None) -> dict:
    """A history entry as a job; `details` adds outputs, execution_status and workflow."""
    number, _pid, prompt, extra, _outputs = entry["prompt"]
    status_info = entry.get("status") or {}
    start = end = error = None
    interrupted = False
    for message in status_info.get("messages") or ():
        if not (isinstance(message, (list, tuple)) and len(message) >= 2
                and isinstance(message[1], dict)):
            continue
        name, data = message[0], message[1]
        if name == "execution_start":
            start = data.get("timestamp")
        elif name in _END_EVENTS:
            end = data.get("timestamp")
            error = data if name == "execution_error" else error
            interrupted = interrupted or name == "execution_interrupted"
    if status_info.get("status_str") == "error":
        status = "cancelled" if interrupted and error is None else "failed"
    else:
        status = "completed"
    outputs = entry.get("outputs") or {}
    count, preview = _outputs_summary(outputs)
    job = _prune({"id": prompt_id, "status": status, "priority": number,
                  **_meta(extra, created or {}, prompt_id),
                  "execution_start_time": start, "execution_end_time": end,
                  "execution_error": error, "outputs_count": count, "preview_output": preview})
    if details:
        job.update(outputs=outputs, execution_status=status_info,
                   workflow={"prompt": prompt, "extra_data": extra})
    return job


def list_jobs(running: list, pending: list, history: dict, statuses: tuple[str, ...] = STATUSES,
              workflow_id: str | None = None, sort_by: str = "created_at",
              descending: bool = True, created: dict[str, int] | None = None) -> list[dict]:
    """All jobs of the given statuses, sorted by creation time (or execution duration)."""
    created = created or {}
    jobs = [queue_job(i, "in_progress", created) for i in running] \
        if "in_progress" in statuses else []
    if "pending" in statuses:
        jobs += [queue_job(i, "pending", created) for i in pending]
    jobs += [j for j in (history_job(pid, e, False, created) for pid, e in history.items())
             if j["status"] in statuses]
    if workflow_id:
        jobs = [j for j in jobs if j.get("workflow_id") == workflow_id]
    if sort_by == "execution_duration":
        def key(j: dict) -> float:
            s, e = j.get("execution_start_time"), j.get("execution_end_time")
            return (e - s) if s and e else 0
    else:
        def key(j: dict) -> float:
            return j.get("create_time") or 0
    return sorted(jobs, key=key, reverse=descending)


class JobRoutes:
    """`/jobs` over a PromptQueue (its `snapshot()`, `history()` and `created_times()`)."""

    def __init__(self, queue: Any):
        self.queue = queue

    def _all(self) -> tuple[list, list, dict, dict[str, int]]:
        running, pending = self.queue.snapshot()
        return running, pending, self.queue.history(), self.queue.created_times()

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("GET", "/jobs", self.jobs), ("GET", "/jobs/{job_id}", self.job)]

    async def jobs(self, request: web.Request) -> web.Response:
        q = request.query
        statuses = tuple(s.strip() for s in q.get("status", "").split(",") if s.strip())
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown:
            raise web.HTTPBadRequest(text=f"unknown job status {unknown[0]!r}; known: "
                                          f"{', '.join(STATUSES)}")
        sort_by = q.get("sort_by", "created_at")
        if sort_by not in ("created_at", "execution_duration"):
            raise web.HTTPBadRequest(text="sort_by must be created_at or execution_duration")
        order = q.get("sort_order", "desc")
        if order not in ("asc", "desc"):
            raise web.HTTPBadRequest(text="sort_order must be asc or desc")
        limit, offset = query_int(request, "limit", None, 0), query_int(request, "offset", 0, 0)
        running, pending, history, created = await asyncio.get_running_loop().run_in_executor(
            None, self._all)        # up to max_history entries read from the store
        jobs = list_jobs(running, pending, history, statuses or STATUSES,
                         q.get("workflow_id") or None, sort_by, order == "desc", created)
        total = len(jobs)
        page = jobs[offset:] if limit is None else jobs[offset:offset + limit]
        return web.json_response(
            {"jobs": page, "pagination": {"offset": offset, "limit": limit if limit is not None
                                          else total, "total": total,
                                          "has_more": offset + len(page) < total}},
            dumps=_dumps)

    async def job(self, request: web.Request) -> web.Response:
        pid = request.match_info["job_id"]
        job = await asyncio.get_running_loop().run_in_executor(None, self._job, pid)  # the store
        if job is None:
            raise web.HTTPNotFound(text=f"no job {pid!r}")
        return web.json_response(job, dumps=_dumps)

    def _job(self, pid: str) -> dict | None:
        entry = self.queue.history_item(pid).get(pid)
        created = self.queue.created_times()
        if entry is not None:
            return history_job(pid, entry, True, created)
        running, pending = self.queue.snapshot()
        for items, status in ((running, "in_progress"), (pending, "pending")):
            for item in items:
                if item[1] == pid:
                    return queue_job(item, status, created)
        return None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
