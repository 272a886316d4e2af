"""Rollback, retraction, forgetting, and the trajectory log's writes.

Each of these is itself a new set of ledger events, never an edit of history, with one deliberate
exception: **forgetting a tenant**. An append-only log that keeps a forgotten tenant's text is
not forgetting, so `forget_tenant` (1) appends a `tenant_forgotten` event (the fact and the
counts stay auditable), (2) deletes the tenant's derived rows (items, links, trajectories,
feedback) and the cached embeddings of texts no other tenant holds, and (3) *redacts* the
tenant's earlier events in place: their `data` and `snapshot` are replaced by a tombstone,
while `seq`, type, timestamps and opaque ids stay, so sequence numbers, cursors and other tenants'
history are untouched. Deleted pages are zeroed (SQLite `secure_delete`, then a WAL checkpoint;
Postgres `VACUUM`), so the text is gone from the files too. Consequence: a rollback to a version
before the forget cannot bring the tenant back: forgetting is irreversible by design.
"""
from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from pydantic_core import from_json

from dynamic_bench.schema import Feedback, Trajectory
from memory.ledger import EC, EV, FB, IT, LK, TR, Change, Ledger
from memory.models import HistoryEntry, InvalidInput, MemoryItem, NotFound

if TYPE_CHECKING:
    from memory.service import MemoryService

REDACTED = json.dumps({"redacted": "tenant forgotten"})
_GC_LOCK = threading.Lock()
_GC_HOLDERS = [0, False]  # bulk operations in progress, whether gc was enabled before the first


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic collector during a bulk change. It keeps ~10 containers per item alive
    until it commits; the collector would promote them all and then rescan the whole heap
    (0.4-0.7 s a full pass in a process holding the embedding model and 100k items) for garbage
    that reference counting frees anyway. Nested and concurrent uses restore the state once."""
    with _GC_LOCK:
        if _GC_HOLDERS[0] == 0:
            _GC_HOLDERS[1] = gc.isenabled()
            gc.disable()
        _GC_HOLDERS[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_HOLDERS[0] -= 1
            if _GC_HOLDERS[0] == 0 and _GC_HOLDERS[1]:
                gc.enable()


def entry(r: sa.Row) -> HistoryEntry:
    snap = json.loads(r.snapshot) if r.snapshot else None
    return HistoryEntry(seq=r.seq, ts=r.ts, type=r.type, tenant=r.tenant, item_id=r.item_id,
                        trajectory_id=r.trajectory_id, cycle=r.cycle, data=json.loads(r.data or "{}"),
                        status=snap.get("status") if snap else None)


def _same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal snapshots up to the counters every event bumps (both dicts are consumed)."""
    for d in (a, b):
        d.pop("version", None)
        d.pop("updated_at", None)
    return a == b


def rollback(svc: "MemoryService", version: int | None = None, *, at: float | None = None,
             tenant: str | None = None, reason: str = "") -> dict[str, Any]:
    """Return memory (all of it, or one tenant) to its state at ledger `version` (or time `at`).

    Items changed since then get their earlier snapshot back as a new `rolled_back` event; items
    created since then are retracted. Forgotten tenants stay forgotten.
    """
    if (version is None) == (at is None):
        raise InvalidInput("rollback needs exactly one of version= or at=")
    led = svc.ledger
    with svc._lock, paused_gc():
        top = led.max_seq()
        target = int(version) if version is not None else led.version_at_time(float(at))  # type: ignore[arg-type]
        if target < 0 or target > top:
            raise NotFound(f"unknown ledger version {target} (current version is {top})")
        changes = _rollback_changes(led, target, tenant, reason)
        n = len(changes)
        seqs = led.commit(changes)
        del changes  # freed before the collector resumes: it would only promote them
        svc.sync()
    return {"to_version": target, "items": n - 1, "version": seqs[-1]}


