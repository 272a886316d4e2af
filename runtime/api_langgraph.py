"""The LangGraph server API subset `langgraph-sdk` needs: assistants, threads, runs, SSE.

Routes and payloads follow what the installed `langgraph_sdk` client sends (assistants.search/get,
threads.create/get/update/delete/search/get_state/get_history, runs.create/wait/stream/join/
join_stream/get/list/cancel, resuming with `command={"resume": ...}`). Every thread and run is
owned by the caller's tenant; another tenant's id answers 404 exactly like an unknown id.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from runtime.api_models import (AssistantSearch, HistoryRequest, RunCreate, ThreadCreate, ThreadPatch,
                                ThreadSearch)
from runtime.auth import Principal
from runtime.runs import RunManager, run_input, to_jsonable
from runtime.world import WORLD_KEYS, WorldConfigError, WorldSpec

router = APIRouter()
_NS = uuid.UUID("6f1d3a2e-5c1b-4e0a-9b7d-2a4c8e6f0b13")
_STARTED = datetime.now(timezone.utc).isoformat()
SCAFFOLDS = ("direct", "plan_act")
RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]


def rt_of(request: Request):
    return request.app.state.rt


def principal(request: Request) -> Principal:
    """The caller (authenticated by the service middleware before the body is parsed)."""
    p = getattr(request.state, "principal", None) or rt_of(request).auth.authenticate(request.headers)
    if p is None:
        raise HTTPException(401, "missing or invalid API token: send 'Authorization: Bearer <token>' or "
                                 "'x-api-key: <token>'", headers={"WWW-Authenticate": "Bearer"})
    return p


Auth = Depends(principal)


# -- assistants -------------------------------------------------------------------------------
def make_assistants(specs: tuple[dict, ...]) -> dict[str, dict[str, Any]]:
    out = {}
    for s in specs:
        if s["scaffold"] not in SCAFFOLDS:
            raise ValueError(f"assistant {s['name']!r}: unknown scaffold {s['scaffold']!r}")
        aid = str(uuid.uuid5(_NS, s["name"]))
        out[aid] = {"assistant_id": aid, "graph_id": "agent", "name": s["name"],
                    "description": s.get("description"),
                    "config": {"configurable": {"scaffold": s["scaffold"], "approval": s.get("approval", "writes")}},
                    "context": {}, "metadata": {"created_by": "system"}, "version": 1,
                    "created_at": _STARTED, "updated_at": _STARTED}
    return out


def find_assistant(rt, assistant_id: str) -> dict[str, Any]:
    if assistant_id in rt.assistants:
        return rt.assistants[assistant_id]
    for a in rt.assistants.values():  # a graph name or assistant name works as an id too
        if a["name"] == assistant_id:
            return a
    if assistant_id == "agent":
        return next(iter(rt.assistants.values()))
    raise HTTPException(404, f"unknown assistant {assistant_id!r}")


@router.post("/assistants/search", tags=["assistants"])
def assistants_search(body: AssistantSearch, request: Request, p: Principal = Auth) -> list[dict[str, Any]]:
    out = list(rt_of(request).assistants.values())
    if body.graph_id:
        out = [a for a in out if a["graph_id"] == body.graph_id]
    if body.name:
        out = [a for a in out if body.name.lower() in a["name"].lower()]
    if body.metadata:
        out = [a for a in out if all(a["metadata"].get(k) == v for k, v in body.metadata.items())]
    return out[body.offset:body.offset + body.limit]


@router.get("/assistants/{assistant_id}", tags=["assistants"])
def assistants_get(assistant_id: str, request: Request, p: Principal = Auth) -> dict[str, Any]:
    return find_assistant(rt_of(request), assistant_id)


# -- threads ----------------------------------------------------------------------------------
def _config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    c = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


def _checkpoint(cfg: dict | None) -> dict[str, Any] | None:
    if not cfg:
        return None
    c = cfg.get("configurable", {})
    return {"thread_id": c.get("thread_id"), "checkpoint_ns": c.get("checkpoint_ns", ""),
            "checkpoint_id": c.get("checkpoint_id"), "checkpoint_map": None}


def state_view(snap) -> dict[str, Any]:
    """A LangGraph `StateSnapshot` as the API's ThreadState."""
    tasks = [{"id": t.id, "name": t.name, "error": str(t.error) if t.error else None,
              "interrupts": to_jsonable(list(t.interrupts)), "checkpoint": None, "state": None,
              "result": to_jsonable(getattr(t, "result", None))} for t in snap.tasks]
    return {"values": to_jsonable(snap.values) or {}, "next": list(snap.next), "tasks": tasks,
            "checkpoint": _checkpoint(snap.config), "metadata": to_jsonable(snap.metadata) or {},
            "created_at": snap.created_at, "parent_checkpoint": _checkpoint(snap.parent_config),
            "interrupts": to_jsonable(list(snap.interrupts))}


