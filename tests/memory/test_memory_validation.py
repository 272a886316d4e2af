"""Validation from evidence, automatic invalidation, supersession with history, dedup."""
from __future__ import annotations

import time

import pytest

from memory import InvalidInput


def test_candidates_become_validated_from_helpful_outcomes(svc):
    it = svc.add("alice", "Ask for the order id before calling get_order", kind="strategy",
                 trajectory_id="t0")
    assert it.status == "candidate"
    it = svc.record_outcome(it.id, True, "t1")
    assert it.status == "candidate" and it.helpful == 1
    it = svc.record_outcome(it.id, True, "t2")
    assert it.status == "validated" and it.helpful == 2 and it.harmful == 0
    ev = [h.type for h in svc.history(it.id)]
    assert ev == ["added", "outcome", "outcome"]
    assert [h.trajectory_id for h in svc.history(it.id)][1:] == ["t1", "t2"]


def test_harm_outweighing_help_after_a_change_invalidates(svc):
    it = svc.add("alice", "Refund window is 30 days", kind="strategy", trajectory_id="t0")
    for i in range(4):
        it = svc.record_outcome(it.id, True, f"ok{i}")
    assert it.status == "validated"
    it = svc.record_outcome(it.id, False, "bad1")  # the rule changed: now it hurts
    assert it.status == "validated"  # one bad use is not enough
    it = svc.record_outcome(it.id, False, "bad2")
    assert it.status == "validated"  # 2 harmful vs 3 helpful in the recent window
    it = svc.record_outcome(it.id, False, "bad3")
    assert it.status == "retracted" and "invalidated" in it.status_reason
    assert it.valid_to is not None
    assert svc.search("alice", "refund window", k=5) == []
    assert svc.explain(it.id).item.helpful == 4  # counts and history are kept


def test_failures_do_not_invalidate_what_the_user_said(svc, open_service):
    """The agent failing while a user's correction was in its context blames the agent: the note
    stays retrievable (counted as harmful), while an agent-written note with the same history goes."""
    from memory import MemoryConfig

    said = svc.add("alice", "The user said: the refund window is now 20 days", kind="user_preference",
                   source="user", trajectory_id="t0")
    guess = svc.add("alice", "Refunds are fine up to 30 days", kind="strategy", trajectory_id="t0")
    for i in range(4):
        said = svc.record_outcome(said.id, False, f"bad{i}")
        guess = svc.record_outcome(guess.id, False, f"bad{i}")
    assert guess.status == "retracted"
    assert said.status == "candidate" and said.harmful == 4 and said.recent == [0, 0, 0, 0]
    assert [h.item.id for h in svc.search("alice", "refund window", k=5)] == [said.id]
    strict = open_service(config=MemoryConfig(invalidate_user_items=True))
    it = strict.add("bob", "The user said: no", kind="user_preference", source="user")
    for i in range(2):
        it = strict.record_outcome(it.id, False, f"bad{i}")
    assert it.status == "retracted"


def test_supersession_keeps_history_and_validity_intervals(svc):
    old = svc.add("alice", "Refunds are allowed within 30 days", kind="strategy",
                  trajectory_id="t1", payload={"subject": "refund_window", "value": 30})
    t_mid = time.time()
    time.sleep(0.01)
    new = svc.add("alice", "Refunds are allowed within 14 days", kind="strategy",
                  trajectory_id="t2", payload={"subject": "refund_window", "value": 14})
    old_now = svc.get(old.id)
    assert old_now.status == "superseded" and old_now.superseded_by == new.id
    assert old_now.valid_to == new.valid_from and new.supersedes == [old.id]
    assert [h.item.id for h in svc.search("alice", "refund window days", k=5)] == [new.id]
    past = svc.search("alice", "refund window days", k=5, at=t_mid)
    assert [h.item.id for h in past] == [old.id]  # time travel: what was valid then
    ex = svc.explain(old.id)
    assert [h.type for h in ex.history] == ["added", "superseded"]
    assert ex.superseded_by == new.id and ex.item.text == old.text  # kept, not deleted
    # explicit supersede by text
    newer = svc.supersede(new.id, "Refunds are allowed within 7 days", trajectory_id="t3")
    assert svc.get(new.id).status == "superseded" and newer.supersedes == [new.id]
    with pytest.raises(InvalidInput):
        svc.supersede(old.id, "again")  # already superseded


