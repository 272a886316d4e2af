"""Projections kept in memory beside chromadb: the vector live set (status changes reach search
without a chromadb write) and the graph checkpoint (only changed tenants re-serialised).
Each must follow every ledger path: retire, retract, rollback, forget, another service's writes."""
from __future__ import annotations

import numpy as np

from memory import projections
from memory.projections import GraphProjection

PRODUCTS = ["kettle", "laptop", "sofa", "lamp", "bike", "router", "jacket", "camera", "desk",
            "phone", "tent", "drill"]
KINDS = ["task_experience", "strategy", "tool_knowledge"]


def _fill(svc, tenant: str) -> list:
    specs = [{"tenant": tenant, "text": f"Order O-{100 + i} for a {p} was delivered late after "
                                        f"{i + 2} days", "kind": KINDS[i % 3],
              "trajectory_id": f"{tenant}-traj-{i // 4}", "step": i}
             for i, p in enumerate(PRODUCTS)]
    return svc.add_many(specs)


def _nearest(svc, tenant: str, text: str, kinds=None) -> list[str]:
    svc.sync()
    return [i for i, _ in svc.vec.query(tenant, svc.embedder.query(text), 50, kinds)[0]]


def _results(svc, tenant: str) -> list:
    return [[(h.item.id, round(h.score, 6)) for h in svc.search(tenant, q, k=5)]
            for q in ("late kettle order", "delivered after 7 days", "O-105")]


def test_live_set_follows_retire_retract_rollback_and_forget(svc):
    alice, bob = _fill(svc, "alice"), _fill(svc, "bob")  # same texts, two tenants
    ids = {it.id for it in alice}
    assert set(_nearest(svc, "alice", "late delivery")) == ids
    v, before = svc.version, _results(svc, "alice")
    retired = {it.id for it in alice[:3]}
    svc.retire_many(list(retired), "test")
    retracted = set(svc.retract_trajectory("alice-traj-1"))
    assert len(retracted) == 4 and svc.ledger.linked_items(trajectory_id="alice-traj-1") == []
    gone = retired | retracted
    assert not gone & set(_nearest(svc, "alice", "late delivery"))
    assert set(svc.vec.ids("alice")) == ids - gone
    assert not gone & {h.item.id for r in range(3) for h in svc.search("alice", alice[r].text, k=12)}
    assert set(_nearest(svc, "bob", "late delivery")) == {it.id for it in bob}  # untouched
    svc.rollback(v)
    assert set(_nearest(svc, "alice", "late delivery")) == ids
    assert _results(svc, "alice") == before
    assert set(svc.ledger.linked_items(trajectory_id="alice-traj-1")) == retracted  # links back
    svc.forget_tenant("bob")
    assert _nearest(svc, "bob", "late delivery") == [] and svc.vec.ids("bob") == []
    assert "bob" not in svc.vec.live and "bob" not in svc.vec.hashes
    assert set(svc.vec.ids("alice")) == ids


def test_overfetch_and_allowlist_paths_agree(svc, monkeypatch):
    alice = _fill(svc, "alice")
    svc.retire_many([it.id for it in alice[::2]], "test")  # dead vectors near every query
    q = "order delivered late after some days"
    over = _nearest(svc, "alice", q)
    by_kind = _nearest(svc, "alice", q, ["strategy"])
    assert over and not {it.id for it in alice[::2]} & set(over)
    monkeypatch.setattr(projections, "UNFILTERED_MAX", 0)  # force the id allowlist
    assert _nearest(svc, "alice", q) == over
    assert _nearest(svc, "alice", q, ["strategy"]) == by_kind
    assert {svc.get(i).kind for i in by_kind} == {"strategy"}


def test_other_service_sees_status_changes_and_reopen_needs_no_rebuild(open_service):
    s1 = open_service()
    items = _fill(s1, "alice")
    s2 = open_service()
    assert set(_nearest(s2, "alice", "late delivery")) == {it.id for it in items}
    v = s1.version
    s1.retire_many([items[0].id, items[1].id], "test")
    assert not {items[0].id, items[1].id} & set(_nearest(s2, "alice", "late delivery"))
    s1.rollback(v)
    assert set(_nearest(s2, "alice", "late delivery")) == {it.id for it in items}
    s1.retire(items[2].id, "test")
    s1.close()
    s2.close()
    s3 = open_service()
    assert s3.notices == []  # the live set comes from the ledger, the vectors stay valid
    assert sorted(s3.vec.ids("alice")) == sorted(it.id for it in items[:2] + items[3:])


def test_graph_checkpoint_round_trips_after_changes_to_one_tenant(open_service):
    svc = open_service()
    a = svc.add("alice", "Order O-1 belongs to user U-1", trajectory_id="t1",
                relations=[("id:O-1", "owned_by", "id:U-1")])
    svc.add("alice", "Order O-2 was refunded to U-1", trajectory_id="t2")
    svc.add("bob", "Order O-9 belongs to user U-9", trajectory_id="t3")
    svc.add("carol", "Order O-5 was lost", trajectory_id="t4")
    path = svc.graph.path
    svc.graph.save(svc.version)
    svc.retire(a.id, "test")  # alice changes; bob's saved JSON is reused
    svc.forget_tenant("carol")
    svc.sync()
    svc.graph.save(svc.version)
    loaded = GraphProjection(path, [])
    assert loaded.last_seq == svc.version and set(loaded.graphs) == {"alice", "bob"}
    for t in ("alice", "bob"):
        assert sorted(map(str, loaded.edges(t))) == sorted(map(str, svc.graph.edges(t)))
    assert not [e for e in loaded.edges("alice") if e["item"] == a.id]


def test_query_embedding_leaves_the_callers_torch_threads_alone():
    import torch

    from memory.embeddings import SMALL_BATCH, encode

    texts = [f"late delivery of order O-{i}" for i in range(SMALL_BATCH + 4)]
    n = torch.get_num_threads()
    small = encode(texts[:3])  # on the one-thread worker
    assert torch.get_num_threads() == n
    big = encode(texts)  # in this thread
    assert np.allclose(small, big[:3], atol=1e-5)
