"""The write path: build items, then decide per item whether it is new, a duplicate to merge
(exact: same tenant, kind and normalised text; near: cosine >= `dedup_threshold` with the same
ids and numbers), or a contradiction that supersedes a live item with the same
`payload["subject"]`. Contradiction needs that structured key: guessing it from free text
would silently close the validity of true memories.

An exact repeat of a *retired* item (consolidation: the policy learned it) is merged into it and
it stays retired: the repeat is evidence on the item, and the next cycle trains on the episode it
came from. Why: users keep saying a rule after the policy has learned it, and re-adding every
such note as a new live item undid consolidation (in the demo, retired rule notes came back
within a few episodes of the cycle)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa

from memory.ledger import IT, Change
from memory.models import KINDS, STATUSES, InvalidInput, MemoryItem, Provenance
from memory.text import content_hash, extract_entities, signature

if TYPE_CHECKING:
    from memory.service import MemoryService


def new_item(tenant: str, text: str, kind: str = "task_experience",
              payload: dict[str, Any] | None = None, trajectory_id: str | None = None,
              step: int | None = None, evidence: str = "", source: str = "agent",
              cycle: str | None = None, provenance: list[Provenance] | None = None,
              status: str = "candidate", entities: list[str] | None = None,
              relations: list[tuple[str, str, str]] | None = None, tier: str = "long_term",
              valid_from: float | None = None, namespace: list[str] | None = None,
              key: str | None = None, id: str | None = None) -> MemoryItem:
    if not isinstance(tenant, str) or not tenant.strip():
        raise InvalidInput("tenant must be a non-empty string")
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")
    if kind not in KINDS:
        raise InvalidInput(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if status not in STATUSES:
        raise InvalidInput(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
    prov = list(provenance or [])
    if not prov:
        prov = [Provenance(trajectory_id=trajectory_id, step=step, evidence=evidence or text,
                           source=source, cycle=cycle)]
    now = time.time()
    payload = dict(payload or {})
    rels = [tuple(map(str, r)) for r in (relations or [])]
    if any(len(r) != 3 for r in rels):
        raise InvalidInput("relations must be (subject, relation, object) triples")
    ents = list(entities) if entities else extract_entities(text, payload)
    ents += [e for r in rels for e in (r[0], r[2]) if e not in ents]
    kw: dict[str, Any] = {"id": id} if id else {}
    return MemoryItem(tenant=tenant, text=text.strip(), kind=kind, payload=payload,
                      provenance=prov, status=status, tier=tier, entities=ents,
                      relations=rels, created_by_cycle=cycle, valid_from=valid_from or now,
                      created_at=now, updated_at=now, version=1,
                      namespace=list(namespace or []), key=key, **kw)

def plan_adds(svc: "MemoryService", items: list[MemoryItem], dedup: bool) -> tuple[list[Change], list[MemoryItem]]:
    """Decide per item: new, merge into an exact/near duplicate, or supersede a contradiction."""
    changes: list[Change] = []
    out: list[MemoryItem] = []
    if not items:
        return changes, out
    hashes = [content_hash(it.tenant, it.kind, it.text) for it in items]
    existing: dict[str, MemoryItem] = {}
    if dedup:
        with svc.ledger.engine.connect() as c:
            q = sa.select(IT.c.content_hash, IT.c.doc, IT.c.status).where(
                IT.c.content_hash.in_(list(set(hashes))),
                IT.c.status.in_(("candidate", "validated", "retired")))
            for h, doc, status in sorted(c.execute(q), key=lambda r: r[2] == "retired"):  # live first
                existing.setdefault(h, MemoryItem.model_validate_json(doc))
    # exact duplicates (already stored, or earlier in this batch) need no embedding at all
    seen = set(existing) if dedup else set()
    todo = []
    for i, h in enumerate(hashes):
        if h not in seen or not dedup:
            seen.add(h)
            todo.append(i)
    vecs = np.zeros((len(items), 384), dtype=np.float32)
    if todo:
        vecs[todo] = svc.embedder.embed([items[i].text for i in todo])
    near: list[MemoryItem | None] = [None] * len(items)
    if dedup and todo:
        for i, m in zip(todo, near_duplicates(svc, [items[i] for i in todo], vecs[todo])):
            near[i] = m
    pending: dict[str, MemoryItem] = {}  # items written (or merged into) by this batch
    group: dict[tuple[str, str], tuple[list[MemoryItem], list[np.ndarray]]] = {}  # (tenant, kind)
    for it, h, v, nd in zip(items, hashes, vecs, near):
        target = None
        if dedup:
            target = existing.get(h)
            if target is None and nd is not None:
                target = nd
            if target is None:  # a near-duplicate inside this same batch
                its, vs = group.get((it.tenant, it.kind), ([], []))
                if its:
                    sims = np.asarray(vs) @ v
                    for j in np.flatnonzero(sims >= svc.cfg.dedup_threshold):
                        if signature(its[j].text) == signature(it.text):
                            target = its[j]
                            break
        if target is not None:
            target = pending.get(target.id, target)
            merged = target.model_copy(deep=True)
            known = {(p.trajectory_id, p.step, p.evidence) for p in merged.provenance}
            merged.provenance += [p for p in it.provenance
                                  if (p.trajectory_id, p.step, p.evidence) not in known]
            merged.version += 1
            merged.updated_at = time.time()
            pending[merged.id] = merged
            changes.append(Change("merged", it.tenant, merged,
                                  {"duplicate_text": it.text, "exact": existing.get(h) is not None,
                                   "retired": merged.status == "retired"},
                                  it.provenance[0].trajectory_id, it.created_by_cycle))
            out.append(merged)
            continue
        subject = it.payload.get("subject")
        if subject is not None:
            for old in svc.ledger.find_live(it.tenant, subject=str(subject)):
                old = pending.get(old.id, old)
                if old.status not in ("candidate", "validated"):
                    continue
                changes.append(superseded(old, it))
                pending[old.id] = changes[-1].item  # type: ignore[assignment]
        for p in pending.values():
            if (subject is not None and p.id != it.id and p.tenant == it.tenant
                    and p.payload.get("subject") == subject and p.status in ("candidate", "validated")
                    and p.id not in it.supersedes):
                changes.append(superseded(p, it))
                pending[p.id] = changes[-1].item  # type: ignore[assignment]
        pending[it.id] = it
        existing.setdefault(h, it)
        its, vs = group.setdefault((it.tenant, it.kind), ([], []))
        its.append(it)
        vs.append(v)
        changes.append(Change("added", it.tenant, it, {"subject": subject},
                              it.provenance[0].trajectory_id, it.created_by_cycle))
        out.append(it)
    # the final snapshot of each item must be the last change that mentions it
    return changes, [pending.get(o.id, o) for o in out]


def superseded(old: MemoryItem, new: MemoryItem) -> Change:
    o = old.model_copy(deep=True)
    o.status, o.valid_to, o.superseded_by = "superseded", new.valid_from, new.id
    o.status_reason = f"superseded by {new.id}"
    o.version += 1
    o.updated_at = time.time()
    new.supersedes.append(o.id)
    return Change("superseded", o.tenant, o, {"by": new.id}, None, None)

def near_duplicates(svc: "MemoryService", items: list[MemoryItem], vecs: np.ndarray) -> list[MemoryItem | None]:
    out: list[MemoryItem | None] = [None] * len(items)
    by_tenant: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_tenant.setdefault(it.tenant, []).append(i)
    cand: dict[int, list[tuple[str, float]]] = {}
    for tenant, idx in by_tenant.items():
        for i, near in zip(idx, svc.vec.query(tenant, vecs[idx], 3)):
            cand[i] = [(x, s) for x, s in near if s >= svc.cfg.dedup_threshold]
    need = {x for c in cand.values() for x, _ in c}
    found = svc.ledger.get_many(need) if need else {}
    for i, c in cand.items():
        for x, _ in c:
            m = found.get(x)
            if (m and m.kind == items[i].kind and m.status in ("candidate", "validated")
                    and signature(m.text) == signature(items[i].text)):
                out[i] = m
                break
    return out
