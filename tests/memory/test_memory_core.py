"""Core memory behaviour on SQLite and Postgres: add/search, provenance, tenants, trajectory log."""
from __future__ import annotations

import pytest

from dynamic_bench.schema import Feedback, Step, Trajectory
from memory import InvalidInput, NotFound

NOTES = [
    ("Refunds for gold members are allowed within 30 days of delivery", "strategy"),
    ("The get_order tool needs the order_id argument", "tool_knowledge"),
    ("Alice prefers replies in French", "user_preference"),
    ("Order O-1042 was delivered late and refunded", "task_experience"),
]


def _fill(svc, tenant="alice", traj="traj-a"):
    return [svc.add(tenant, t, kind=k, trajectory_id=traj, step=i, evidence=f"step {i}: {t}")
            for i, (t, k) in enumerate(NOTES)]


def test_add_and_search_returns_scores_and_provenance(svc):
    items = _fill(svc)
    hits = svc.search("alice", "how many days do gold members have for a refund?", k=2)
    assert hits[0].item.id == items[0].id
    assert hits[0].score > hits[1].score
    assert hits[0].scores["vector"] > 0.4
    assert hits[0].provenance[0].trajectory_id == "traj-a" and hits[0].provenance[0].step == 0
    kw = svc.search("alice", "get_order order_id", k=1)
    assert kw[0].item.id == items[1].id and kw[0].scores["keyword"] > 0
    only = svc.search("alice", "refund", k=5, kinds=["user_preference"])
    assert {h.item.kind for h in only} == {"user_preference"}


def test_provenance_on_every_item_and_every_graph_edge(svc):
    items = _fill(svc)
    rel = svc.add("alice", "Order O-7 belongs to user U-3", trajectory_id="traj-b", step=4,
                  evidence="get_order returned user U-3", relations=[("id:O-7", "owned_by", "id:U-3")])
    for it in items + [rel]:
        ex = svc.explain(it.id)
        assert ex.provenance and all(p.trajectory_id for p in ex.provenance)
        assert ex.history[0].type == "added"
    edges = svc.graph.edges("alice")
    assert edges, "the graph has edges"
    for e in edges:
        assert e["item"] and e["trajectory_id"] and e["step"] is not None and e["evidence"]
    rel_edges = [e for e in edges if e["rel"] == "owned_by"]
    assert rel_edges == [e for e in svc.explain(rel.id).edges if e["rel"] == "owned_by"]
    assert rel_edges[0]["trajectory_id"] == "traj-b" and rel_edges[0]["step"] == 4


def test_graph_expansion_finds_items_sharing_an_entity(svc):
    a = svc.add("alice", "Customer U-9 asked for a refund on order O-55", trajectory_id="t1")
    b = svc.add("alice", "Shipping label for O-55 was printed twice", trajectory_id="t2")
    hits = {h.item.id: h for h in svc.search("alice", "what happened with O-55?", k=5)}
    assert hits[a.id].scores["graph"] == 1.0 and hits[b.id].scores["graph"] == 1.0
    plain = {h.item.id for h in svc.search("alice", "what happened with O-55?", k=5, graph=False)}
    assert all(h.scores["graph"] == 0 for h in svc.search("alice", "O-55", k=5, graph=False))
    assert plain <= set(hits)


def test_tenant_a_never_sees_tenant_b(svc):
    secret = svc.add("bob", "Bob's door code is 4411 and he likes jazz", kind="user_preference",
                     trajectory_id="traj-bob")
    t = Trajectory(task_id="task-1", tenant="bob", steps=[Step(index=0, action_text="reply {}")])
    svc.record_trajectory(t)
    _fill(svc, "alice")
    for q in ("door code", "Bob's door code is 4411 and he likes jazz", "jazz 4411"):
        assert all(h.item.tenant == "alice" for h in svc.search("alice", q, k=10))
    assert svc.search("carol", "door code", k=10) == []
    with pytest.raises(NotFound):
        svc.get(secret.id, tenant="alice")
    with pytest.raises(NotFound):
        svc.explain(secret.id, tenant="alice")
    with pytest.raises(NotFound):
        svc.get_trajectory(t.id, "alice")
    assert svc.trajectories(tenant="alice").trajectories == []
    assert secret.id not in svc.vec.ids("alice")
    assert not any(e["item"] == secret.id for e in svc.graph.edges("alice"))
    assert svc.kw.query("alice", "door code jazz", 10) == []