def _rollback_changes(led: Ledger, target: int, tenant: str | None, reason: str) -> list[Change]:
    """One `rolled_back` change per item whose state differs from its state at `target`."""
    q = sa.select(EV.c.item_id).distinct().where(EV.c.seq > target, EV.c.item_id.is_not(None))
    if tenant is not None:
        q = q.where(EV.c.tenant == tenant)
    with led.engine.connect() as c:
        ids = [r[0] for r in c.execute(q)]
    current = led.raw_docs(ids)  # forgotten tenants' items have no row: skipped
    before = led.snapshots_at(list(current), target)
    now = time.time()
    changes = []
    data = {"to_version": target, "reason": reason}  # shared: serialised, never mutated
    for iid, cur_doc in current.items():  # pydantic_core's parser: ~2x json's, 10k items
        cur, old_doc = from_json(cur_doc), before[iid]
        cur_version = cur["version"]
        if old_doc is None:
            if cur["status"] == "retracted":
                continue
            new = MemoryItem.model_validate_json(cur_doc)
            new.status, new.valid_to = "retracted", now
            new.status_reason = f"rolled back to version {target} (created after it)"
        else:
            if _same_state(from_json(old_doc), cur):
                continue
            new = MemoryItem.model_validate_json(old_doc)
            new.status_reason = f"rolled back to version {target}"
        new.version, new.updated_at = cur_version + 1, now
        changes.append(Change("rolled_back", new.tenant, new, data))
    changes.append(Change("rollback", tenant or "*", None,
                          {"to_version": target, "items": len(changes), "reason": reason}))
    return changes


def retract(svc: "MemoryService", *, trajectory_id: str | None = None, cycle: str | None = None,
            tenant: str | None = None, reason: str = "") -> list[str]:
    """Retract what a trajectory (or an evolve cycle) produced, cascading to graph edges.

    Provenance from the retracted source is removed from each derived item; an item left with
    no other support is retracted (its edges leave the graph with it); an item that other
    trajectories also support stays, with its remaining provenance.
    """
    led = svc.ledger
    with svc._lock, paused_gc():
        if trajectory_id is not None:
            with led.engine.connect() as c:
                row = led.trajectory_row(c, trajectory_id)
            ids = led.linked_items(trajectory_id=trajectory_id, tenant=tenant)
            if row is None and not ids:
                raise NotFound(f"unknown trajectory {trajectory_id!r}")
            if row is not None and tenant is not None and row.tenant != tenant:
                raise NotFound(f"unknown trajectory {trajectory_id!r} for tenant {tenant!r}")
        else:
            ids = led.linked_items(cycle=cycle)
            if not ids:
                with led.engine.connect() as c:
                    seen = c.execute(sa.select(EV.c.seq).where(EV.c.cycle == cycle).limit(1)).first()
                if seen is None:
                    raise NotFound(f"unknown cycle {cycle!r}")
        now = time.time()
        changes, gone = [], []
        for it in led.get_many(ids).values():
            new = it.model_copy(deep=True)
            if trajectory_id is not None:
                new.provenance = [p for p in new.provenance if p.trajectory_id != trajectory_id]
            else:
                new.provenance = [p for p in new.provenance if p.cycle != cycle]
            retracted = (not new.provenance or (cycle is not None and new.created_by_cycle == cycle)) \
                and new.status != "retracted"
            if retracted:
                new.status, new.valid_to = "retracted", now
                new.status_reason = reason or f"retracted with {trajectory_id or cycle}"
                gone.append(new.id)
            elif new.provenance == it.provenance:
                continue
            new.version, new.updated_at = it.version + 1, now
            changes.append(Change("retracted" if retracted else "provenance_removed",
                                  new.tenant, new, {"reason": reason}, trajectory_id, cycle))
        t_tenant = tenant or (changes[0].tenant if changes else "*")
        with led.tx() as c:
            if trajectory_id is not None:
                r = led.trajectory_row(c, trajectory_id)
                if r is not None:
                    t_tenant = r.tenant
                    c.execute(sa.update(TR).where(TR.c.id == trajectory_id).values(retracted=True))
            changes.append(Change("trajectory_retracted" if trajectory_id else "cycle_retracted",
                                  t_tenant, None, {"items": gone, "reason": reason}, trajectory_id, cycle))
            led.commit(changes, c)
        del changes  # freed before the collector resumes
        svc.sync()
    return gone


