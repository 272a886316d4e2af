"""Rollback, retraction (by trajectory and by cycle) and forgetting a tenant."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from dynamic_bench.schema import Feedback, Trajectory
from memory import InvalidInput, NotFound

QUERIES = ["refund window for gold members", "which tool cancels orders", "user language preference",
           "late delivery of order O-77"]


def _results(svc, tenant="alice"):
    return [[(h.item.id, h.item.status, h.item.text, round(h.score, 6)) for h in svc.search(tenant, q, k=4)]
            for q in QUERIES]


def test_rollback_to_a_version_restores_exactly_the_earlier_search_results(svc):
    a = svc.add("alice", "Gold members may get refunds within 30 days", kind="strategy",
                trajectory_id="t1", payload={"subject": "refund_window"})
    svc.add("alice", "cancel_order cancels an order and needs a reason", kind="tool_knowledge",
            trajectory_id="t2")
    svc.add("alice", "Alice wants answers in German", kind="user_preference", trajectory_id="t3")
    svc.record_outcome(a.id, True, "t4")
    v = svc.version
    before = _results(svc)
    # a burst of changes: new items, a supersession, a retirement, outcomes, a retraction
    svc.add("alice", "Gold members may get refunds within 14 days", kind="strategy",
            trajectory_id="t5", payload={"subject": "refund_window"})
    svc.add("alice", "Order O-77 arrived late; apologise and refund shipping", trajectory_id="t6")
    pref = [i for i in svc.items("alice") if i.kind == "user_preference"][0]
    svc.retire(pref.id, "test")
    svc.add("alice", "Alice wants answers in Spanish", kind="user_preference", trajectory_id="t7")
    assert _results(svc) != before
    out = svc.rollback(v)
    assert out["to_version"] == v and out["items"] == 5
    assert _results(svc) == before
    assert sorted(svc.vec.ids("alice")) == sorted(i.id for i in svc.items("alice"))
    # the rollback is itself history: nothing was deleted from the log
    assert svc.version > v and any(h.type == "rolled_back" for h in svc.history(a.id))
    with pytest.raises(NotFound, match="unknown ledger version"):
        svc.rollback(svc.version + 100)
    with pytest.raises(InvalidInput):
        svc.rollback()


def test_rollback_to_a_point_in_time(svc):
    a = svc.add("alice", "Always confirm the shipping address", kind="strategy", trajectory_id="t1")
    time.sleep(0.05)
    t = time.time()
    time.sleep(0.05)
    b = svc.add("alice", "Never confirm anything twice", kind="strategy", trajectory_id="t2")
    svc.rollback(at=t)
    assert svc.get(b.id).status == "retracted" and svc.get(a.id).status == "candidate"
    assert [h.item.id for h in svc.search("alice", "confirm", k=5)] == [a.id]


def test_retract_trajectory_leaves_zero_hits_in_vector_graph_and_search(svc):
    bad = [svc.add("alice", t, trajectory_id="traj-bad", step=i,
                   relations=[("id:O-5", "refunded_by", "id:U-5")] if i == 0 else None)
           for i, t in enumerate(["Order O-5 was refunded by agent U-5 without approval",
                                  "Skip identity checks for VIP users"])]
    shared = svc.add("alice", "Verify identity before changing the address", trajectory_id="traj-good")
    svc.add("alice", "verify identity before changing the address", trajectory_id="traj-bad")  # merges
    keep = svc.add("alice", "Gold members have a 30 day refund window", trajectory_id="traj-good")
    tr = Trajectory(id="traj-bad", task_id="x", tenant="alice")
    svc.record_trajectory(tr)
    gone = svc.retract_trajectory("traj-bad", reason="reviewer found it wrong")
    assert sorted(gone) == sorted(b.id for b in bad)
    ids = {b.id for b in bad}
    vec_ids = set(svc.vec.ids("alice"))
    assert not ids & vec_ids and keep.id in vec_ids and shared.id in vec_ids
    assert not [e for e in svc.graph.edges("alice") if e["item"] in ids]
    assert not [e for e in svc.graph.edges("alice") if e["trajectory_id"] == "traj-bad"]
    assert "id:U-5" not in svc.graph.g("alice")  # no orphan entity left
    for q in ["O-5 refunded", "identity checks VIP", "Skip identity checks for VIP users"]:
        assert not ids & {h.item.id for h in svc.search("alice", q, k=10)}
    # the merged item stays, supported by the good trajectory only
    assert [p.trajectory_id for p in svc.get(shared.id).provenance] == ["traj-good"]
    assert svc.trajectories(tenant="alice").trajectories == []  # not mined again
    with pytest.raises(NotFound):
        svc.retract_trajectory("traj-never")


def test_retract_one_item_stops_its_recall_and_keeps_its_history(svc):
    wrong = svc.add("alice", "When you would escalate a refund, users replace refund instead", trajectory_id="t1")
    keep = svc.add("alice", "Refunds over 150 must now be escalated", trajectory_id="t2")
    out = svc.retract(wrong.id, "the window approved escalations too", tenant="alice")
    assert out.status == "retracted" and out.status_reason == "the window approved escalations too"
    assert wrong.id not in {h.item.id for h in svc.search("alice", "escalate a refund", k=10)}
    assert set(svc.vec.ids("alice")) == {keep.id}
    v = svc.version
    assert svc.retract(wrong.id, "again", tenant="alice").status_reason == "the window approved escalations too"
    assert svc.version == v  # a second retraction changes nothing
    assert [h.type for h in svc.history(wrong.id)][-1] == "retracted"
    with pytest.raises(NotFound):
        svc.retract(wrong.id, "other tenant", tenant="bob")


def test_retract_cycle_cascades(svc):
    made = [svc.add("alice", t, cycle="cycle-7", source="evolve", kind="strategy")
            for t in ["Prefer store credit over refunds", "Escalate orders above 900 dollars"]]
    other = svc.add("alice", "Greet the user by name", kind="strategy", cycle="cycle-6")
    gone = svc.retract_cycle("cycle-7")
    assert sorted(gone) == sorted(m.id for m in made)
    assert set(svc.vec.ids("alice")) == {other.id}
    with pytest.raises(NotFound):
        svc.retract_cycle("cycle-404")


def test_forget_tenant_leaves_nothing_behind(svc):
    secret = "Bob's passport number is XK4471192 and he lives at 9 Elm Street"
    b = svc.add("bob", secret, kind="user_preference", trajectory_id="traj-bob",
                relations=[("user:bob", "lives_at", "address:9-elm")])
    t = Trajectory(id="traj-bob", task_id="x", tenant="bob")
    svc.record_trajectory(t)
    svc.add_feedback(Feedback(trajectory_id="traj-bob", kind="edit", payload={"text": secret}))
    a = svc.add("alice", "Alice likes tea", kind="user_preference", trajectory_id="traj-alice")
    v_before = svc.version
    out = svc.forget_tenant("bob")
    assert out["items"] == 1 and out["trajectories"] == 1
    assert svc.search("bob", "passport number", k=10) == []
    assert svc.vec.ids("bob") == [] and svc.graph.edges("bob") == []
    assert svc.kw.query("bob", "passport elm", 10) == []
    with pytest.raises(NotFound):
        svc.get(b.id)
    with pytest.raises(NotFound):
        svc.get_trajectory("traj-bob", "bob")
    assert [h.item.id for h in svc.search("alice", "tea", k=3)] == [a.id]  # others untouched
    svc.rollback(v_before)  # cannot bring a forgotten tenant back
    assert svc.search("bob", "passport number", k=10) == []
    hist = svc.history(tenant="bob")
    assert hist[-1].type == "tenant_forgotten"
    assert all("XK4471192" not in str(h.data) for h in hist)
    if svc.ledger.is_sqlite:  # no readable text left in the database files themselves
        svc.close()
        db = Path(svc.ledger.url.removeprefix("sqlite:///"))
        for f in db.parent.glob("ledger.db*"):
            assert b"XK4471192" not in f.read_bytes(), f


def test_paused_gc_nests_and_restores_the_previous_state():
    import gc

    from memory.lifecycle import paused_gc

    was = gc.isenabled()
    gc.enable()
    try:
        with paused_gc():
            with paused_gc():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer bulk change is still running
        assert gc.isenabled()
        gc.disable()
        with paused_gc():
            pass
        assert not gc.isenabled()  # an application's own choice is kept
    finally:
        (gc.enable if was else gc.disable)()