def test_trajectory_log_is_exact_and_cursored(svc):
    lp = [-0.1234567890123456, -1e-12, -7.25, -3.3333333333333335]
    t1 = Trajectory(task_id="task-1", tenant="alice", steps=[
        Step(index=0, prompt_token_ids=[5, 6, 7], completion_token_ids=[8, 9, 10, 11],
             behaviour_logprobs=lp, policy_version="pv-1", action_text='get_order {"order_id":"O-1"}')],
        outcome="success", reward=1.0)
    c0 = svc.trajectories().cursor
    svc.record_trajectory(t1)
    svc.add_feedback(Feedback(trajectory_id=t1.id, step=0, kind="approve"))
    got = svc.get_trajectory(t1.id, "alice")
    assert got.steps[0].behaviour_logprobs == lp  # bit-exact floats
    assert got.steps[0].prompt_token_ids == [5, 6, 7] and got.steps[0].completion_token_ids == [8, 9, 10, 11]
    assert [f.kind for f in got.feedback] == ["approve"]
    page = svc.trajectories(after_cursor=c0)
    assert [t.id for t in page.trajectories] == [t1.id]
    assert svc.trajectories(after_cursor=page.cursor).trajectories == []
    svc.add_feedback(Feedback(trajectory_id=t1.id, step=0, kind="edit", payload={"text": "x"}))
    again = svc.trajectories(after_cursor=page.cursor)
    assert [t.id for t in again.trajectories] == [t1.id]
    assert [f.kind for f in again.trajectories[0].feedback] == ["approve", "edit"]
    t1.outcome = "failure"
    svc.record_trajectory(t1)  # re-recording replaces, keeps feedback
    assert svc.get_trajectory(t1.id, "alice").outcome == "failure"
    assert len(svc.get_trajectory(t1.id, "alice").feedback) == 2


def test_bad_input_is_a_clear_error_and_writes_nothing(svc):
    v = svc.version
    with pytest.raises(InvalidInput, match="kind"):
        svc.add("alice", "x", kind="gossip")
    with pytest.raises(InvalidInput, match="text"):
        svc.add("alice", "   ")
    with pytest.raises(InvalidInput, match="tenant"):
        svc.add("", "hello")
    with pytest.raises(InvalidInput, match="relations"):
        svc.add("alice", "hello", relations=[("a", "b")])
    with pytest.raises(InvalidInput):
        svc.add_many([{"tenant": "alice", "text": "fine"}, {"tenant": "alice", "text": ""}])
    with pytest.raises(NotFound, match="unknown memory item"):
        svc.record_outcome("mem-nope", True)
    with pytest.raises(NotFound, match="record it before"):
        svc.add_feedback(Feedback(trajectory_id="traj-nope", kind="approve"))
    with pytest.raises(InvalidInput):
        svc.search("alice", "")
    assert svc.version == v and svc.items("alice") == []


def test_reopen_catches_up_and_keeps_everything(open_service):
    s1 = open_service()
    items = _fill(s1)
    s1.close()
    s2 = open_service()
    assert sorted(s2.vec.ids("alice")) == sorted(i.id for i in items)
    assert s2.search("alice", "French replies", k=1)[0].item.id == items[2].id
    assert s2.embedder.misses == 0  # nothing re-embedded on reopen


def test_two_services_on_one_data_dir_in_one_process(tmp_path):
    from memory import MemoryService

    a = MemoryService(tmp_path / "mem")
    b = MemoryService(tmp_path / "mem")
    it = a.add("alice", "Shared memories are visible to every service on the same ledger")
    assert b.search("alice", "shared memories ledger", k=1)[0].item.id == it.id
    a.close()  # closing one must not break the other
    it2 = b.add("alice", "The second service keeps working after the first closed")
    assert b.search("alice", "second service keeps working", k=1)[0].item.id == it2.id
    b.close()