def forget_tenant(svc: "MemoryService", tenant: str) -> dict[str, int]:
    """Erase a tenant: no projection returns anything, no readable text remains in the ledger."""
    if not tenant:
        raise InvalidInput("tenant must be a non-empty string")
    led = svc.ledger
    with svc._lock:
        with led.tx() as c:
            hashes = {r[0] for r in c.execute(sa.select(IT.c.text_hash).where(IT.c.tenant == tenant))}
            shared = set()
            for h in hashes:
                if c.execute(sa.select(IT.c.id).where(IT.c.text_hash == h, IT.c.tenant != tenant)
                             .limit(1)).first():
                    shared.add(h)
            n_items = c.execute(sa.delete(IT).where(IT.c.tenant == tenant)).rowcount
            c.execute(sa.delete(LK).where(LK.c.tenant == tenant))
            n_traj = c.execute(sa.delete(TR).where(TR.c.tenant == tenant)).rowcount
            c.execute(sa.delete(FB).where(FB.c.tenant == tenant))
            drop = list(hashes - shared)
            for i in range(0, len(drop), 500):
                c.execute(sa.delete(EC).where(EC.c.text_hash.in_(drop[i:i + 500])))
            n_ev = c.execute(sa.update(EV).where(EV.c.tenant == tenant)
                             .values(data=REDACTED, snapshot=None)).rowcount
            led.commit([Change("tenant_forgotten", tenant, None,
                               {"items": n_items, "trajectories": n_traj, "events_redacted": n_ev})], c)
        svc.embedder._hot.clear()
        _scrub_files(led)
        svc.sync()
    return {"items": n_items, "trajectories": n_traj, "events_redacted": n_ev}


def _scrub_files(led: Any) -> None:
    """Make deleted rows unrecoverable from the database files, not just invisible to SQL."""
    if led.is_sqlite:
        with led.engine.connect() as c:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    elif led.url.startswith("postgresql"):
        with led.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            for t in ("memory_event", "memory_item", "memory_item_link", "trajectory_log",
                      "trajectory_feedback", "embedding_cache"):
                c.execute(sa.text(f"VACUUM {t}"))


def record_trajectory(svc: "MemoryService", traj: Trajectory) -> int:
    if not isinstance(traj, Trajectory):
        raise InvalidInput("record_trajectory expects a dynamic_bench.schema.Trajectory")
    led = svc.ledger
    doc = traj.model_dump_json(exclude={"feedback"})
    with svc._lock, led.tx() as c:
        row = led.trajectory_row(c, traj.id)
        if row is not None and row.tenant != traj.tenant:
            raise InvalidInput(f"trajectory {traj.id} belongs to another tenant")
        seq = led.commit([Change("trajectory_recorded", traj.tenant, None,
                                 {"steps": len(traj.steps), "outcome": traj.outcome}, traj.id)], c)[0]
        if row is None:
            c.execute(sa.insert(TR).values(id=traj.id, tenant=traj.tenant, seq=seq, doc=doc))
        else:
            c.execute(sa.update(TR).where(TR.c.id == traj.id).values(seq=seq, doc=doc))
        have = {d for (d,) in c.execute(sa.select(FB.c.doc).where(FB.c.trajectory_id == traj.id))}
        rows = [{"trajectory_id": traj.id, "tenant": traj.tenant, "seq": seq, "doc": d}
                for d in (f.model_dump_json() for f in traj.feedback) if d not in have]
        if rows:
            c.execute(sa.insert(FB), rows)
    return seq


def add_feedback(svc: "MemoryService", fb: Feedback, tenant: str | None = None) -> int:
    """Attach feedback to a recorded trajectory (its tenant is the trajectory's)."""
    if not isinstance(fb, Feedback):
        raise InvalidInput("add_feedback expects a dynamic_bench.schema.Feedback")
    led = svc.ledger
    with svc._lock, led.tx() as c:
        row = led.trajectory_row(c, fb.trajectory_id)
        if row is None:
            raise NotFound(f"unknown trajectory {fb.trajectory_id!r}: record it before its feedback")
        if tenant is not None and row.tenant != tenant:
            raise NotFound(f"unknown trajectory {fb.trajectory_id!r} for tenant {tenant!r}")
        seq = led.commit([Change("feedback_added", row.tenant, None,
                                 {"kind": fb.kind, "step": fb.step}, fb.trajectory_id)], c)[0]
        c.execute(sa.insert(FB).values(trajectory_id=fb.trajectory_id, tenant=row.tenant, seq=seq,
                                       doc=fb.model_dump_json()))
        c.execute(sa.update(TR).where(TR.c.id == fb.trajectory_id).values(seq=seq))
    return seq