def test_retire_removes_from_retrieval_but_keeps_history(svc):
    it = svc.add("alice", "Use get_order before refunds", kind="tool_knowledge", trajectory_id="t")
    svc.retire(it.id, "learned by policy pv-3")
    assert svc.search("alice", "get_order refunds", k=3) == []
    assert svc.get(it.id).status == "retired"
    assert svc.history(it.id)[-1].data["reason"] == "learned by policy pv-3"



def test_a_repeat_of_a_retired_item_is_evidence_on_it_not_a_new_live_item(svc):
    it = svc.add("alice", "Rule: refunds over 200 need a supervisor.", trajectory_id="t0")
    svc.retire(it.id, "handled without memory by policy pv-3")
    again = svc.add("alice", "Rule: refunds over 200 need a supervisor.", trajectory_id="t1")
    assert again.id == it.id and again.status == "retired"
    assert [p.trajectory_id for p in svc.get(it.id).provenance] == ["t0", "t1"]
    assert svc.items("alice") == [] and svc.search("alice", "refunds over 200 supervisor", k=3) == []
    assert svc.history(it.id)[-1].type == "merged" and svc.history(it.id)[-1].data["retired"] is True
    # a live copy, where one exists, takes the repeat; another tenant's retired item is not theirs
    bob = svc.add("bob", "Rule: refunds over 200 need a supervisor.", trajectory_id="b0")
    assert bob.id != it.id and bob.status == "candidate"
    # a retracted item (wrong) is not merged into: the repeat is a new candidate
    wrong = svc.add("alice", "Rule: gold members never pay shipping.", trajectory_id="t2")
    svc.retract_trajectory("t2", tenant="alice", reason="wrong")
    assert svc.get(wrong.id).status == "retracted"
    fresh = svc.add("alice", "Rule: gold members never pay shipping.", trajectory_id="t3")
    assert fresh.id != wrong.id and fresh.status == "candidate"

EPISODES = [
    ("Gold members can return items within 30 days", "strategy"),
    ("The cancel_order tool requires a reason argument", "tool_knowledge"),
    ("User U-12 prefers short answers", "user_preference"),
    ("Order O-311 was refunded after a damaged delivery", "task_experience"),
    ("Escalate when the refund amount exceeds 500 dollars", "strategy"),
    ("Order O-999 shipped with express delivery", "task_experience"),
]


def test_dedup_after_ingesting_the_same_episodes_three_times(svc):
    for rep in range(3):
        specs = []
        for i, (t, k) in enumerate(EPISODES):
            text = t if rep != 2 else t.lower() + "."  # third replay: near-duplicates, not exact
            specs.append({"tenant": "alice", "text": text, "kind": k,
                          "trajectory_id": f"ep{i}-r{rep}", "step": 0})
        svc.add_many(specs)
    items = svc.items("alice")
    assert len(items) == len(EPISODES)  # no duplicates
    for it in items:  # ... and every replay's provenance kept
        assert sorted(p.trajectory_id for p in it.provenance) == sorted(
            f"ep{EPISODES.index((it.text, it.kind))}-r{r}" for r in range(3))
    assert len(svc.vec.ids("alice")) == len(EPISODES)
    # similar texts that say different things are not merged
    a = svc.add("alice", "Order O-312 was refunded after a damaged delivery", trajectory_id="x")
    assert a.id not in {i.id for i in items}
