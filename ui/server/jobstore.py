"""The job store: the prompt queue and the history in one SQLite file, so that a crash of the
server (even `kill -9`) loses neither (DESIGN §5).

    store = JobStore(user_root / "mixgraph" / "jobs.sqlite3", max_history=10_000)
    store.open()                      # JobStoreError (naming the file) if it cannot be used

Two tables. `queue` holds every prompt that has not finished: its number (run order), its state
(`pending`, or `running` while the worker has it) and the request as JSON (what `QueueItem.record`
writes: the API prompt, the prompt as submitted, extra_data, targets and validated outputs).
`history` holds finished prompts in ComfyUI's entry shape, split into columns (prompt item,
outputs, meta, status_str, completed, messages) plus the request again, for re-queueing, and the
creation and finish times. A prompt moves from `queue` to `history` in one transaction; the
history is trimmed to `max_history` entries (oldest first) in that same transaction.

The file is in WAL mode with `synchronous=NORMAL`: a commit is in the WAL before it returns, so a
killed process loses nothing committed; only a power cut or OS crash can lose the last few
commits, and never corrupts the file. FULL would add an fsync per queued or finished prompt, paid
on the server's event loop, to protect against power loss, which the queue does not need.

One server per file: the connection holds SQLite's lock on it (`locking_mode=EXCLUSIVE`, taken
at open), so a second server started on the same user directory gets a clear error instead of
running the first one's queue too. The operating system drops the lock when a process dies.

Threads: the aiohttp loop (queueing, reads, deletes) and the prompt worker (start, finish) share
one connection (`check_same_thread=False`) behind a lock; every statement is short.
`JobStore(None)` keeps the same tables in memory (tests, embedding without a user directory).

Plain `sqlite3` (standard library): the store needs a handful of statements, no ORM.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["JobStore", "JobStoreError", "QueuedRow", "MAX_HISTORY", "DB_NAME"]

MAX_HISTORY = 10_000          # ComfyUI's MAXIMUM_HISTORY_SIZE
DB_NAME = "jobs.sqlite3"
_SCHEMA_VERSION = 2          # 2: history.mixgraph (where and why a prompt ran: Ray workers)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,   -- arrival order: ties of `number`
    prompt_id  TEXT NOT NULL UNIQUE,
    number     REAL NOT NULL,                       -- run order (lowest first)
    state      TEXT NOT NULL CHECK (state IN ('pending', 'running')),
    request    TEXT NOT NULL,                       -- JSON, QueueItem.record()
    created_ms INTEGER NOT NULL,
    started_ms INTEGER
);
CREATE TABLE IF NOT EXISTS history (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,  -- finish order: oldest dropped first
    prompt_id   TEXT NOT NULL UNIQUE,
    number      REAL NOT NULL,
    item        TEXT NOT NULL,     -- JSON [number, prompt_id, prompt, extra_data, outputs]
    outputs     TEXT NOT NULL,     -- JSON {node_id: ui}
    meta        TEXT NOT NULL,     -- JSON {node_id: {node_id, display_node, ...}}
    status_str  TEXT NOT NULL,     -- "success" | "error"
    completed   INTEGER NOT NULL,
    messages    TEXT NOT NULL,     -- JSON [[event, data], ...]
    request     TEXT NOT NULL,     -- JSON, QueueItem.record(): what a re-queue submits
    created_ms  INTEGER NOT NULL,
    finished_ms INTEGER NOT NULL,
    mixgraph    TEXT NOT NULL DEFAULT '{}'   -- JSON, status["mixgraph"]: worker, reason, retries, memory
);
"""


class JobStoreError(Exception):
    """The job store file cannot be opened, read or written; the message names the file."""


class QueuedRow:
    """One row of the `queue` table, as `pending()` and `recover()` return it."""

    __slots__ = ("prompt_id", "number", "request", "created_ms", "started_ms")

    def __init__(self, prompt_id: str, number: float, request: dict, created_ms: int,
                 started_ms: int | None):
        self.prompt_id, self.number, self.request = prompt_id, number, request
        self.created_ms, self.started_ms = created_ms, started_ms


_SQL_INT_MAX = 2 ** 63 - 1


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)       # as the HTTP API renders odd values


