"""Evolve's own routes: feedback on trajectories, memory, policy versions.

Feedback and memory reads are scoped to the caller's tenant. Memory rollback, retraction and
forgetting, and promoting or rolling back a policy version, need an admin token.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request

from dynamic_bench.schema import Feedback
from runtime.api_langgraph import principal, rt_of
from runtime.api_models import (FeedbackIn, MemoryForget, MemoryRetract, MemoryRollback, MemorySearch,
                                PolicyPromote, PolicyRollback)
from runtime.auth import Principal
from runtime.policy_registry import UnknownPolicyVersion

router = APIRouter()
Auth = Depends(principal)


def admin(p: Principal = Auth) -> Principal:
    if not p.admin:
        raise HTTPException(403, "this route needs an admin token")
    return p


Admin = Depends(admin)


def _memory(request: Request):
    return rt_of(request).memory


def _not_found_or_bad(e: Exception) -> HTTPException:
    from memory.models import InvalidInput, NotFound

    if isinstance(e, NotFound):
        return HTTPException(404, str(e))
    if isinstance(e, InvalidInput):
        return HTTPException(422, str(e))
    raise e


# -- trajectories and feedback ----------------------------------------------------------------
@router.get("/trajectories/{trajectory_id}", tags=["feedback"])
def trajectory_get(trajectory_id: str, request: Request, p: Principal = Auth) -> dict[str, Any]:
    try:
        return _memory(request).get_trajectory(trajectory_id, p.tenant).model_dump(mode="json")
    except Exception as e:
        raise _not_found_or_bad(e) from None


@router.post("/trajectories/{trajectory_id}/feedback", tags=["feedback"], status_code=201)
def feedback_add(trajectory_id: str, body: FeedbackIn, request: Request, p: Principal = Auth) -> dict[str, Any]:
    mem = _memory(request)
    try:
        traj = mem.get_trajectory(trajectory_id, p.tenant)
    except Exception as e:
        raise _not_found_or_bad(e) from None
    if body.step is not None and body.step >= len(traj.steps):
        raise HTTPException(422, f"step {body.step} out of range: the trajectory has {len(traj.steps)} steps")
    fb = Feedback(trajectory_id=trajectory_id, step=body.step, kind=body.kind, payload=body.payload, source="user")
    try:
        mem.add_feedback(fb, tenant=p.tenant)
    except Exception as e:
        raise _not_found_or_bad(e) from None
    return {"ok": True, "feedback": fb.model_dump(mode="json")}


# -- memory -----------------------------------------------------------------------------------
@router.post("/memory/search", tags=["memory"])
def memory_search(body: MemorySearch, request: Request, p: Principal = Auth) -> list[dict[str, Any]]:
    try:
        hits = _memory(request).search(p.tenant, body.query, k=body.k, kinds=body.kinds)
    except Exception as e:
        raise _not_found_or_bad(e) from None
    return [{"id": h.item.id, "text": h.item.text, "kind": h.item.kind, "status": h.item.status,
             "score": h.score, "scores": h.scores,
             "provenance": [pr.model_dump(mode="json") for pr in h.provenance]} for h in hits]


@router.get("/memory/items/{item_id}/explain", tags=["memory"])
def memory_explain(item_id: str, request: Request, p: Principal = Auth) -> dict[str, Any]:
    try:
        return _memory(request).explain(item_id, tenant=p.tenant).model_dump(mode="json")
    except Exception as e:
        raise _not_found_or_bad(e) from None


@router.post("/memory/rollback", tags=["memory"])
def memory_rollback(body: MemoryRollback, request: Request, p: Principal = Admin) -> dict[str, Any]:
    try:
        return _memory(request).rollback(body.version, at=body.at, tenant=body.tenant, reason=body.reason)
    except Exception as e:
        raise _not_found_or_bad(e) from None


@router.post("/memory/retract", tags=["memory"])
def memory_retract(body: MemoryRetract, request: Request, p: Principal = Admin) -> dict[str, Any]:
    mem = _memory(request)
    try:
        if body.trajectory_id is not None:
            ids = mem.retract_trajectory(body.trajectory_id, reason=body.reason)
        else:
            ids = mem.retract_cycle(body.cycle, reason=body.reason)
    except Exception as e:
        raise _not_found_or_bad(e) from None
    return {"retracted": ids}


@router.post("/memory/forget", tags=["memory"])
def memory_forget(body: MemoryForget, request: Request, p: Principal = Admin) -> dict[str, Any]:
    """Forget a tenant everywhere: memory, trajectories, and the service's threads and checkpoints."""
    rt = rt_of(request)
    try:
        counts = rt.memory.forget_tenant(body.tenant)
    except Exception as e:
        raise _not_found_or_bad(e) from None
    threads = rt.db.delete_tenant(body.tenant)
    for tid in threads:
        rt.checkpointer.delete_thread(tid)
    return {"memory": counts, "threads_deleted": len(threads)}


# -- policy versions --------------------------------------------------------------------------
@router.get("/policies", tags=["policies"])
def policies_list(request: Request, p: Principal = Auth) -> dict[str, Any]:
    rt = rt_of(request)
    return {**rt.registry.describe(), "serving": rt.runner.policy_version, "swap_error": rt.runner.swap_error}


@router.post("/policies/{version}/promote", tags=["policies"])
def policies_promote(version: str, request: Request, body: PolicyPromote | None = None,
                     p: Principal = Admin) -> dict[str, Any]:
    rt = rt_of(request)
    try:
        rec = rt.registry.promote(version, reason=(body.reason if body else "") or f"promoted by {p.tenant}")
    except UnknownPolicyVersion:
        raise HTTPException(404, f"unknown policy version {version!r}") from None
    rt.runner.refresh()
    return {"promoted": rec.version, "serving": rt.runner.policy_version, "swap_error": rt.runner.swap_error}


@router.post("/policies/rollback", tags=["policies"])
def policies_rollback(request: Request, body: PolicyRollback | None = None, p: Principal = Admin) -> dict[str, Any]:
    rt = rt_of(request)
    body = body or PolicyRollback()
    try:
        rec = rt.registry.roll_back(to=body.to, reason=body.reason or f"rolled back by {p.tenant}")
    except ValueError as e:
        raise HTTPException(409, str(e)) from None
    rt.runner.refresh()
    return {"serving": rt.runner.policy_version, "current": rec.version if rec else "base",
            "swap_error": rt.runner.swap_error}
