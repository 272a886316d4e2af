"""Runs: execute the compiled graph in worker threads and fan its stream out to HTTP clients.

A run is one `graph.stream(...)` call on a thread's checkpoint (input or `Command(resume=...)`).
Every chunk is published as an SSE-ready event to a `RunHandle`, which any number of clients
follow (the creating stream, `join`, `join_stream` with `Last-Event-ID`). Checkpoints are
written synchronously after each step (`durability="sync"`), so a server killed mid-run loses
no committed step: on start, `resume_unfinished()` continues every run left pending or running
from its thread's last checkpoint.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

from langgraph.types import Command

from runtime.service_db import ServiceDB

log = logging.getLogger("evolve.runtime")
SUPPORTED_MODES = ("values", "updates", "custom", "debug", "tasks", "checkpoints", "messages",
                   "messages-tuple")


def to_jsonable(obj: Any) -> Any:
    """LangGraph/LangChain objects -> plain JSON (messages, Interrupts, pydantic, tuples)."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [to_jsonable(v) for v in obj]
    if type(obj).__name__ == "Interrupt" and hasattr(obj, "value"):
        return {"value": to_jsonable(obj.value), "id": getattr(obj, "id", None)}
    if hasattr(obj, "model_dump"):
        return to_jsonable(obj.model_dump())
    if hasattr(obj, "_asdict"):
        return to_jsonable(obj._asdict())
    return str(obj)


class RunHandle:
    """The in-memory event log of one run; producers are worker threads, followers asyncio tasks."""

    def __init__(self, run: dict[str, Any], tenant: str, modes: list[str]):
        self.run_id, self.thread_id, self.tenant = run["run_id"], run["thread_id"], tenant
        self.modes = modes
        self.events: list[tuple[int, str, Any]] = []
        self.status = "pending"
        self.finished = threading.Event()
        self.cancel_requested = False
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def publish(self, event: str, data: Any) -> None:
        with self._lock:
            self.events.append((len(self.events), event, data))
            waiters = list(self._waiters)
        for loop, ev in waiters:
            loop.call_soon_threadsafe(ev.set)

    def finish(self, status: str) -> None:
        self.status = status
        self.publish("end", {"run_id": self.run_id, "status": status})
        self.finished.set()

    async def follow(self, after: int = -1) -> AsyncIterator[tuple[int, str, Any]]:
        """Yield events with sequence number > `after`, live, until the run ends."""
        loop, ev = asyncio.get_running_loop(), asyncio.Event()
        key = (loop, ev)
        with self._lock:
            self._waiters.add(key)
        try:
            i = after + 1
            while True:
                ev.clear()
                with self._lock:
                    batch = self.events[i:]
                for e in batch:
                    yield e
                i += len(batch)
                if batch and batch[-1][1] == "end":
                    return
                if not batch:
                    try:
                        await asyncio.wait_for(ev.wait(), timeout=1.0)
                    except asyncio.TimeoutError:
                        pass
        finally:
            with self._lock:
                self._waiters.discard(key)

    async def wait(self) -> str:
        async for _ in self.follow():
            pass
        return self.status


