"""Projections of the ledger: the chromadb vector collection, the networkx graph, a keyword index.

Each projection is told "these items changed; here is their current state (None: gone)" and makes
itself agree, idempotently. Each records the last ledger seq it applied, so on open the service
only replays what it missed. One chromadb collection and one graph per tenant: the tenant
partition is structural, not a filter someone can forget.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from memory.models import LIVE_STATUSES, MemoryItem
from memory.text import extract_entities, terms, text_hash

log = logging.getLogger("memory")
META = "evolve_meta"
UNFILTERED_MAX = 500  # over-fetch at most this many results rather than pass an id allowlist


def collection_name(tenant: str) -> str:
    return "t_" + hashlib.sha1(tenant.encode()).hexdigest()[:24]


def _meta(it: MemoryItem) -> dict[str, Any]:
    return {"kind": it.kind, "h": text_hash(it.text)}


def release_chroma(path: Path) -> None:
    """Forget chromadb's in-process system for `path` (it caches one per persist directory), so
    the next client really reopens the files (after a close, a delete or a corruption)."""
    from chromadb.api.shared_system_client import SharedSystemClient
    system = SharedSystemClient._identifier_to_system.pop(str(path), None)
    SharedSystemClient._identifier_to_refcount.pop(str(path), None)
    if system is not None:
        try:
            system.stop()
        except Exception:  # noqa: BLE001 - best effort: the files may already be gone
            pass


class VectorProjection:
    """Per-tenant chromadb collections (embeddings come from the cache), plus which of their
    vectors are live.

    Liveness is not a chromadb metadata flag: a status change (retire, retract, rollback) costs
    no chromadb write at all, and a query is restricted by id instead of by a metadata `where`
    (at 10k vectors `where` costs ~55 ms a query, an unfiltered query ~1 ms, an id allowlist ~3 ms).
    `live` (tenant -> {id: kind}) and `hashes` (tenant -> {id: text hash of its stored vector})
    live in memory: `live_seq` starts at 0 on open, so the first sync rebuilds them from the
    ledger, and every later sync applies the same changes it applies to chromadb.
    """

    def __init__(self, path: Path | None, http_url: str | None, notices: list[str]):
        self.path, self.http_url, self.notices = path, http_url, notices
        self._cols: dict[str, Any] = {}
        self.live: dict[str, dict[str, str]] = {}
        self.hashes: dict[str, dict[str, str]] = {}
        self.live_seq = 0
        self.fresh = path is not None and not (path / "chroma.sqlite3").exists()
        self.client = self._open()
        self.meta = self.client.get_or_create_collection(META, embedding_function=self._ef())
        self.last_seq = int((self.meta.metadata or {}).get("last_seq", 0))

    @staticmethod
    def _ef() -> Any:
        from memory.embeddings import MiniLMEmbedding
        return MiniLMEmbedding()

    def _open(self) -> Any:
        import chromadb
        from chromadb.config import Settings
        settings = Settings(anonymized_telemetry=False, allow_reset=True)
        if self.http_url:
            from urllib.parse import urlparse
            u = urlparse(self.http_url)
            return chromadb.HttpClient(host=u.hostname or "127.0.0.1", port=u.port or 8000,
                                       ssl=u.scheme == "https", settings=settings)
        if self.path is None:  # no data dir (e.g. a Postgres ledger): a private temporary store
            import tempfile
            self.path = Path(tempfile.mkdtemp(prefix="evolve-chroma-"))
        if self.fresh:
            release_chroma(self.path)  # chromadb caches a system per path: drop a deleted one
        try:
            client = chromadb.PersistentClient(path=str(self.path), settings=settings)
            meta = client.get_or_create_collection(META, embedding_function=self._ef())
            for c in client.list_collections():  # touch every collection: unreadable -> rebuild
                if c.name != META:
                    client.get_collection(c.name, embedding_function=self._ef()).count()
            meta.count()
            return client
        except Exception as e:  # noqa: BLE001 - any failure to read the files means rebuild
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            msg = (f"vector projection at {self.path} is unreadable ({type(e).__name__}: "
                   f"{str(e)[:120]}); moved it to {aside.name} and rebuilding it from the ledger")
            log.warning(msg)
            self.notices.append(msg)
            release_chroma(self.path)
            if self.path.exists():
                shutil.move(str(self.path), str(aside))
            return chromadb.PersistentClient(path=str(self.path), settings=settings)

    def col(self, tenant: str, create: bool = True) -> Any:
        if tenant not in self._cols:
            name = collection_name(tenant)
            if create:
                self._cols[tenant] = self.client.get_or_create_collection(
                    name, embedding_function=self._ef(), metadata={"tenant": tenant},
                    configuration={"hnsw": {"space": "cosine"}})
            else:
                try:
                    self._cols[tenant] = self.client.get_collection(name, embedding_function=self._ef())
                except Exception:  # noqa: BLE001 - chromadb raises various "not found" errors
                    return None
        return self._cols[tenant]

    def apply(self, tenant: str, items: dict[str, MemoryItem | None], vectors: Any) -> None:
        """Make the tenant's collection and live set agree with `items`.

        Live items have a vector of their current text; retracted/retired ones keep theirs (a
        rollback brings them back without re-inserting: chromadb re-inserts ~50x slower than it
        skips) but leave the live set. Items gone from the ledger (a forgotten tenant) are
        physically deleted.
        """
        col = self.col(tenant)
        live, hashes = self.live.setdefault(tenant, {}), self.hashes.setdefault(tenant, {})
        unknown = [i for i in items if i not in hashes]  # maybe written by another process
        for i in range(0, len(unknown), 5000):
            got = col.get(ids=unknown[i:i + 5000], include=["metadatas"])
            hashes.update({k: (m or {}).get("h", "") for k, m in zip(got["ids"], got["metadatas"])})
        up, gone = [], []
        for iid, it in items.items():
            if it is None or it.status not in LIVE_STATUSES:
                live.pop(iid, None)
                if it is None and iid in hashes:
                    gone.append(iid)
                continue
            live[iid] = it.kind
            if hashes.get(iid) != text_hash(it.text):
                up.append(it)
        for i in range(0, len(gone), 5000):
            col.delete(ids=gone[i:i + 5000])
        for iid in gone:
            del hashes[iid]
        if up:
            vecs = vectors([it.text for it in up])
            for i in range(0, len(up), 5000):
                part = up[i:i + 5000]
                col.upsert(ids=[it.id for it in part], embeddings=vecs[i:i + 5000],
                           metadatas=[_meta(it) for it in part])
            hashes.update({it.id: text_hash(it.text) for it in up})

    def drop_tenant(self, tenant: str) -> None:
        self._cols.pop(tenant, None)
        self.live.pop(tenant, None)
        self.hashes.pop(tenant, None)
        try:
            self.client.delete_collection(collection_name(tenant))
        except Exception:  # noqa: BLE001 - already absent
            pass

    def query(self, tenant: str, vecs: np.ndarray, n: int, kinds: list[str] | None = None
              ) -> list[list[tuple[str, float]]]:
        """The `n` nearest live vectors (of `kinds`) to each row of `vecs`: (id, cosine).

        Few dead vectors: one unfiltered query over-fetching by their number, dead ones dropped
        (exact: at most that many can precede the n-th live one). Otherwise, or with `kinds`, an
        id allowlist."""
        vecs = np.atleast_2d(vecs)
        live = self.live.get(tenant)
        col = self.col(tenant, create=False) if live else None
        if col is None:
            return [[] for _ in vecs]
        dead = len(self.hashes.get(tenant, {})) - len(live)
        if not kinds and dead + n <= UNFILTERED_MAX:
            r = col.query(query_embeddings=vecs, n_results=n + max(dead, 0), include=["distances"])
        else:
            # list(): one step under the GIL; a writer's sync may change `live` (search is unlocked)
            allow = [i for i, k in list(live.items()) if not kinds or k in kinds]
            if not allow:
                return [[] for _ in vecs]
            r = col.query(query_embeddings=vecs, n_results=min(n, len(allow)), ids=allow,
                          include=["distances"])
        return [[(i, 1.0 - float(d)) for i, d in zip(ids, ds) if i in live][:n]
                for ids, ds in zip(r["ids"], r["distances"])]

    def ids(self, tenant: str) -> list[str]:
        """Ids a query can return: live items whose vector chromadb really holds."""
        col = self.col(tenant, create=False)
        live = self.live.get(tenant, {})
        return [] if col is None else [i for i in col.get(include=[])["ids"] if i in live]

    def count(self) -> int:
        """Live vectors over all tenants."""
        n = 0
        for c in self.client.list_collections():
            tenant = (c.metadata or {}).get("tenant")
            if c.name != META and tenant is not None:
                n += len(self.ids(tenant))
        return n

    def close(self) -> None:
        """Release this client; chromadb stops the shared system when its last client closes."""
        self._cols.clear()
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - already closed
            pass

    def set_last_seq(self, seq: int) -> None:
        self.meta.modify(metadata={"last_seq": int(seq)})
        self.last_seq = seq

    def reset(self) -> None:
        for c in self.client.list_collections():
            if c.name != META:
                self.client.delete_collection(c.name)
        self._cols.clear()
        self.live, self.hashes, self.live_seq = {}, {}, 0
        self.set_last_seq(0)


class GraphProjection:
    """Per-tenant knowledge graphs: item nodes, entity nodes, and edges that carry provenance.

    Edges: item -> entity ("mentions") and entity -> entity (the item's relations). Every edge
    records the item and the trajectory/step/evidence it came from, so removing an item removes
    exactly its edges, and entities left with no edges are pruned (no orphans after a delete).
    """

    def __init__(self, path: Path | None, notices: list[str]):
        self.path, self.notices = path, notices
        self.graphs: dict[str, nx.MultiDiGraph] = {}
        self._rel: dict[tuple[str, str], list[tuple[str, str, str]]] = {}  # item -> relation edges
        self.last_seq = 0
        self.dirty = 0
        self._json: dict[str, str] = {}  # tenant -> its graph as saved last (clean tenants)
        if path is not None and path.exists():
            try:
                raw = json.loads(path.read_text())
                self.last_seq = int(raw["last_seq"])
                self.graphs = {t: nx.node_link_graph(g, directed=True, multigraph=True, edges="edges")
                               for t, g in raw["tenants"].items()}
                for t, g in self.graphs.items():
                    for u, v, k, d in g.edges(keys=True, data=True):
                        if d.get("rel") != "mentions":
                            self._rel.setdefault((t, d["item"]), []).append((u, v, k))
            except Exception as e:  # noqa: BLE001 - any unreadable file means rebuild
                msg = (f"graph projection at {path} is unreadable ({type(e).__name__}: "
                       f"{str(e)[:120]}); rebuilding it from the ledger")
                log.warning(msg)
                self.notices.append(msg)
                self.graphs, self.last_seq = {}, 0
        elif path is not None and path.with_name(path.name + ".seen").exists():
            msg = f"graph projection file {path} is missing; rebuilding it from the ledger"
            log.warning(msg)
            self.notices.append(msg)

    def g(self, tenant: str) -> nx.MultiDiGraph:
        return self.graphs.setdefault(tenant, nx.MultiDiGraph())

    def apply(self, tenant: str, items: dict[str, MemoryItem | None]) -> None:
        items = {i: (it if it is not None and it.status in LIVE_STATUSES else None)
                 for i, it in items.items()}
        g = self.g(tenant)
        self._json.pop(tenant, None)
        touched_entities: set[str] = set()
        for iid, item in items.items():
            node = f"item:{iid}"
            if g.has_node(node):
                touched_entities.update(v for _, v in g.out_edges(node))
                g.remove_node(node)
            for u, v, k in self._rel.pop((tenant, iid), []):
                touched_entities.update((u, v))
                if g.has_edge(u, v, k):
                    g.remove_edge(u, v, k)
            if item is None:
                continue
            prov = item.provenance[0] if item.provenance else None
            pv = {"trajectory_id": prov.trajectory_id if prov else None,
                  "step": prov.step if prov else None,
                  "evidence": (prov.evidence if prov else "")[:200], "item": iid}
            g.add_node(node, kind="item", item_kind=item.kind)
            for ent in item.entities or extract_entities(item.text, item.payload):
                if ent not in g:  # networkx's add_node also rewrites existing attributes
                    g.add_node(ent, kind="entity")
                g.add_edge(node, ent, key=f"m:{iid}", rel="mentions", **pv)
            for s, rel, o in item.relations:
                for ent in (s, o):
                    if ent not in g:
                        g.add_node(ent, kind="entity")
                g.add_edge(s, o, key=f"r:{iid}:{rel}", rel=rel, **pv)
                self._rel.setdefault((tenant, iid), []).append((s, o, f"r:{iid}:{rel}"))
        for ent in touched_entities:
            if g.has_node(ent) and g.degree(ent) == 0:
                g.remove_node(ent)
        self.dirty += len(items)

    def drop_tenant(self, tenant: str) -> None:
        self.graphs.pop(tenant, None)
        self._json.pop(tenant, None)
        self._rel = {k: v for k, v in self._rel.items() if k[0] != tenant}
        self.dirty += 1

    def entities_of(self, tenant: str, item_id: str) -> list[str]:
        g = self.graphs.get(tenant)
        node = f"item:{item_id}"
        return [] if g is None or not g.has_node(node) else [v for _, v in g.out_edges(node)]

    def expand(self, tenant: str, seeds: set[str], weight: float = 1.0,
               max_degree: int = 50) -> dict[str, float]:
        """Items that mention a seed entity (`weight`) or an entity one relation away (half)."""
        g = self.graphs.get(tenant)
        if g is None:
            return {}
        seeds = {s for s in seeds if g.has_node(s)}
        hop = set()
        for s in seeds:
            for n in list(g.successors(s))[:max_degree] + list(g.predecessors(s))[:max_degree]:
                if not n.startswith("item:"):
                    hop.add(n)
        out: dict[str, float] = {}
        for ents, w in ((hop - seeds, weight / 2), (seeds, weight)):
            for e in ents:
                if g.in_degree(e) > max_degree:  # hub entities (a tool everyone uses) say little
                    continue
                for u in g.predecessors(e):
                    if u.startswith("item:"):
                        out[u[5:]] = max(out.get(u[5:], 0.0), w)
        return out

    def edges(self, tenant: str, item_id: str | None = None) -> list[dict[str, Any]]:
        g = self.graphs.get(tenant)
        if g is None:
            return []
        return [{"src": u, "dst": v, **d} for u, v, d in g.edges(data=True)
                if item_id is None or d.get("item") == item_id]

    def save(self, seq: int) -> None:
        self.last_seq = seq
        if self.path is None:
            return
        for t, g in self.graphs.items():  # only tenants changed since the last save
            if t not in self._json:
                self._json[t] = json.dumps(nx.node_link_data(g, edges="edges"))
        tenants = ", ".join(f"{json.dumps(t)}: {self._json[t]}" for t in self.graphs)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f'{{"last_seq": {int(seq)}, "tenants": {{{tenants}}}}}')
        os.replace(tmp, self.path)  # atomic: a crash leaves the old file or the new one
        self.path.with_name(self.path.name + ".seen").touch()
        self.dirty = 0

    def reset(self) -> None:
        self.graphs, self._rel, self._json, self.last_seq = {}, {}, {}, 0


class KeywordIndex:
    """In-memory inverted index per tenant (BM25-style idf weights), rebuilt from the ledger on open."""

    def __init__(self) -> None:
        self.post: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.doc_terms: dict[str, dict[str, list[str]]] = defaultdict(dict)

    def apply(self, tenant: str, items: dict[str, MemoryItem | None]) -> None:
        items = {i: (it if it is not None and it.status in LIVE_STATUSES else None)
                 for i, it in items.items()}
        post, docs = self.post[tenant], self.doc_terms[tenant]
        for iid, item in items.items():
            for t in docs.pop(iid, []):
                s = post.get(t)
                if s is not None:
                    s.discard(iid)
                    if not s:
                        del post[t]
            if item is not None:
                ts = sorted(set(terms(item.text)))
                docs[iid] = ts
                for t in ts:
                    post[t].add(iid)

    def drop_tenant(self, tenant: str) -> None:
        self.post.pop(tenant, None)
        self.doc_terms.pop(tenant, None)

    def query(self, tenant: str, text: str, n: int) -> list[tuple[str, float]]:
        if tenant not in self.post:
            return []
        post, ndocs = self.post[tenant], max(1, len(self.doc_terms[tenant]))
        scores: dict[str, float] = defaultdict(float)
        qterms = set(terms(text))
        total = 0.0
        for t in qterms:
            ids = post.get(t)
            if not ids or len(ids) > 0.2 * ndocs + 50:  # near-stopwords carry no signal
                continue
            w = math.log(1 + ndocs / len(ids))
            total += w
            for i in tuple(ids):  # a writer's sync may change the set meanwhile
                scores[i] += w
        if not scores:
            return []
        best = sorted(scores.items(), key=lambda kv: -kv[1])[:n]
        norm = sum(math.log(1 + ndocs) for _ in qterms) or 1.0
        return [(i, min(1.0, s / norm)) for i, s in best]
