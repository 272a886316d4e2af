"""The ledger: the single source of truth for memory (DESIGN.md "the ledger is the truth").

Every change is an append-only row in `memory_event` whose autoincrement `seq` is the ledger
version. Each item event carries the item's full snapshot *after* the event, so the state at any
version is "the last snapshot at or before it" (rollback and history need no replay logic).
`memory_item` is the current state derived from the events, written in the *same transaction*
as the event, so it can never disagree with the log; it serves filters and keyword search.
The trajectory log and the embedding cache live in the same database.

Writers are serialised (SQLite: one writer by design; Postgres: a transaction-scoped advisory
lock) so sequence numbers become visible in order and projections can catch up by `seq > last`.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlmodel import Field, SQLModel

from dynamic_bench.schema import Feedback, Trajectory
from memory.models import LIVE_STATUSES, MemoryItem

NS_SEP = "\x1f"  # joins LangGraph namespace parts in one indexed column


class MemoryEvent(SQLModel, table=True):
    __tablename__ = "memory_event"
    seq: int | None = Field(default=None, primary_key=True)
    ts: float = Field(index=True)
    type: str
    tenant: str = Field(index=True)
    item_id: str | None = Field(default=None, index=True)
    trajectory_id: str | None = Field(default=None, index=True)
    cycle: str | None = Field(default=None, index=True)
    data: str = "{}"  # JSON: the request (reason, counts, target version...)
    snapshot: str | None = None  # JSON MemoryItem after the event (None: not an item event)


class MemoryItemRow(SQLModel, table=True):
    __tablename__ = "memory_item"
    id: str = Field(primary_key=True)
    tenant: str = Field(index=True)
    kind: str
    status: str = Field(index=True)
    content_hash: str = Field(index=True)  # tenant+kind+normalised text: exact dedup
    text_hash: str  # embedding cache key
    subject: str | None = Field(default=None, index=True)  # payload["subject"]: contradictions
    ns: str | None = Field(default=None, index=True)  # LangGraph store namespace (store items)
    key: str | None = None
    created_seq: int
    inserted_seq: int
    updated_seq: int = Field(index=True)
    doc: str  # JSON MemoryItem


class MemoryItemLink(SQLModel, table=True):
    """Derived index item -> trajectory/cycle, so retraction finds what a trajectory produced."""

    __tablename__ = "memory_item_link"
    id: int | None = Field(default=None, primary_key=True)
    item_id: str = Field(index=True)
    tenant: str = Field(index=True)
    trajectory_id: str | None = Field(default=None, index=True)
    cycle: str | None = Field(default=None, index=True)


class TrajectoryRow(SQLModel, table=True):
    __tablename__ = "trajectory_log"
    id: str = Field(primary_key=True)
    tenant: str = Field(index=True)
    seq: int = Field(index=True)  # last event (record or feedback) that touched it: the cursor
    retracted: bool = False
    doc: str  # JSON Trajectory without feedback (feedback rows are separate)


class FeedbackRow(SQLModel, table=True):
    __tablename__ = "trajectory_feedback"
    id: int | None = Field(default=None, primary_key=True)
    trajectory_id: str = Field(index=True)
    tenant: str = Field(index=True)
    seq: int
    doc: str


class EmbeddingCacheRow(SQLModel, table=True):
    __tablename__ = "embedding_cache"
    text_hash: str = Field(primary_key=True)
    dim: int
    vec: bytes


# memory_item columns fixed for an item's life (its id derives from tenant, or namespace and key)
FIXED_COLS = frozenset({"id", "b_id", "tenant", "ns", "key", "created_seq"})
TABLES = [t.__table__ for t in (MemoryEvent, MemoryItemRow, MemoryItemLink, TrajectoryRow,
                                FeedbackRow, EmbeddingCacheRow)]
EV, IT, LK, TR, FB, EC = TABLES


@dataclass
class Change:
    """One event to append. `item` is the snapshot after the change (None: not an item event)."""

    type: str
    tenant: str
    item: MemoryItem | None = None
    data: dict[str, Any] = field(default_factory=dict)
    trajectory_id: str | None = None
    cycle: str | None = None


def ledger_url(path_or_url: str | Path) -> str:
    """A data dir or `.db` path becomes a SQLite URL; anything with `://` is used as is."""
    s = str(path_or_url)
    if "://" in s:
        return s
    p = Path(s)
    if p.suffix != ".db":
        p.mkdir(parents=True, exist_ok=True)
        p = p / "ledger.db"
    return f"sqlite:///{p}"


class Ledger:
    """Append-only event log + derived item state + trajectory log + embedding cache."""

    def __init__(self, url: str):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kw: dict[str, Any] = {"future": True}
        if self.is_sqlite:
            kw["connect_args"] = {"timeout": 60}
        self.engine = sa.create_engine(url, **kw)
        if self.is_sqlite:
            @sa_event.listens_for(self.engine, "connect")
            def _pragmas(conn, _rec):  # WAL: a killed writer never leaves a half-written commit
                cur = conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA busy_timeout=60000")
                cur.execute("PRAGMA secure_delete=ON")  # forget: deleted text is zeroed on disk
                cur.execute("PRAGMA cache_size=-65536")  # 64 MiB: bulk updates hit many index pages
                cur.close()
        SQLModel.metadata.create_all(self.engine, tables=TABLES)
        self.fresh: dict[str, tuple[int, MemoryItem]] = {}  # item -> (seq, state) just committed

    def close(self) -> None:
        self.engine.dispose()

    # ---- transactions -------------------------------------------------------------------
    @contextmanager
    def tx(self) -> Iterator[sa.Connection]:
        """One write transaction, serialised across processes."""
        with self.engine.begin() as conn:
            if self.is_sqlite:
                conn.exec_driver_sql("SELECT 1")  # pysqlite begins lazily; fine: writes lock
            else:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(7346291)"))
            yield conn

    def commit(self, changes: list[Change], conn: sa.Connection | None = None) -> list[int]:
        """Append events and update the derived state atomically; returns their seqs."""
        if not changes:
            return []
        if conn is None:
            with self.tx() as c:
                seqs = self.commit(changes, c)
            for ch, sq in zip(changes, seqs):  # committed: projections may use these directly
                if ch.item is not None:
                    self.fresh[ch.item.id] = (sq, ch.item)
            return seqs
        now = time.time()
        for c in changes:
            if c.item is not None:
                c.item.version = max(c.item.version, 0)
        snaps = [c.item.model_dump_json() if c.item else None for c in changes]  # dumped once
        rows = [{
            "ts": now, "type": c.type, "tenant": c.tenant,
            "item_id": c.item.id if c.item else None,
            "trajectory_id": c.trajectory_id, "cycle": c.cycle,
            "data": json.dumps(c.data, default=str), "snapshot": snap,
        } for c, snap in zip(changes, snaps)]
        if self.is_sqlite:  # one executemany; writers are serialised, so the new seqs are > top
            top = conn.execute(sa.select(sa.func.max(EV.c.seq))).scalar() or 0
            conn.execute(sa.insert(EV), rows)
            seqs = [r[0] for r in conn.execute(
                sa.select(EV.c.seq).where(EV.c.seq > top).order_by(EV.c.seq))]
            assert len(seqs) == len(rows), "concurrent writer inside a serialised transaction"
        else:
            res = conn.execute(sa.insert(EV).returning(EV.c.seq, sort_by_parameter_order=True), rows)
            seqs = [r[0] for r in res]
        latest: dict[str, tuple[MemoryItem, int, str]] = {}
        for c, s, snap in zip(changes, seqs, snaps):
            if c.item is not None and snap is not None:
                latest[c.item.id] = (c.item, s, snap)
        if latest:
            self._upsert_items(conn, latest)
        return seqs

    def _upsert_items(self, conn: sa.Connection, latest: dict[str, tuple[MemoryItem, int, str]]) -> None:
        ids = list(latest)
        existing: dict[str, tuple[int, int, str]] = {}
        for chunk in _chunks(ids, 500):
            for r in conn.execute(sa.select(IT.c.id, IT.c.created_seq, IT.c.inserted_seq,
                                            IT.c.status).where(IT.c.id.in_(chunk))):
                existing[r[0]] = (r[1], r[2], r[3])
        ins, upd = [], []
        for iid, (item, s, doc) in latest.items():
            if iid in existing:
                created, inserted, old_status = existing[iid]
                if old_status not in LIVE_STATUSES and item.status in LIVE_STATUSES:
                    inserted = s  # re-created after a delete/retraction: LangGraph order
                upd.append(_item_row(item, doc, created, inserted, s) | {"b_id": iid})
            else:
                ins.append(_item_row(item, doc, s, s, s))
        if ins:
            conn.execute(sa.insert(IT), ins)
        if upd:  # only columns an item can change: fewer index entries rewritten
            cols = {k: sa.bindparam(k) for k in upd[0] if k not in FIXED_COLS}
            conn.execute(sa.update(IT).where(IT.c.id == sa.bindparam("b_id")).values(**cols), upd)
        want: dict[str, set[tuple[str | None, str | None]]] = {}
        for iid, (item, _, _) in latest.items():
            pairs = {(p.trajectory_id, p.cycle) for p in item.provenance}
            if item.created_by_cycle:
                pairs.add((None, item.created_by_cycle))
            want[iid] = {(t, c) for t, c in pairs if t or c}
        have: dict[str, set[tuple[str | None, str | None]]] = {}
        for chunk in _chunks(ids, 500):
            q = sa.select(LK.c.item_id, LK.c.trajectory_id, LK.c.cycle).where(LK.c.item_id.in_(chunk))
            for iid, t, c in conn.execute(q):
                have.setdefault(iid, set()).add((t, c))
        stale = [i for i in ids if have.get(i, set()) != want[i]]  # a status change keeps links
        for chunk in _chunks(stale, 500):
            conn.execute(sa.delete(LK).where(LK.c.item_id.in_(chunk)))
        links = [{"item_id": iid, "tenant": latest[iid][0].tenant, "trajectory_id": t, "cycle": c}
                 for iid in stale for t, c in want[iid]]
        if links:
            conn.execute(sa.insert(LK), links)

    # ---- reads --------------------------------------------------------------------------
    def max_seq(self) -> int:
        with self.engine.connect() as c:
            return int(c.execute(sa.select(sa.func.max(EV.c.seq))).scalar() or 0)

    def get(self, item_id: str) -> MemoryItem | None:
        with self.engine.connect() as c:
            doc = c.execute(sa.select(IT.c.doc).where(IT.c.id == item_id)).scalar()
        return MemoryItem.model_validate_json(doc) if doc else None

    def get_many(self, ids: Iterable[str]) -> dict[str, MemoryItem]:
        out: dict[str, MemoryItem] = {}
        with self.engine.connect() as c:
            for chunk in _chunks(list(ids), 500):
                for iid, doc in c.execute(sa.select(IT.c.id, IT.c.doc).where(IT.c.id.in_(chunk))):
                    out[iid] = MemoryItem.model_validate_json(doc)
        return out

    def select_items(self, where: Any, order: Any = None) -> list[MemoryItem]:
        q = sa.select(IT.c.doc).where(where)
        if order is not None:
            q = q.order_by(order)
        with self.engine.connect() as c:
            return [MemoryItem.model_validate_json(d) for (d,) in c.execute(q)]

    def find_live(self, tenant: str, **eq: Any) -> list[MemoryItem]:
        conds = [IT.c.tenant == tenant, IT.c.status.in_(("candidate", "validated"))]
        conds += [IT.c[k] == v for k, v in eq.items()]
        return self.select_items(sa.and_(*conds), IT.c.created_seq)

    def linked_items(self, *, trajectory_id: str | None = None, cycle: str | None = None,
                     tenant: str | None = None) -> list[str]:
        q = sa.select(LK.c.item_id).distinct()
        if trajectory_id is not None:
            q = q.where(LK.c.trajectory_id == trajectory_id)
        if cycle is not None:
            q = q.where(LK.c.cycle == cycle)
        if tenant is not None:
            q = q.where(LK.c.tenant == tenant)
        with self.engine.connect() as c:
            return [r[0] for r in c.execute(q)]

    def events(self, where: Any = None, after: int = 0, limit: int | None = None) -> list[sa.Row]:
        q = sa.select(EV).where(EV.c.seq > after).order_by(EV.c.seq)
        if where is not None:
            q = q.where(where)
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as c:
            return list(c.execute(q))

    def touched_since(self, after: int) -> tuple[dict[str, tuple[str, int]], set[str], int]:
        """Items and tenant-wide events after `after`:
        ({item_id: (tenant, last seq)}, forgotten tenants, max seq)."""
        items: dict[str, tuple[str, int]] = {}
        forgotten: set[str] = set()
        top = after
        q = (sa.select(EV.c.seq, EV.c.item_id, EV.c.tenant, EV.c.type)
             .where(EV.c.seq > after).order_by(EV.c.seq))
        with self.engine.connect() as c:
            for seq, iid, tenant, typ in c.execute(q):
                top = seq
                if iid:
                    items[iid] = (tenant, seq)
                elif typ == "tenant_forgotten":
                    forgotten.add(tenant)
        return items, forgotten, top

    def current(self, touched: dict[str, tuple[str, int]]) -> dict[str, MemoryItem]:
        """Current state of touched items: this process's fresh commits, else the database."""
        out: dict[str, MemoryItem] = {}
        for iid, (_, seq) in touched.items():
            f = self.fresh.get(iid)
            if f is not None and f[0] == seq:
                out[iid] = f[1]
        rest = [i for i in touched if i not in out]
        out.update(self.get_many(rest))
        self.fresh.clear()
        return out

    def raw_docs(self, ids: list[str]) -> dict[str, str]:
        """Current item JSON, unparsed (bulk paths parse only what they keep)."""
        out: dict[str, str] = {}
        with self.engine.connect() as c:
            for chunk in _chunks(ids, 500):
                out.update({r[0]: r[1] for r in c.execute(sa.select(IT.c.id, IT.c.doc).where(IT.c.id.in_(chunk)))})
        return out

    def snapshots_at(self, item_ids: list[str], version: int) -> dict[str, str | None]:
        """Each item's snapshot JSON at ledger version `version` (None: it did not exist yet)."""
        out: dict[str, str | None] = {i: None for i in item_ids}
        with self.engine.connect() as c:
            for chunk in _chunks(item_ids, 500):
                last = (sa.select(EV.c.item_id, sa.func.max(EV.c.seq).label("s"))
                        .where(EV.c.item_id.in_(chunk), EV.c.seq <= version,
                               EV.c.snapshot.is_not(None))
                        .group_by(EV.c.item_id).subquery())
                q = sa.select(EV.c.item_id, EV.c.snapshot).join(last, EV.c.seq == last.c.s)
                for iid, snap in c.execute(q):
                    out[iid] = snap
        return out

    def version_at_time(self, t: float) -> int:
        with self.engine.connect() as c:
            return int(c.execute(sa.select(sa.func.max(EV.c.seq)).where(EV.c.ts <= t)).scalar() or 0)

    def count_items(self, tenant: str | None = None) -> dict[str, int]:
        q = sa.select(IT.c.status, sa.func.count()).group_by(IT.c.status)
        if tenant is not None:
            q = q.where(IT.c.tenant == tenant)
        with self.engine.connect() as c:
            return {s: int(n) for s, n in c.execute(q)}

    def tenants(self) -> list[str]:
        with self.engine.connect() as c:
            a = {r[0] for r in c.execute(sa.select(IT.c.tenant).distinct())}
            b = {r[0] for r in c.execute(sa.select(TR.c.tenant).distinct())}
        return sorted(a | b)

    # ---- trajectory log -----------------------------------------------------------------
    def trajectory_row(self, conn: sa.Connection, traj_id: str) -> sa.Row | None:
        return conn.execute(sa.select(TR).where(TR.c.id == traj_id)).first()

    def load_trajectories(self, rows: list[sa.Row], conn: sa.Connection) -> list[Trajectory]:
        ids = [r.id for r in rows]
        fbs: dict[str, list[Feedback]] = {i: [] for i in ids}
        for chunk in _chunks(ids, 500):
            q = sa.select(FB.c.trajectory_id, FB.c.doc).where(FB.c.trajectory_id.in_(chunk))
            for tid, doc in conn.execute(q.order_by(FB.c.id)):
                fbs[tid].append(Feedback.model_validate_json(doc))
        out = []
        for r in rows:
            t = Trajectory.model_validate_json(r.doc)
            t.feedback = fbs[r.id]
            out.append(t)
        return out

    # ---- embedding cache ----------------------------------------------------------------
    def cached_vectors(self, hashes: list[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        with self.engine.connect() as c:
            for chunk in _chunks(list(set(hashes)), 500):
                q = sa.select(EC.c.text_hash, EC.c.vec).where(EC.c.text_hash.in_(chunk))
                for h, v in c.execute(q):
                    out[h] = np.frombuffer(v, dtype=np.float32)
        return out

    def cache_vectors(self, vecs: dict[str, np.ndarray]) -> None:
        if not vecs:
            return
        with self.tx() as c:
            have = set()
            for chunk in _chunks(list(vecs), 500):
                have |= {r[0] for r in c.execute(
                    sa.select(EC.c.text_hash).where(EC.c.text_hash.in_(chunk)))}
            rows = [{"text_hash": h, "dim": int(v.shape[0]), "vec": v.astype(np.float32).tobytes()}
                    for h, v in vecs.items() if h not in have]
            if rows:
                c.execute(sa.insert(EC), rows)

    def count_cached(self) -> int:
        with self.engine.connect() as c:
            return int(c.execute(sa.select(sa.func.count()).select_from(EC)).scalar() or 0)


def _item_row(item: MemoryItem, doc: str, created: int, inserted: int, updated: int) -> dict[str, Any]:
    from memory.text import content_hash, text_hash
    subject = item.payload.get("subject")
    return {
        "id": item.id, "tenant": item.tenant, "kind": item.kind, "status": item.status,
        "content_hash": content_hash(item.tenant, item.kind, item.text),
        "text_hash": text_hash(item.text),
        "subject": str(subject) if subject is not None else None,
        "ns": NS_SEP.join(item.namespace) if item.namespace else None, "key": item.key,
        "created_seq": created, "inserted_seq": inserted, "updated_seq": updated,
        "doc": doc,
    }


def _chunks(xs: list, n: int) -> Iterator[list]:
    for i in range(0, len(xs), n):
        yield xs[i:i + n]