def _thread(rt, p: Principal, thread_id: str) -> dict[str, Any]:
    t = rt.db.get_thread(p.tenant, thread_id)
    if t is None:
        raise HTTPException(404, f"unknown thread {thread_id!r}")
    return t


def thread_view(rt, t: dict[str, Any]) -> dict[str, Any]:
    snap = rt.graph.get_state(_config(t["thread_id"]))
    interrupts: dict[str, list] = {}
    for task in snap.tasks:
        if task.interrupts:
            interrupts[task.id] = to_jsonable(list(task.interrupts))
    return {**t, "values": to_jsonable(snap.values) or {}, "interrupts": interrupts, "config": {}}


def _check_world(md: dict[str, Any]) -> None:
    try:
        WorldSpec.from_config({k: md[k] for k in WORLD_KEYS if k in md})
    except WorldConfigError as e:
        raise HTTPException(422, f"invalid world settings in metadata: {e}") from None


@router.post("/threads", tags=["threads"])
def threads_create(body: ThreadCreate, request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    _check_world(body.metadata)
    tid = body.thread_id or str(uuid.uuid4())
    t = rt.db.create_thread(p.tenant, tid, body.metadata)
    if t is None:
        existing = rt.db.get_thread(p.tenant, tid)
        if body.if_exists == "do_nothing" and existing is not None:
            return thread_view(rt, existing)
        raise HTTPException(409, f"thread {tid!r} already exists")
    return thread_view(rt, t)


@router.post("/threads/search", tags=["threads"])
def threads_search(body: ThreadSearch, request: Request, p: Principal = Auth) -> list[dict[str, Any]]:
    rt = rt_of(request)
    return [thread_view(rt, t) for t in rt.db.search_threads(p.tenant, body.metadata, body.status,
                                                             body.limit, body.offset)]


@router.get("/threads/{thread_id}", tags=["threads"])
def threads_get(thread_id: str, request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    return thread_view(rt, _thread(rt, p, thread_id))


@router.patch("/threads/{thread_id}", tags=["threads"])
def threads_patch(thread_id: str, body: ThreadPatch, request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    t = _thread(rt, p, thread_id)
    _check_world({**t["metadata"], **body.metadata})
    return thread_view(rt, rt.db.update_thread(p.tenant, thread_id, metadata=body.metadata))


@router.delete("/threads/{thread_id}", tags=["threads"], status_code=204)
def threads_delete(thread_id: str, request: Request, p: Principal = Auth) -> Response:
    rt = rt_of(request)
    t = _thread(rt, p, thread_id)
    if t["status"] == "busy":
        raise HTTPException(409, "thread has a run in progress; cancel it first")
    rt.db.delete_thread(p.tenant, thread_id)
    rt.checkpointer.delete_thread(thread_id)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/state", tags=["threads"])
def threads_state(thread_id: str, request: Request, subgraphs: bool = False,
                  p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    _thread(rt, p, thread_id)
    return state_view(rt.graph.get_state(_config(thread_id)))


@router.get("/threads/{thread_id}/state/{checkpoint_id}", tags=["threads"])
def threads_state_at(thread_id: str, checkpoint_id: str, request: Request, subgraphs: bool = False,
                     p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    _thread(rt, p, thread_id)
    snap = rt.graph.get_state(_config(thread_id, checkpoint_id))
    if snap.created_at is None:
        raise HTTPException(404, f"unknown checkpoint {checkpoint_id!r} of thread {thread_id!r}")
    return state_view(snap)


@router.post("/threads/{thread_id}/history", tags=["threads"])
def threads_history(thread_id: str, body: HistoryRequest, request: Request,
                    p: Principal = Auth) -> list[dict[str, Any]]:
    rt = rt_of(request)
    _thread(rt, p, thread_id)
    before = body.before
    if isinstance(before, str):
        before = _config(thread_id, before)
    elif isinstance(before, dict):
        before = {"configurable": {**before.get("configurable", before), "thread_id": thread_id}}
    snaps = rt.graph.get_state_history(_config(thread_id), limit=body.limit, before=before,
                                       filter=body.metadata)
    return [state_view(s) for s in snaps]


# -- runs -------------------------------------------------------------------------------------
def configurable_for(rt, run: dict[str, Any], thread_metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Assistant config < thread metadata (world keys) < the run's own configurable."""
    a = find_assistant(rt, run["assistant_id"])
    if thread_metadata is None:
        thread_metadata = (rt.db.get_thread(run.get("tenant") or "", run["thread_id"]) or {"metadata": {}})["metadata"]
    md = {k: thread_metadata[k] for k in WORLD_KEYS if k in thread_metadata}
    return {**a["config"]["configurable"], **md, **(run["kwargs"].get("configurable") or {})}


def _validate_configurable(c: dict[str, Any]) -> None:
    try:
        WorldSpec.from_config(c)
    except WorldConfigError as e:
        raise HTTPException(422, f"invalid world settings: {e}") from None
    if c.get("approval", "writes") not in ("writes", "all"):
        raise HTTPException(422, f"config.configurable.approval must be 'writes' or 'all', got {c.get('approval')!r}")
    if c.get("scaffold") not in SCAFFOLDS:
        raise HTTPException(422, f"unknown scaffold {c.get('scaffold')!r}; scaffolds: {list(SCAFFOLDS)}")
    for k in ("seed", "max_turns"):
        v = c.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 10**9):
            raise HTTPException(422, f"config.configurable.{k} must be a non-negative integer")
    t = c.get("temperature")
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t <= 5):
        raise HTTPException(422, "config.configurable.temperature must be a number in [0, 5]")


def _create_run(rt, p: Principal, thread_id: str | None, body: RunCreate, stream: bool = True):
    """Validate everything first, then write: a rejected request leaves no trace."""
    a = find_assistant(rt, body.assistant_id)
    new_thread = thread_id is None  # a stateless run gets a thread of its own
    if new_thread:
        thread_id, metadata = str(uuid.uuid4()), {"stateless": True}
    else:
        t = rt.db.get_thread(p.tenant, thread_id)
        if t is None:
            if body.if_not_exists != "create" or rt.db.thread_owner(thread_id) is not None:
                raise HTTPException(404, f"unknown thread {thread_id!r}")
            try:
                thread_id = str(uuid.UUID(thread_id))
            except ValueError:
                raise HTTPException(422, "thread_id must be a UUID") from None
            new_thread, metadata = True, {}
        else:
            metadata = t["metadata"]
    kwargs = {"input": body.graph_input(), "command": body.command.model_dump() if body.command else None,
              "configurable": dict(body.config.configurable) if body.config else {},
              "recursion_limit": body.config.recursion_limit if body.config else None,
              "stream_mode": body.modes(), "on_disconnect": body.on_disconnect}
    probe = {"assistant_id": a["assistant_id"], "thread_id": thread_id, "kwargs": kwargs}
    configurable = configurable_for(rt, probe, metadata)
    _validate_configurable(configurable)
    snap = None if new_thread else rt.graph.get_state(_config(thread_id))
    waiting = bool(snap and snap.interrupts)
    if body.command is not None and not waiting:
        raise HTTPException(409, "nothing to resume: the thread is not waiting on an interrupt")
    if body.command is None and waiting:
        raise HTTPException(409, "the thread is waiting for approval: resume it with command={'resume': ...}")
    if new_thread and rt.db.create_thread(p.tenant, thread_id, metadata) is None:
        raise HTTPException(409, f"thread {thread_id!r} already exists")
    run_id = str(uuid.uuid4())
    run = rt.db.create_run(p.tenant, run_id, thread_id, a["assistant_id"], body.metadata, kwargs,
                           body.multitask_strategy)
    if run is None:
        raise HTTPException(409, f"thread {thread_id!r} already has a run in progress")
    config = RunManager.graph_config(thread_id, run, p.tenant, configurable)
    handle = rt.runs.start(run, p.tenant, run_input(kwargs), config, body.modes() if stream else [])
    return run, handle, config


def run_view(run: dict[str, Any]) -> dict[str, Any]:
    return {k: run[k] for k in ("run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status",
                                "metadata", "multitask_strategy")} | {"kwargs": {}}


def _location(run: dict[str, Any]) -> dict[str, str]:
    return {"Content-Location": f"/threads/{run['thread_id']}/runs/{run['run_id']}"}


async def _wait_output(rt, handle, config) -> dict[str, Any]:
    status = await handle.wait()
    out = await run_in_threadpool(rt.runs.thread_output, config)
    if status == "error":
        err = next((d for _, e, d in reversed(handle.events) if e == "error"), {})
        out["__error__"] = err
    return out


def _sse(handle, modes: list[str] | None, after: int = -1, on_disconnect: str = "continue"):
    async def gen():
        try:
            async for seq, event, data in handle.follow(after):
                if modes and event not in ("metadata", "end", "error") and event not in modes:
                    continue
                yield f"event: {event}\ndata: {json.dumps(data, default=str)}\nid: {seq}\n\n"
        finally:
            if on_disconnect == "cancel" and not handle.finished.is_set():
                handle.cancel_requested = True
    return gen()


def _stream_response(handle, run, modes, on_disconnect) -> StreamingResponse:
    return StreamingResponse(_sse(handle, modes, on_disconnect=on_disconnect), media_type="text/event-stream",
                             headers={**_location(run), "Cache-Control": "no-store"})


@router.post("/threads/{thread_id}/runs", tags=["runs"])
def runs_create(thread_id: str, body: RunCreate, request: Request, response: Response,
                p: Principal = Auth) -> dict[str, Any]:
    run, _, _ = _create_run(rt_of(request), p, thread_id, body)
    response.headers.update(_location(run))
    return run_view(run)


@router.post("/runs", tags=["runs"])
def runs_create_stateless(body: RunCreate, request: Request, response: Response,
                          p: Principal = Auth) -> dict[str, Any]:
    run, _, _ = _create_run(rt_of(request), p, None, body)
    response.headers.update(_location(run))
    return run_view(run)


@router.post("/threads/{thread_id}/runs/wait", tags=["runs"])
async def runs_wait(thread_id: str, body: RunCreate, request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    run, handle, config = await run_in_threadpool(_create_run, rt, p, thread_id, body, False)
    return await _wait_output(rt, handle, config)


@router.post("/runs/wait", tags=["runs"])
async def runs_wait_stateless(body: RunCreate, request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    run, handle, config = await run_in_threadpool(_create_run, rt, p, None, body, False)
    return await _wait_output(rt, handle, config)


@router.post("/threads/{thread_id}/runs/stream", tags=["runs"], response_class=StreamingResponse)
async def runs_stream(thread_id: str, body: RunCreate, request: Request, p: Principal = Auth):
    run, handle, _ = await run_in_threadpool(_create_run, rt_of(request), p, thread_id, body)
    return _stream_response(handle, run, body.modes(), body.on_disconnect)


@router.post("/runs/stream", tags=["runs"], response_class=StreamingResponse)
async def runs_stream_stateless(body: RunCreate, request: Request, p: Principal = Auth):
    run, handle, _ = await run_in_threadpool(_create_run, rt_of(request), p, None, body)
    return _stream_response(handle, run, body.modes(), body.on_disconnect)


def _run(rt, p: Principal, thread_id: str, run_id: str) -> dict[str, Any]:
    run = rt.db.get_run(p.tenant, thread_id, run_id)
    if run is None:
        raise HTTPException(404, f"unknown run {run_id!r} of thread {thread_id!r}")
    return run


@router.get("/threads/{thread_id}/runs", tags=["runs"])
def runs_list(thread_id: str, request: Request, limit: int = Query(10, ge=1, le=1000),
              offset: int = Query(0, ge=0, le=1_000_000), status: RunStatus | None = None,
              p: Principal = Auth) -> list[dict[str, Any]]:
    rt = rt_of(request)
    _thread(rt, p, thread_id)
    return [run_view(r) for r in rt.db.list_runs(p.tenant, thread_id, limit, offset, status)]


@router.get("/threads/{thread_id}/runs/{run_id}", tags=["runs"])
def runs_get(thread_id: str, run_id: str, request: Request, p: Principal = Auth) -> dict[str, Any]:
    return run_view(_run(rt_of(request), p, thread_id, run_id))


@router.get("/threads/{thread_id}/runs/{run_id}/join", tags=["runs"])
async def runs_join(thread_id: str, run_id: str, request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    await run_in_threadpool(_run, rt, p, thread_id, run_id)
    handle = rt.runs.get(run_id)
    config = _config(thread_id)
    if handle is not None:
        return await _wait_output(rt, handle, config)
    return await run_in_threadpool(rt.runs.thread_output, config)


@router.get("/threads/{thread_id}/runs/{run_id}/stream", tags=["runs"], response_class=StreamingResponse)
async def runs_join_stream(thread_id: str, run_id: str, request: Request,
                           stream_mode: list[str] | None = Query(None), cancel_on_disconnect: bool = False,
                           p: Principal = Auth):
    rt = rt_of(request)
    run = await run_in_threadpool(_run, rt, p, thread_id, run_id)
    handle = rt.runs.get(run_id)
    if handle is None:  # finished before this process started: only the end is left to tell
        async def ended():
            yield f"event: end\ndata: {json.dumps({'run_id': run_id, 'status': run['status']})}\n\n"
        return StreamingResponse(ended(), media_type="text/event-stream")
    last = request.headers.get("last-event-id")
    after = int(last) if last and last.isdigit() else -1
    return StreamingResponse(_sse(handle, stream_mode, after, "cancel" if cancel_on_disconnect else "continue"),
                             media_type="text/event-stream", headers=_location(run))


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", tags=["runs"], status_code=202)
def runs_cancel(thread_id: str, run_id: str, request: Request, wait: bool = False,
                p: Principal = Auth) -> Response:
    rt = rt_of(request)
    run = _run(rt, p, thread_id, run_id)
    handle = rt.runs.get(run_id)
    if run["status"] not in ("pending", "running") or handle is None:
        raise HTTPException(409, f"run {run_id!r} is {run['status']}; only pending or running runs can be cancelled")
    handle.cancel_requested = True
    if wait:
        handle.finished.wait(timeout=60)
    return Response(status_code=202)
