"""`MemoryService`: the facade over the ledger and its projections (DESIGN.md "Memory").

Writes go to the ledger first (one transaction per call); the vector collection, the graph and
the keyword index are then brought up to the ledger's version. Every read first checks the
ledger version (one indexed query), so a projection never serves state older than the ledger,
even when another process wrote.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dynamic_bench.schema import Feedback, Trajectory
from memory import ingest, lifecycle
from memory.embeddings import CachedEmbedder
from memory.ledger import EV, FB, IT, TR, Change, Ledger, ledger_url
from memory.models import (KINDS, LIVE_STATUSES, Explanation, Hit, HistoryEntry, InvalidInput,
                           MemoryItem, NotFound, Provenance, TrajectoryPage)
from memory.projections import GraphProjection, KeywordIndex, VectorProjection
from memory.text import extract_entities

log = logging.getLogger("memory")


@dataclass
class MemoryConfig:
    """Flat config. Scale path: `ledger_url` (e.g. postgresql+psycopg://...) and `chroma_url`
    (http://host:port, chromadb's HTTP client) are configuration, not code changes."""

    data_dir: str | None = None
    ledger_url: str | None = None
    chroma_url: str | None = None
    dedup_threshold: float = 0.93  # cosine similarity above which same-kind items merge
    validate_min_helpful: int = 2  # helpful outcomes that promote a candidate
    outcome_window: int = 5  # recent outcomes considered for automatic invalidation
    invalidate_min_harmful: int = 2
    # A note of what the user said or did (provenance source "user") is evidence, not the agent's guess: an agent
    # that fails while ignoring it does not make it wrong. Such items count outcomes but leave only
    # when superseded, retracted or retired. True puts them under the same automatic invalidation.
    invalidate_user_items: bool = False
    w_vector: float = 0.6
    w_keyword: float = 0.3
    w_graph: float = 0.1
    graph_save_every: int = 20000  # graph file is rewritten after this many item changes


class MemoryService:
    """Long-term memory + trajectory log. Open with a data dir or a ledger URL."""

    def __init__(self, path_or_url: str | Path | None = None, *, config: MemoryConfig | None = None,
                 data_dir: str | Path | None = None, chroma_url: str | None = None):
        cfg = config or MemoryConfig()
        if path_or_url is not None:
            if "://" in str(path_or_url):
                cfg.ledger_url = str(path_or_url)
            else:
                cfg.data_dir = str(path_or_url)
        if data_dir is not None:
            cfg.data_dir = str(data_dir)
        if chroma_url is not None:
            cfg.chroma_url = chroma_url
        if cfg.ledger_url is None and cfg.data_dir is None:
            raise InvalidInput("MemoryService needs a data dir or a ledger URL")
        self.cfg = cfg
        self.notices: list[str] = []  # rebuild messages, shown by the CLI
        self._closed = False
        self._lock = threading.RLock()
        ddir = Path(cfg.data_dir) if cfg.data_dir else None
        if ddir:
            ddir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(cfg.ledger_url or ledger_url(ddir))  # type: ignore[arg-type]
        self.embedder = CachedEmbedder(self.ledger)
        self.vec = VectorProjection(ddir / "chroma" if ddir else None, cfg.chroma_url, self.notices)
        self.graph = GraphProjection(ddir / "graph.json" if ddir else None, self.notices)
        self.kw = KeywordIndex()
        self.kw_seq = 0
        self._check_vector_consistency()
        self.sync()

    # ---- projections --------------------------------------------------------------------
    def _check_vector_consistency(self) -> None:
        """A vector store that lost rows (deleted files, partial restore) is rebuilt, loudly.
        Runs after the first sync: the live set it compares against comes from that sync."""
        if self.vec.last_seq == 0:
            if self.vec.fresh and self.ledger.max_seq() > 0:
                msg = (f"vector projection at {self.vec.path} is missing; rebuilding it from the "
                       f"ledger")
                log.warning(msg)
                self.notices.append(msg)
            return
        if self.vec.last_seq > self.ledger.max_seq():
            self._vector_rebuild(f"vector projection is ahead of the ledger (version "
                                 f"{self.vec.last_seq} > {self.ledger.max_seq()})")
            return
        self.sync()
        live = sum(n for s, n in self.ledger.count_items().items() if s in LIVE_STATUSES)
        have = self.vec.count()
        if have != live:
            self._vector_rebuild(f"vector projection disagrees with the ledger ({have} vectors, "
                                 f"{live} live items)")

    def _vector_rebuild(self, why: str) -> None:
        msg = f"{why}; rebuilding it from the ledger"
        log.warning(msg)
        self.notices.append(msg)
        self.vec.reset()

    def sync(self) -> int:
        """Bring every projection up to the ledger's version; returns that version."""
        with self._lock:
            top = self.ledger.max_seq()
            lo = min(self.vec.last_seq, self.vec.live_seq, self.graph.last_seq, self.kw_seq)
            if lo >= top:
                return top
            touched, forgotten, top = self.ledger.touched_since(lo)
            for t in forgotten:
                self.vec.drop_tenant(t)
                self.graph.drop_tenant(t)
                self.kw.drop_tenant(t)
            current = self.ledger.current(touched)
            by_tenant: dict[str, dict[str, MemoryItem | None]] = {}
            for iid, (tenant, _) in touched.items():
                it = current.get(iid)
                by_tenant.setdefault(tenant, {})[iid] = it  # None: gone from the ledger
            for tenant, items in by_tenant.items():
                self.vec.apply(tenant, items, self.embedder.embed)
                self.graph.apply(tenant, items)
                self.kw.apply(tenant, items)
            self.vec.set_last_seq(top)
            self.vec.live_seq = self.kw_seq = top
            self.graph.last_seq = top
            if self.graph.dirty >= self.cfg.graph_save_every:
                self.graph.save(top)
            return top

    def rebuild(self) -> dict[str, float]:
        """Drop every projection and rebuild it from the ledger (the embedding cache is reused)."""
        with self._lock:
            t0 = time.perf_counter()
            misses = self.embedder.misses
            self.vec.reset()
            self.graph.reset()
            self.kw = KeywordIndex()
            self.kw_seq = 0
            version = self.sync()
            self.graph.save(version)
            return {"version": version, "seconds": time.perf_counter() - t0,
                    "vectors": self.vec.count(), "re_embedded": self.embedder.misses - misses}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.graph.save(self.sync())
            self.vec.close()
            self.ledger.close()
            self._closed = True

    def __enter__(self) -> "MemoryService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def version(self) -> int:
        return self.ledger.max_seq()

    # ---- writes -------------------------------------------------------------------------
    def add(self, tenant: str, text: str, *, kind: str = "task_experience",
            payload: dict[str, Any] | None = None, trajectory_id: str | None = None,
            step: int | None = None, evidence: str = "", source: str = "agent",
            cycle: str | None = None, provenance: list[Provenance] | None = None,
            status: str = "candidate", entities: list[str] | None = None,
            relations: list[tuple[str, str, str]] | None = None, tier: str = "long_term",
            valid_from: float | None = None, dedup: bool = True) -> MemoryItem:
        """Add one item (deduplicated, may supersede a contradicting one); returns the stored item."""
        return self.add_many([dict(tenant=tenant, text=text, kind=kind, payload=payload,
                                   trajectory_id=trajectory_id, step=step, evidence=evidence,
                                   source=source, cycle=cycle, provenance=provenance, status=status,
                                   entities=entities, relations=relations, tier=tier,
                                   valid_from=valid_from)], dedup=dedup)[0]

    def add_many(self, specs: list[dict[str, Any]], dedup: bool = True) -> list[MemoryItem]:
        """Bulk add in one transaction: all of it is committed or none of it."""
        items = [ingest.new_item(**s) for s in specs]
        with self._lock:
            self.sync()
            changes, out = ingest.plan_adds(self, items, dedup)
            self.ledger.commit(changes)
            self.sync()
        return out

    def _update(self, item_id: str, tenant: str | None, typ: str, data: dict[str, Any],
                mutate: Any, trajectory_id: str | None = None) -> MemoryItem:
        with self._lock:
            item = self.get(item_id, tenant)
            new = item.model_copy(deep=True)
            mutate(new)
            new.version += 1
            new.updated_at = time.time()
            self.ledger.commit([Change(typ, new.tenant, new, data, trajectory_id)])
            self.sync()
            return new

    def record_outcome(self, item_id: str, helpful: bool, trajectory_id: str | None = None, *,
                       tenant: str | None = None, evidence: str = "") -> MemoryItem:
        """Count one use of the item; promote or invalidate it automatically from the evidence
        (user-sourced items are not invalidated by outcomes unless `invalidate_user_items`)."""
        cfg = self.cfg

        def mutate(it: MemoryItem) -> None:
            if helpful:
                it.helpful += 1
            else:
                it.harmful += 1
            it.recent = (it.recent + [1 if helpful else 0])[-cfg.outcome_window:]
            bad = it.recent.count(0)
            said_by_user = any(p.source == "user" for p in it.provenance)
            may_invalidate = cfg.invalidate_user_items or not said_by_user
            if (may_invalidate and it.status in ("candidate", "validated") and bad >= cfg.invalidate_min_harmful
                    and bad > len(it.recent) - bad):
                it.status, it.valid_to = "retracted", time.time()
                it.status_reason = f"invalidated: {bad} of the last {len(it.recent)} uses were harmful"
            elif (it.status == "candidate" and it.helpful >= cfg.validate_min_helpful
                  and it.helpful > it.harmful):
                it.status, it.status_reason = "validated", f"validated by {it.helpful} helpful uses"

        return self._update(item_id, tenant, "outcome", {"helpful": helpful, "evidence": evidence},
                            mutate, trajectory_id)

    def validate(self, item_id: str, evidence: str = "", *, tenant: str | None = None,
                 trajectory_id: str | None = None) -> MemoryItem:
        """Mark a candidate validated from outside evidence (a replay, a reviewer)."""
        def mutate(it: MemoryItem) -> None:
            if it.status not in ("candidate", "validated"):
                raise InvalidInput(f"item {it.id} is {it.status}; only candidates can be validated")
            it.status, it.status_reason = "validated", evidence or "validated"
        return self._update(item_id, tenant, "validated", {"evidence": evidence}, mutate, trajectory_id)

    def retire(self, item_id: str, reason: str, *, tenant: str | None = None) -> MemoryItem:
        """Consolidation: the policy has learned this; stop retrieving it (history is kept)."""
        def mutate(it: MemoryItem) -> None:
            it.status, it.valid_to, it.status_reason = "retired", time.time(), reason
        return self._update(item_id, tenant, "retired", {"reason": reason}, mutate)

    def retract(self, item_id: str, reason: str, *, tenant: str | None = None) -> MemoryItem:
        """Stop retrieving an item found wrong (history is kept); a no-op on one already retracted.
        Why: a generalised correction ("when you would A ..., users do B instead") that the same
        window contradicts (A approved for that kind of request too) is wrong as stated."""
        item = self.get(item_id, tenant)
        if item.status == "retracted":
            return item

        def mutate(it: MemoryItem) -> None:
            it.status, it.valid_to, it.status_reason = "retracted", time.time(), reason
        return self._update(item_id, tenant, "retracted", {"reason": reason}, mutate)

    def retire_many(self, item_ids: list[str], reason: str, *, tenant: str | None = None) -> int:
        """Retire many items in one transaction (consolidation retires in bulk)."""
        with self._lock, lifecycle.paused_gc():
            found = self.ledger.get_many(item_ids)
            missing = [i for i in item_ids if i not in found or (tenant and found[i].tenant != tenant)]
            if missing:
                raise NotFound(f"unknown memory item(s) {missing[:5]}")
            now = time.time()
            changes = []
            for it in found.values():
                if it.status in ("retired", "retracted"):
                    continue
                it.status, it.valid_to, it.status_reason = "retired", now, reason
                it.version += 1
                it.updated_at = now
                changes.append(Change("retired", it.tenant, it, {"reason": reason}))
            self.ledger.commit(changes)
            n = len(changes)
            del changes, found  # freed before the collector resumes
            self.sync()
            return n

    def supersede(self, old_id: str, new_text: str | None = None, *, new_id: str | None = None,
                  tenant: str | None = None, **add_kw: Any) -> MemoryItem:
        """Close `old_id`'s validity interval and point it at its replacement (new or existing)."""
        with self._lock:
            old = self.get(old_id, tenant)
            if old.status not in ("candidate", "validated"):
                raise InvalidInput(f"item {old_id} is {old.status}; it cannot be superseded")
            if new_id is not None:
                new = self.get(new_id, old.tenant)
                new.supersedes.append(old.id)
                new.version += 1
                self.ledger.commit([ingest.superseded(old, new),
                                    Change("supersedes", new.tenant, new, {"old": old.id})])
            else:
                if not new_text:
                    raise InvalidInput("supersede needs new_text or new_id")
                new = ingest.new_item(tenant=old.tenant, text=new_text,
                                     kind=add_kw.pop("kind", old.kind), **add_kw)
                self.ledger.commit([ingest.superseded(old, new),
                                    Change("added", new.tenant, new, {"supersedes": old.id},
                                           new.provenance[0].trajectory_id, new.created_by_cycle)])
            self.sync()
            return new

    # ---- reads --------------------------------------------------------------------------
    def get(self, item_id: str, tenant: str | None = None) -> MemoryItem:
        it = self.ledger.get(item_id)
        if it is None or (tenant is not None and it.tenant != tenant):
            raise NotFound(f"unknown memory item {item_id!r}" + (f" for tenant {tenant!r}" if tenant else ""))
        return it

    def search(self, tenant: str, query: str, k: int = 5, *, kinds: list[str] | None = None,
               at: float | None = None, statuses: tuple[str, ...] = LIVE_STATUSES,
               graph: bool = True) -> list[Hit]:
        """Hybrid retrieval inside one tenant: vector + keyword + one-hop graph expansion,
        filtered by status and validity time (`at`, default now)."""
        if not isinstance(tenant, str) or not tenant:
            raise InvalidInput("tenant must be a non-empty string")
        if not isinstance(query, str) or not query.strip():
            raise InvalidInput("query must be a non-empty string")
        if kinds:
            bad = [x for x in kinds if x not in KINDS]
            if bad:
                raise InvalidInput(f"unknown kind(s) {bad}")
        self.sync()
        at = time.time() if at is None else at
        n = max(4 * k, 20)
        qv = self.embedder.query(query)
        vec = dict(self.vec.query(tenant, qv, n, kinds)[0])
        kw = dict(self.kw.query(tenant, query, n))
        gr: dict[str, float] = {}
        if graph:  # one hop from the query's own entities, and from the strongest hits'
            gr = self.graph.expand(tenant, set(extract_entities(query, {})), 1.0)
            top = [i for i in sorted(vec, key=lambda i: -vec[i])[:3] if vec[i] >= 0.3]
            top += [i for i in sorted(kw, key=lambda i: -kw[i])[:2] if kw[i] >= 0.3]
            for src in dict.fromkeys(top):
                ents = set(self.graph.entities_of(tenant, src))
                for iid, w in self.graph.expand(tenant, ents, 0.5).items():
                    if iid != src:
                        gr[iid] = max(gr.get(iid, 0.0), w)
        ids = set(vec) | set(kw) | set(gr)
        items = self.ledger.get_many(ids)
        hits = []
        for iid, it in items.items():
            if it.tenant != tenant or it.status not in statuses or not it.valid_at(at):
                continue
            if kinds and it.kind not in kinds:
                continue
            s = {"vector": vec.get(iid, 0.0), "keyword": kw.get(iid, 0.0), "graph": gr.get(iid, 0.0)}
            score = self.cfg.w_vector * s["vector"] + self.cfg.w_keyword * s["keyword"] \
                + self.cfg.w_graph * s["graph"]
            hits.append(Hit(item=it, score=score, scores=s, provenance=it.provenance))
        hits.sort(key=lambda h: (-h.score, h.item.id))
        return hits[:k]

    def history(self, item_id: str | None = None, *, tenant: str | None = None,
                limit: int = 200) -> list[HistoryEntry]:
        """An item's events (oldest first), or the ledger's latest events."""
        if item_id is not None:
            self.get(item_id, tenant)
            rows = self.ledger.events(EV.c.item_id == item_id)
        else:
            where = EV.c.tenant == tenant if tenant else None
            with self.ledger.engine.connect() as c:
                q = sa.select(EV).order_by(EV.c.seq.desc()).limit(limit)
                if where is not None:
                    q = q.where(where)
                rows = list(reversed(list(c.execute(q))))
        return [lifecycle.entry(r) for r in rows][-limit:]

    def explain(self, item_id: str, tenant: str | None = None) -> Explanation:
        """Why the memory holds this item: provenance, every event, its graph edges."""
        self.sync()
        it = self.get(item_id, tenant)
        hist = self.history(item_id, tenant=tenant, limit=10_000)
        merged = [h.data.get("duplicate_text", "") for h in hist if h.type == "merged"]
        return Explanation(item=it, provenance=it.provenance, history=hist,
                           edges=self.graph.edges(it.tenant, item_id), merged_from=merged,
                           superseded_by=it.superseded_by, supersedes=it.supersedes)

    def items(self, tenant: str, statuses: tuple[str, ...] = LIVE_STATUSES) -> list[MemoryItem]:
        return self.ledger.select_items(sa.and_(IT.c.tenant == tenant, IT.c.status.in_(statuses)),
                                        IT.c.created_seq)

    def stats(self, tenant: str | None = None) -> dict[str, Any]:
        self.sync()
        counts = self.ledger.count_items(tenant)
        g_nodes = sum(g.number_of_nodes() for t, g in self.graph.graphs.items() if tenant in (None, t))
        g_edges = sum(g.number_of_edges() for t, g in self.graph.graphs.items() if tenant in (None, t))
        with self.ledger.engine.connect() as c:
            q = sa.select(sa.func.count()).select_from(TR)
            ntraj = c.execute(q.where(TR.c.tenant == tenant) if tenant else q).scalar()
        return {"version": self.version, "items": sum(counts.values()), "by_status": counts,
                "tenants": self.ledger.tenants() if tenant is None else [tenant],
                "vectors": self.vec.count() if tenant is None else len(self.vec.ids(tenant)),
                "graph_nodes": g_nodes, "graph_edges": g_edges, "trajectories": int(ntraj or 0),
                "embedding_cache": self.ledger.count_cached(), "ledger": _safe_url(self.ledger.url)}

    # ---- lifecycle (memory/lifecycle.py) ------------------------------------------------
    def rollback(self, version: int | None = None, *, at: float | None = None,
                 tenant: str | None = None, reason: str = "") -> dict[str, Any]:
        return lifecycle.rollback(self, version, at=at, tenant=tenant, reason=reason)

    def retract_trajectory(self, trajectory_id: str, *, tenant: str | None = None,
                           reason: str = "") -> list[str]:
        return lifecycle.retract(self, trajectory_id=trajectory_id, tenant=tenant, reason=reason)

    def retract_cycle(self, cycle: str, *, reason: str = "") -> list[str]:
        return lifecycle.retract(self, cycle=cycle, reason=reason)

    def forget_tenant(self, tenant: str) -> dict[str, int]:
        return lifecycle.forget_tenant(self, tenant)

    # ---- trajectory log -----------------------------------------------------------------
    def record_trajectory(self, traj: Trajectory) -> int:
        """Store (or replace) a trajectory; its token ids and logprobs are kept exactly."""
        return lifecycle.record_trajectory(self, traj)

    def add_feedback(self, fb: Feedback, tenant: str | None = None) -> int:
        return lifecycle.add_feedback(self, fb, tenant)

    def get_trajectory(self, trajectory_id: str, tenant: str) -> Trajectory:
        with self.ledger.engine.connect() as c:
            row = self.ledger.trajectory_row(c, trajectory_id)
            if row is None or row.tenant != tenant:
                raise NotFound(f"unknown trajectory {trajectory_id!r} for tenant {tenant!r}")
            return self.ledger.load_trajectories([row], c)[0]

    def trajectories(self, tenant: str | None = None, after_cursor: int | None = None, *,
                     include_retracted: bool = False, limit: int | None = None) -> TrajectoryPage:
        """Trajectories recorded or given feedback after `after_cursor`, oldest first, and the
        cursor to pass next time (what the evolve cycle mines)."""
        after = int(after_cursor or 0)
        with self.ledger.engine.connect() as c:
            top = int(c.execute(sa.select(sa.func.max(EV.c.seq))).scalar() or 0)
            q = sa.select(TR).where(TR.c.seq > after, TR.c.seq <= top).order_by(TR.c.seq)
            if tenant is not None:
                q = q.where(TR.c.tenant == tenant)
            if not include_retracted:
                q = q.where(TR.c.retracted.is_(False))
            if limit:
                q = q.limit(limit)
            rows = list(c.execute(q))
            trajs = self.ledger.load_trajectories(rows, c)
        cursor = rows[-1].seq if (limit and len(rows) == limit) else max(top, after)
        return TrajectoryPage(trajs, cursor)

    def feedback_count(self, tenant: str) -> int:
        with self.ledger.engine.connect() as c:
            return int(c.execute(sa.select(sa.func.count()).select_from(FB)
                                 .where(FB.c.tenant == tenant)).scalar() or 0)


def _safe_url(url: str) -> str:
    return sa.engine.make_url(url).render_as_string(hide_password=True)