class JobStore:
    """Queue rows and history entries in SQLite (WAL). `path=None`: in memory."""

    def __init__(self, path: str | os.PathLike | None, max_history: int = MAX_HISTORY):
        if max_history < 1:
            raise ValueError(f"max_history must be at least 1, not {max_history}")
        self.path = Path(path).absolute() if path is not None else None
        self.max_history = max_history
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"JobStore({str(self.path) if self.path else ':memory:'})"

    @property
    def _name(self) -> str:
        return str(self.path) if self.path is not None else "the in-memory job store"

    # --- opening ---------------------------------------------------------------------------------

    def open(self) -> None:
        """Open (creating the file and its folder if needed). Idempotent."""
        with self._lock:
            if self._db is not None:
                return
            db = None
            try:
                if self.path is not None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path if self.path is not None else ":memory:",
                                     check_same_thread=False, isolation_level=None, timeout=1)
                db.execute("PRAGMA locking_mode=EXCLUSIVE")     # one server per store
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > _SCHEMA_VERSION:
                    raise JobStoreError(
                        f"job store {self._name} was written by a newer mixgraph (schema "
                        f"{version}, this one knows {_SCHEMA_VERSION}); upgrade mixgraph or move "
                        "the file away")
                if self.path is not None:
                    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise JobStoreError(f"job store {self._name}: the file system does not "
                                            f"support SQLite's WAL mode (got {mode!r})")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                columns = {row[1] for row in db.execute("PRAGMA table_info(history)")}
                if "mixgraph" not in columns:          # a schema 1 file: add the column
                    db.execute("ALTER TABLE history ADD COLUMN mixgraph TEXT NOT NULL "
                               "DEFAULT '{}'")
                db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
                self._db = db
                self._trim()
            except JobStoreError:
                if db is not None:
                    db.close()
                self._db = None
                raise
            except (sqlite3.Error, OSError) as e:
                if db is not None:
                    db.close()
                self._db = None
                raise JobStoreError(_explain(self._name, e)) from None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    @contextmanager
    def _tx(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; `write`: one IMMEDIATE transaction, all or nothing."""
        with self._lock:
            if self._db is None:
                self.open()
            db = self._db
            assert db is not None
            try:
                if write:
                    db.execute("BEGIN IMMEDIATE")
                    try:
                        yield db
                    except BaseException:
                        db.execute("ROLLBACK")
                        raise
                    db.execute("COMMIT")
                else:
                    yield db
            except sqlite3.Error as e:
                raise JobStoreError(_explain(self._name, e)) from None

    # --- the queue -------------------------------------------------------------------------------

    def add(self, prompt_id: str, number: float, request: dict, created_ms: int) -> None:
        """A new pending prompt (replacing a queued one with the same id)."""
        with self._tx(write=True) as db:
            db.execute("DELETE FROM queue WHERE prompt_id = ?", (prompt_id,))
            db.execute("INSERT INTO queue (prompt_id, number, state, request, created_ms) "
                       "VALUES (?, ?, 'pending', ?, ?)",
                       (prompt_id, number, _dumps(request), created_ms))

    def set_running(self, prompt_id: str, started_ms: int) -> None:
        with self._tx(write=True) as db:
            db.execute("UPDATE queue SET state = 'running', started_ms = ? WHERE prompt_id = ?",
                       (started_ms, prompt_id))

    def remove_pending(self, prompt_ids: list[str] | None = None) -> int:
        """Delete pending prompts (all when `prompt_ids` is None); running ones stay."""
        with self._tx(write=True) as db:
            if prompt_ids is None:
                return db.execute("DELETE FROM queue WHERE state = 'pending'").rowcount
            return sum(db.execute("DELETE FROM queue WHERE prompt_id = ? AND state = 'pending'",
                                  (pid,)).rowcount for pid in prompt_ids)

    def queued(self) -> tuple[list[QueuedRow], list[QueuedRow]]:
        """(running, pending) rows, pending in run order: what a restart finds."""
        with self._tx() as db:
            rows = db.execute("SELECT prompt_id, number, request, created_ms, started_ms, state "
                              "FROM queue ORDER BY number, seq").fetchall()
        running, pending = [], []
        for pid, number, request, created, started, state in rows:
            row = QueuedRow(pid, number, json.loads(request), created, started)
            (running if state == "running" else pending).append(row)
        return running, pending

    def max_number(self) -> float | None:
        """The largest |number| stored (queue and history; None if empty), so that a restarted
        server's counter goes on after it."""
        with self._tx() as db:
            return db.execute("SELECT MAX(m) FROM (SELECT MAX(ABS(number)) AS m FROM queue "
                              "UNION ALL SELECT MAX(ABS(number)) FROM history)").fetchone()[0]

    # --- the history -----------------------------------------------------------------------------

    def finish(self, prompt_id: str, entry: dict, request: dict, created_ms: int,
               finished_ms: int) -> None:
        """Move a prompt from the queue into the history (ComfyUI's entry shape), in one
        transaction; the oldest entries beyond `max_history` go."""
        status = entry["status"]
        with self._tx(write=True) as db:
            db.execute("DELETE FROM queue WHERE prompt_id = ?", (prompt_id,))
            db.execute("DELETE FROM history WHERE prompt_id = ?", (prompt_id,))
            db.execute(
                "INSERT INTO history (prompt_id, number, item, outputs, meta, status_str, "
                "completed, messages, request, created_ms, finished_ms, mixgraph) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (prompt_id, entry["prompt"][0], _dumps(entry["prompt"]), _dumps(entry["outputs"]),
                 _dumps(entry.get("meta") or {}), status["status_str"], int(status["completed"]),
                 _dumps(status["messages"]), _dumps(request), created_ms, finished_ms,
                 _dumps(status.get("mixgraph") or {})))
            self._trim()

    def _trim(self) -> None:
        assert self._db is not None
        self._db.execute("DELETE FROM history WHERE seq <= (SELECT seq FROM history ORDER BY "
                         "seq DESC LIMIT 1 OFFSET ?)", (self.max_history,))

    def history(self, max_items: int | None = None, offset: int = -1) -> dict[str, dict]:
        """ComfyUI's get_history, oldest first: everything by default; `max_items` alone gives
        the newest; `offset` counts from the oldest."""
        with self._tx() as db:
            if offset < 0 and max_items is not None:
                total = db.execute("SELECT COUNT(*) FROM history").fetchone()[0]
                offset = total - max_items
            offset = min(max(offset, 0), _SQL_INT_MAX)      # SQLite's integers are 64-bit
            limit = -1 if max_items is None else min(max(max_items, 0), _SQL_INT_MAX)
            rows = db.execute(f"SELECT {_ENTRY_COLUMNS} FROM history ORDER BY seq "
                              "LIMIT ? OFFSET ?", (limit, offset)).fetchall()
        return {row[0]: _entry(row) for row in rows}

    def history_item(self, prompt_id: str) -> dict | None:
        with self._tx() as db:
            row = db.execute(f"SELECT {_ENTRY_COLUMNS} FROM history WHERE prompt_id = ?",
                             (prompt_id,)).fetchone()
        return _entry(row) if row is not None else None

    def history_request(self, prompt_id: str) -> dict | None:
        """The stored request of a finished prompt (what re-queueing submits), or None."""
        with self._tx() as db:
            row = db.execute("SELECT request FROM history WHERE prompt_id = ?",
                             (prompt_id,)).fetchone()
        return json.loads(row[0]) if row is not None else None

    def delete_history(self, prompt_ids: list[str] | None = None) -> None:
        """Delete these entries (all when `prompt_ids` is None)."""
        with self._tx(write=True) as db:
            if prompt_ids is None:
                db.execute("DELETE FROM history")
            else:
                db.executemany("DELETE FROM history WHERE prompt_id = ?",
                               [(pid,) for pid in prompt_ids])

    def created_times(self) -> dict[str, int]:
        """Creation time (ms since the epoch) of every queued and finished prompt."""
        with self._tx() as db:
            rows = db.execute("SELECT prompt_id, created_ms FROM history UNION ALL "
                              "SELECT prompt_id, created_ms FROM queue").fetchall()
        return dict(rows)


_ENTRY_COLUMNS = "prompt_id, item, outputs, meta, status_str, completed, messages, mixgraph"


def _entry(row: tuple) -> dict:
    _pid, item, outputs, meta, status_str, completed, messages, ours = row
    status = {"status_str": status_str, "completed": bool(completed),
              "messages": json.loads(messages)}
    if ours and ours != "{}":        # mixgraph's own facts (Ray placement); ComfyUI has none
        status["mixgraph"] = json.loads(ours)
    return {"prompt": json.loads(item), "outputs": json.loads(outputs), "meta": json.loads(meta),
            "status": status}


def _explain(name: str, error: Exception) -> str:
    text = str(error)
    if isinstance(error, sqlite3.DatabaseError) and ("not a database" in text
                                                     or "malformed" in text):
        hint = "the file is damaged or not a job store; move it away to start with an empty queue"
    elif "locked" in text:
        hint = ("another mixgraph server is using it; stop that one or start this one with "
                "another user directory")
    elif "readonly" in text or "unable to open" in text or isinstance(error, OSError):
        hint = "check that the folder exists and is writable (or choose another user directory)"
    else:
        hint = "check the file and its folder"
    return f"job store {name}: {text} ({hint})"