class RunManager:
    """Starts runs on a thread pool, tracks their handles, records status in the service DB."""

    def __init__(self, graph: Any, db: ServiceDB, *, max_workers: int = 64,
                 on_finish: Callable[[RunHandle, float], None] | None = None):
        self.graph = graph
        self.db = db
        self.handles: dict[str, RunHandle] = {}
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="run")
        self.on_finish = on_finish
        self._lock = threading.Lock()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def graph_config(thread_id: str, run: dict[str, Any], tenant: str, configurable: dict) -> dict:
        cfg = {**configurable, "thread_id": thread_id, "tenant": tenant, "run_id": run["run_id"],
               "assistant_id": run["assistant_id"]}
        return {"configurable": cfg, "metadata": {"run_id": run["run_id"], "tenant": tenant},
                "recursion_limit": int(run["kwargs"].get("recursion_limit") or 100)}

    def start(self, run: dict[str, Any], tenant: str, graph_input: Any, config: dict,
              modes: list[str]) -> RunHandle:
        handle = RunHandle(run, tenant, modes)
        handle.publish("metadata", {"run_id": run["run_id"], "thread_id": run["thread_id"],
                                    "attempt": run.get("attempts", 1)})
        with self._lock:
            self.handles[run["run_id"]] = handle
        self.pool.submit(self._execute, handle, graph_input, config)
        return handle

    def get(self, run_id: str) -> RunHandle | None:
        return self.handles.get(run_id)

    def _execute(self, handle: RunHandle, graph_input: Any, config: dict) -> None:
        t0 = time.perf_counter()
        self.db.set_run_running(handle.run_id)
        handle.status = "running"
        lg_modes = sorted({"values", *("messages" if m == "messages-tuple" else m for m in handle.modes)})
        try:
            for mode, chunk in self.graph.stream(graph_input, config, stream_mode=lg_modes, durability="sync"):
                if handle.cancel_requested:
                    raise _Cancelled()
                if mode in handle.modes or (mode == "messages" and "messages-tuple" in handle.modes):
                    handle.publish(mode, to_jsonable(chunk))
            state = self.graph.get_state(config)
            interrupted = bool(state.interrupts)
            run_status = "interrupted" if interrupted else "success"
            self.db.finish_run(handle.run_id, handle.thread_id, run_status,
                               "interrupted" if interrupted else "idle")
        except _Cancelled:
            run_status = "interrupted"
            self.db.finish_run(handle.run_id, handle.thread_id, run_status, "idle", "cancelled")
        except Exception as e:  # a run's failure is reported to its client, never kills the service
            log.error("run %s failed: %s", handle.run_id, traceback.format_exc())
            run_status = "error"
            handle.publish("error", {"error": type(e).__name__, "message": str(e)})
            self.db.finish_run(handle.run_id, handle.thread_id, "error", "error", f"{type(e).__name__}: {e}")
        handle.finish(run_status)
        if self.on_finish:
            self.on_finish(handle, time.perf_counter() - t0)
        with self._lock:  # keep finished handles briefly for late joiners; the DB has the rest
            done = [k for k, h in self.handles.items() if h.finished.is_set()]
            for k in done[:-256]:
                del self.handles[k]

    def thread_output(self, config: dict) -> dict[str, Any]:
        """What `wait`/`join` return: the thread's values, plus `__interrupt__` while paused."""
        state = self.graph.get_state(config)
        values = to_jsonable(state.values) or {}
        if state.interrupts:
            values["__interrupt__"] = to_jsonable(list(state.interrupts))
        return values

    def resume_unfinished(self, configurable_for: Callable[[dict[str, Any]], dict]) -> int:
        """Continue runs a killed server left behind, from their threads' last checkpoints."""
        n = 0
        for run in self.db.unfinished_runs():
            self.db.bump_attempts(run["run_id"])
            run["attempts"] += 1
            config = self.graph_config(run["thread_id"], run, run["tenant"], configurable_for(run))
            started = self._run_checkpointed(config, run["run_id"])
            graph_input = None if started else run_input(run["kwargs"])
            log.warning("resuming run %s of thread %s (%s)", run["run_id"], run["thread_id"],
                        "from its last checkpoint" if started else "from its input")
            self.start(run, run["tenant"], graph_input, config, run["kwargs"].get("stream_mode") or ["values"])
            n += 1
        return n

    def _run_checkpointed(self, config: dict, run_id: str) -> bool:
        """Did this run already write a checkpoint (then continue from it, not from its input)?"""
        for snap in self.graph.get_state_history(config, limit=50):
            if (snap.metadata or {}).get("run_id") == run_id:
                return True
        return False


class _Cancelled(Exception):
    pass


def run_input(kwargs: dict[str, Any]) -> Any:
    """The graph input of a run request: its `command` as a LangGraph `Command`, else its input."""
    cmd = kwargs.get("command")
    if cmd:
        return Command(resume=cmd.get("resume"), update=cmd.get("update"), goto=cmd.get("goto") or ())
    return kwargs.get("input") or {"messages": []}  # no message: the task's own user speaks
