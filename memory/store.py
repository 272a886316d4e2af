"""`EvolveStore`: LangGraph's `BaseStore` over Evolve memory, so `compile(store=...)` just works.

Mapping (namespace[0] is the tenant, the hard partition):
- `put(ns, key, value)` writes a ledger event for a memory item whose payload is `value` exactly
  (so rollback, retraction, forget and the projections cover store data too). The text that is
  embedded comes from the index fields (default `["text"]` when the value has one, else the
  whole value as JSON, like LangGraph's `"$"`). A value may carry `kind`, `status` and
  `provenance`; they become the item's own.
- Items written through `MemoryService.add` appear read-only under `(tenant, "memories", kind)`
  with their status, provenance, counts and validity in the value.
- Searching or listing without a concrete tenant prefix is refused unless `admin=True`.
- Order and scores follow LangGraph's `InMemoryStore` (the conformance suite checks they agree):
  without a query, items in namespace-creation then insertion order; with a query, cosine
  similarity, highest first.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import numpy as np
import sqlalchemy as sa
from langgraph.store.base import (BaseStore, GetOp, Item, ListNamespacesOp, Op, PutOp, Result,
                                  SearchItem, SearchOp, get_text_at_path, tokenize_path)

from memory.ledger import IT, NS_SEP, Change
from memory.models import KINDS, LIVE_STATUSES, InvalidInput, MemoryItem, Provenance
from memory import ingest
from memory.service import MemoryService
from memory.text import text_hash

VIEW = "memories"


def store_item_id(namespace: tuple[str, ...], key: str) -> str:
    return "st-" + hashlib.sha1(f"{NS_SEP.join(namespace)}\x1e{key}".encode()).hexdigest()[:20]


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def matches(value: Any, flt: Any) -> bool:
    """JSONB-like filter: nested dicts, exact lists, and $eq $ne $gt $gte $lt $lte operators."""
    if isinstance(flt, dict):
        if any(k.startswith("$") for k in flt):
            return all(_op(value, k, v) for k, v in flt.items())
        return isinstance(value, dict) and all(matches(value.get(k), v) for k, v in flt.items())
    if isinstance(flt, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(flt)
                and all(matches(a, b) for a, b in zip(value, flt)))
    return value == flt


def _op(value: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return value == arg
    if op == "$ne":
        return value != arg
    cmp = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}
    if op not in cmp:
        raise InvalidInput(f"unsupported filter operator {op!r}")
    return cmp[op](float(value), float(arg))


def _ns_match(cond: Any, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    pairs = zip(ns, path) if cond.match_type == "prefix" else zip(reversed(ns), reversed(path))
    return all(p == "*" or a == p for a, p in pairs)


class EvolveStore(BaseStore):
    """A LangGraph store backed by the memory ledger (durable, versioned, tenant-partitioned)."""

    def __init__(self, memory: MemoryService | str, *, index: dict[str, Any] | None = None,
                 admin: bool = False):
        self.memory = memory if isinstance(memory, MemoryService) else MemoryService(memory)
        fields = (index or {}).get("fields")
        self.fields = list(fields) if fields else None
        self.admin = admin

    # ---- BaseStore ----------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results: list[Result] = [None] * len(ops)
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for i, op in enumerate(ops):  # reads see the state before this batch's writes
            if isinstance(op, PutOp):
                puts[(tuple(op.namespace), op.key)] = op
            elif isinstance(op, GetOp):
                results[i] = self._get(tuple(op.namespace), op.key)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list(op)
            else:
                raise InvalidInput(f"unknown store operation {type(op).__name__}")
        if puts:
            self._put(list(puts.values()))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # ---- internals ----------------------------------------------------------------------
    def _tenant(self, ns: tuple[str, ...]) -> str | None:
        if ns and ns[0] not in ("", "*"):
            return ns[0]
        if self.admin:
            return None
        raise InvalidInput("store namespaces start with the tenant; give a concrete tenant prefix "
                           "(or open the store with admin=True)")

    def _text(self, value: dict[str, Any], index: Any) -> str:
        fields = index if isinstance(index, list) else self.fields
        if fields is None:
            fields = ["text"] if isinstance(value.get("text"), str) else ["$"]
        parts: list[str] = []
        for f in fields:
            if f == "$":
                parts.append(json.dumps(value, sort_keys=True, default=str))
            else:
                parts += [str(x) for x in get_text_at_path(value, tokenize_path(f)) if x]
        text = "\n".join(p for p in parts if p.strip())
        return text or json.dumps(value, sort_keys=True, default=str)

    def _put(self, ops: list[PutOp]) -> None:
        svc = self.memory
        with svc._lock:
            ids = [store_item_id(tuple(op.namespace), op.key) for op in ops]
            current = svc.ledger.get_many(ids)
            changes: list[Change] = []
            now = time.time()
            for op, iid in zip(ops, ids):
                ns = tuple(op.namespace)
                if len(ns) == 3 and ns[1] == VIEW and ns[2] in KINDS:
                    raise InvalidInput(f"namespace {ns} is the read-only view of MemoryService "
                                       "items; use MemoryService methods to change them")
                tenant = self._tenant(ns) or ns[0]
                cur = current.get(iid)
                live = cur is not None and cur.status in LIVE_STATUSES
                if op.value is None:
                    if live:
                        new = cur.model_copy(deep=True)  # type: ignore[union-attr]
                        new.status, new.valid_to, new.status_reason = "retracted", now, "store delete"
                        new.version += 1
                        new.updated_at = now
                        changes.append(Change("store_delete", tenant, new))
                    continue
                value = dict(op.value)
                kind = value.get("kind") if value.get("kind") in KINDS else "task_experience"
                status = value.get("status") if value.get("status") in ("candidate", "validated") \
                    else "candidate"
                prov = [Provenance.model_validate(p) for p in value.get("provenance", [])
                        if isinstance(p, dict)] if isinstance(value.get("provenance"), list) else []
                new = ingest.new_item(tenant=tenant, text=self._text(value, op.index), kind=kind,
                                    status=status, source="store", id=iid, namespace=list(ns),
                                    key=op.key, provenance=prov or None)
                new.payload = value
                if live:
                    new.created_at, new.valid_from = cur.created_at, cur.valid_from  # type: ignore[union-attr]
                    new.version = cur.version + 1  # type: ignore[union-attr]
                elif cur is not None:
                    new.version = cur.version + 1
                changes.append(Change("store_put", tenant, new, {"key": op.key}))
            todo = [c.item.text for c in changes if c.item is not None and c.item.status in LIVE_STATUSES]
            svc.embedder.embed(todo)  # fill the cache before the projections need it
            svc.ledger.commit(changes)
            svc.sync()

    def _view(self, it: MemoryItem) -> dict[str, Any]:
        return {"text": it.text, "kind": it.kind, "status": it.status, "payload": it.payload,
                "provenance": [p.model_dump() for p in it.provenance], "helpful": it.helpful,
                "harmful": it.harmful, "valid_from": it.valid_from, "valid_to": it.valid_to,
                "version": it.version}

    def _item(self, it: MemoryItem, score: float | None = None, search: bool = False) -> Item:
        if it.namespace:
            ns, key, value = tuple(it.namespace), it.key or "", it.payload
        else:
            ns, key, value = (it.tenant, VIEW, it.kind), it.id, self._view(it)
        kw = dict(namespace=ns, key=key, value=value, created_at=_dt(it.created_at),
                  updated_at=_dt(it.updated_at))
        return SearchItem(**kw, score=score) if search else Item(**kw)

    def _get(self, ns: tuple[str, ...], key: str) -> Item | None:
        self._tenant(ns)
        self.memory.sync()
        if len(ns) == 3 and ns[1] == VIEW and ns[2] in KINDS:
            it = self.memory.ledger.get(key)
            ok = it is not None and not it.namespace and it.tenant == ns[0] and it.kind == ns[2]
        else:
            it = self.memory.ledger.get(store_item_id(ns, key))
            ok = it is not None
        return self._item(it) if ok and it.status in LIVE_STATUSES else None  # type: ignore[union-attr]

    def _rows(self, tenant: str | None) -> list[tuple[tuple[str, ...], int, MemoryItem]]:
        """Live items as (namespace, insertion seq, item), in InMemoryStore's iteration order."""
        self.memory.sync()
        q = sa.select(IT.c.doc, IT.c.ns, IT.c.created_seq, IT.c.inserted_seq, IT.c.status)
        if tenant is not None:
            q = q.where(IT.c.tenant == tenant)
        first: dict[tuple[str, ...], int] = {}
        rows = []
        with self.memory.ledger.engine.connect() as c:
            for doc, ns, created, inserted, status in c.execute(q):
                it = MemoryItem.model_validate_json(doc)
                nst = tuple(ns.split(NS_SEP)) if ns else (it.tenant, VIEW, it.kind)
                first[nst] = min(first.get(nst, created), created)
                if status in LIVE_STATUSES:
                    rows.append((nst, inserted, it))
        rows.sort(key=lambda r: (first[r[0]], r[1]))
        return rows

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        rows = [r for r in self._rows(self._tenant(prefix)) if r[0][:len(prefix)] == prefix]
        cands = [(ns, it) for ns, _, it in rows
                 if not op.filter or all(matches((it.payload if it.namespace else self._view(it)).get(k), v)
                                         for k, v in op.filter.items())]
        if not op.query:
            return [self._item(it, search=True) for _, it in cands[op.offset:op.offset + op.limit]]
        q = self.memory.embedder.query(op.query)
        vecs = self.memory.embedder.by_hash([text_hash(it.text) for _, it in cands])
        scored = [(float(np.dot(vecs[text_hash(it.text)], q)), it) for _, it in cands
                  if text_hash(it.text) in vecs]
        scored.sort(key=lambda x: x[0], reverse=True)
        return [self._item(it, s, search=True) for s, it in scored[op.offset:op.offset + op.limit]]

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        tenant = None
        for cond in op.match_conditions or ():
            if cond.match_type == "prefix" and cond.path and cond.path[0] != "*":
                tenant = cond.path[0]
        if tenant is None and not self.admin:
            raise InvalidInput("list_namespaces needs prefix=(tenant, ...) (or admin=True)")
        spaces = list(dict.fromkeys(ns for ns, _, _ in self._rows(tenant)))
        spaces = [ns for ns in spaces if all(_ns_match(c, ns) for c in op.match_conditions or ())]
        if op.max_depth is not None:
            spaces = sorted({ns[:op.max_depth] for ns in spaces})
        else:
            spaces = sorted(spaces)
        return spaces[op.offset:op.offset + op.limit]
