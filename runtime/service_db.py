"""The service's own bookkeeping: threads and runs (who owns them, status, metadata).

Graph state lives in the LangGraph checkpointer; this small SQLite file holds what the
LangGraph server API returns about threads and runs and is always filtered by tenant, so one
tenant can never read another's thread or run (an unknown id and a foreign id look the same).
"""
from __future__ import annotations

import json
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (
  thread_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL, metadata TEXT NOT NULL, status TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS threads_tenant ON threads(tenant, created_at);
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, tenant TEXT NOT NULL,
  assistant_id TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
  status TEXT NOT NULL, metadata TEXT NOT NULL, kwargs TEXT NOT NULL,
  multitask_strategy TEXT NOT NULL, error TEXT, attempts INTEGER NOT NULL DEFAULT 1);
CREATE INDEX IF NOT EXISTS runs_thread ON runs(thread_id, created_at);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
"""
ACTIVE = ("pending", "running")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


class ServiceDB:
    """Threads and runs in SQLite (WAL, one connection guarded by a lock; calls are short)."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _exec(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    # -- threads ----------------------------------------------------------------------------
    @staticmethod
    def _thread(row: sqlite3.Row) -> dict[str, Any]:
        return {"thread_id": row["thread_id"], "created_at": row["created_at"],
                "updated_at": row["updated_at"], "metadata": json.loads(row["metadata"]),
                "status": row["status"]}

    def create_thread(self, tenant: str, thread_id: str, metadata: dict) -> dict[str, Any] | None:
        """Insert a thread; None when the id is taken (by anyone)."""
        ts = now_iso()
        with self._lock:
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO threads VALUES (?,?,?,?,?,?)",
                (thread_id, tenant, ts, ts, json.dumps(metadata), "idle"))
            if cur.rowcount == 0:
                return None
        return self.get_thread(tenant, thread_id)

    def get_thread(self, tenant: str, thread_id: str) -> dict[str, Any] | None:
        rows = self._exec("SELECT * FROM threads WHERE thread_id=? AND tenant=?", (thread_id, tenant))
        return self._thread(rows[0]) if rows else None

    def thread_owner(self, thread_id: str) -> str | None:
        rows = self._exec("SELECT tenant FROM threads WHERE thread_id=?", (thread_id,))
        return rows[0]["tenant"] if rows else None

    def update_thread(self, tenant: str, thread_id: str, *, metadata: dict | None = None,
                      status: str | None = None) -> dict[str, Any] | None:
        t = self.get_thread(tenant, thread_id)
        if t is None:
            return None
        md = {**t["metadata"], **(metadata or {})}
        self._exec("UPDATE threads SET metadata=?, status=?, updated_at=? WHERE thread_id=? AND tenant=?",
                   (json.dumps(md), status or t["status"], now_iso(), thread_id, tenant))
        return self.get_thread(tenant, thread_id)

    def search_threads(self, tenant: str, metadata: dict | None, status: str | None,
                       limit: int, offset: int) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM threads WHERE tenant=?", [tenant]
        if status:
            sql += " AND status=?"
            args.append(status)
        rows = [self._thread(r) for r in self._exec(sql + " ORDER BY created_at DESC", tuple(args))]
        if metadata:
            rows = [t for t in rows if all(t["metadata"].get(k) == v for k, v in metadata.items())]
        return rows[offset:offset + limit]

    def delete_thread(self, tenant: str, thread_id: str) -> bool:
        with self._lock:
            cur = self._conn.execute("DELETE FROM threads WHERE thread_id=? AND tenant=?", (thread_id, tenant))
            self._conn.execute("DELETE FROM runs WHERE thread_id=? AND tenant=?", (thread_id, tenant))
            return cur.rowcount > 0

    def delete_tenant(self, tenant: str) -> list[str]:
        """Remove a tenant's threads and runs; returns the thread ids (to drop checkpoints)."""
        ids = [r["thread_id"] for r in self._exec("SELECT thread_id FROM threads WHERE tenant=?", (tenant,))]
        self._exec("DELETE FROM runs WHERE tenant=?", (tenant,))
        self._exec("DELETE FROM threads WHERE tenant=?", (tenant,))
        return ids

    # -- runs -------------------------------------------------------------------------------
    @staticmethod
    def _run(row: sqlite3.Row) -> dict[str, Any]:
        return {"run_id": row["run_id"], "thread_id": row["thread_id"], "assistant_id": row["assistant_id"],
                "created_at": row["created_at"], "updated_at": row["updated_at"], "status": row["status"],
                "metadata": json.loads(row["metadata"]), "multitask_strategy": row["multitask_strategy"],
                "kwargs": json.loads(row["kwargs"]), "error": row["error"], "attempts": row["attempts"]}

    def create_run(self, tenant: str, run_id: str, thread_id: str, assistant_id: str,
                   metadata: dict, kwargs: dict, multitask_strategy: str) -> dict[str, Any] | None:
        """Insert a pending run unless the thread already has an active one (then None)."""
        ts = now_iso()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                busy = self._conn.execute("SELECT 1 FROM runs WHERE thread_id=? AND status IN (?,?)",
                                          (thread_id, *ACTIVE)).fetchall()
                if busy:
                    self._conn.execute("ROLLBACK")
                    return None
                self._conn.execute(
                    "INSERT INTO runs (run_id, thread_id, tenant, assistant_id, created_at, updated_at, status,"
                    " metadata, kwargs, multitask_strategy) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (run_id, thread_id, tenant, assistant_id, ts, ts, "pending", json.dumps(metadata),
                     json.dumps(kwargs), multitask_strategy))
                self._conn.execute("UPDATE threads SET status='busy', updated_at=? WHERE thread_id=?",
                                   (ts, thread_id))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return self.get_run(tenant, thread_id, run_id)

    def get_run(self, tenant: str, thread_id: str, run_id: str) -> dict[str, Any] | None:
        rows = self._exec("SELECT * FROM runs WHERE run_id=? AND thread_id=? AND tenant=?",
                          (run_id, thread_id, tenant))
        return self._run(rows[0]) if rows else None

    def list_runs(self, tenant: str, thread_id: str, limit: int, offset: int,
                  status: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM runs WHERE thread_id=? AND tenant=?", [thread_id, tenant]
        if status:
            sql += " AND status=?"
            args.append(status)
        sql += " ORDER BY created_at DESC LIMIT ? OFFSET ?"
        return [self._run(r) for r in self._exec(sql, (*args, limit, offset))]

    def finish_run(self, run_id: str, thread_id: str, run_status: str, thread_status: str,
                   error: str | None = None) -> None:
        ts = now_iso()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("UPDATE runs SET status=?, error=?, updated_at=? WHERE run_id=?",
                               (run_status, error, ts, run_id))
            self._conn.execute("UPDATE threads SET status=?, updated_at=? WHERE thread_id=?",
                               (thread_status, ts, thread_id))
            self._conn.execute("COMMIT")

    def set_run_running(self, run_id: str) -> None:
        self._exec("UPDATE runs SET status='running', updated_at=? WHERE run_id=?", (now_iso(), run_id))

    def unfinished_runs(self) -> list[dict[str, Any]]:
        """Runs a killed server left pending or running (resumed on start), oldest first."""
        rows = self._exec("SELECT *, tenant FROM runs WHERE status IN (?,?) ORDER BY created_at", ACTIVE)
        return [{**self._run(r), "tenant": r["tenant"]} for r in rows]

    def bump_attempts(self, run_id: str) -> None:
        self._exec("UPDATE runs SET attempts=attempts+1 WHERE run_id=?", (run_id,))
