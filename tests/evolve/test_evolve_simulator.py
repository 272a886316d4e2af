"""The simulated user: judges proposals on its own rules, answers in LangGraph's HumanResponse
shape, volunteers the rule change when rejecting, and its answers land in the ledger."""
from __future__ import annotations

import random

import pytest

from dynamic_bench import OracleAgent, StaleAgent, make, make_stream
from dynamic_bench.personas import Decision
from evolve.simulator.persona import default_persona
from evolve.simulator.run import judge_proposal, reason_for, response_for


def _silent_episode():
    s = make_stream("silent", "retail", 40, seed=3)
    return next(e for e in s.episodes[20:] if e.task.params["shown_rules"] != e.task.params["rules"])


def _first_write(agent, task):
    env = make("driftbench/retail-v1", user_simulation=False)
    obs, info = env.reset(seed=0, options={"task": task, "user_simulation": False})
    agent.reset(obs, info)
    applied = []
    while True:
        a = agent.act(obs, info)
        j = env.judge_action(a)
        if j["is_write"] or a.startswith("reply"):
            return applied, a
        obs, *_ , info = env.step(a)
        applied.append(a)


def test_judge_uses_the_rules_in_force_for_this_user():
    ep = _silent_episode()
    for agent, expect in ((OracleAgent(seed=1), True), (StaleAgent(seed=1), None)):
        applied, action = _first_write(agent, ep.task)
        j = judge_proposal(ep.task, applied, action)
        if expect is not None:
            assert j["correct"] is True
        else:  # the stale agent follows the shown (old) rules: wrong whenever they differ
            assert j["correct"] == (action == j["correct_action"])


def test_reason_states_what_changed_and_only_when_something_did():
    ep = _silent_episode()
    reason = reason_for(ep.task)
    assert reason.startswith("no. ") and ("window" in reason or "escalat" in reason or "coupon" in reason)
    v1 = make_stream("silent", "retail", 40, seed=3).episodes[0].task
    assert reason_for(v1) is None
    assert response_for(Decision("reject"), {}, v1, True) == {"type": "ignore", "args": None}


def test_responses_follow_langgraph_human_response_shapes():
    ep = _silent_episode()
    j = {"action_text": 'refund {"order_id":"O-1"}'}
    assert response_for(Decision("approve"), j, ep.task, False) == {"type": "accept", "args": None}
    assert response_for(Decision("reject"), j, ep.task, False) == {"type": "ignore", "args": None}
    said = response_for(Decision("reject"), j, ep.task, True)
    assert said["type"] == "response" and said["args"] == reason_for(ep.task)
    edit = response_for(Decision("edit", 'escalate {"order_id":"O-1"}'), j, ep.task, False)
    assert edit == {"type": "edit", "args": {"action": "escalate", "args": {"order_id": "O-1"}}}
    take = response_for(Decision("takeover", 'refund {"order_id":"O-2"}'), j, ep.task, False)
    assert take["type"] == "takeover" and take["args"]["args"] == {"order_id": "O-2"}


def test_persona_traits_are_seeded():
    p = default_persona("careful", patience=5, volunteer=0.5)
    a = [p.volunteers(random.Random(7)) for _ in range(3)]
    b = [p.volunteers(random.Random(7)) for _ in range(3)]
    assert a == b and p.patience == 5


@pytest.mark.slow
def test_simulated_answers_land_in_the_ledger(traffic):
    from memory import MemoryService

    mem = MemoryService(traffic["data"] / "memory")
    try:
        by_id = {t.id: t for t in mem.trajectories().trajectories}
    finally:
        mem.close()
    kinds = {"accept": "approve", "ignore": "reject", "response": "respond", "edit": "edit", "takeover": "takeover"}
    for r in traffic["result"]["episodes"]:
        t = by_id[r["trajectory_id"]]
        assert [f.kind for f in t.feedback] == [kinds[a] for a in r["answers"]]
        assert (t.outcome == "success") == r["success"]
