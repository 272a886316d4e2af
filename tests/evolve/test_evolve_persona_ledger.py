"""Fitting from the ledger: logged answers are re-judged by replaying the thread's world."""
from __future__ import annotations

import pytest

from dynamic_bench import OracleAgent, StaleAgent, get_domain, make, make_stream
from dynamic_bench.schema import Feedback, Step, Trajectory
from evolve.simulator.ledger import fit_from_ledger, records_from


def _episode(agent, task, answer):
    """Play `agent` on `task`; every write gets `answer`; log it as the runtime would."""
    env = make("driftbench/retail-v1", user_simulation=False)
    obs, info = env.reset(seed=0, options={"task": task, "user_simulation": False})
    agent.reset(obs, info)
    t = Trajectory(task_id=task.id, tenant="acme",
                   metadata={"world": {"world": "driftbench/retail-v1", "task_json": task.model_dump_json()}})
    for i in range(10):
        a = agent.act(obs, info)
        j = env.judge_action(a)
        t.steps.append(Step(index=i, action_text=a, action={"name": a.split(" ")[0]}))
        if j["is_write"]:
            t.feedback.append(Feedback(trajectory_id=t.id, step=i, kind=answer, payload={"proposed": a}))
            if answer != "approve":
                continue
        obs, _, term, trunc, info = env.step(a)
        if term or trunc:
            break
    return t


def test_replay_recovers_correctness_of_logged_writes():
    s = make_stream("silent", "retail", 40, seed=3)
    d = get_domain("retail")

    def writes(task, rules):
        return d.solve(task.params, rules)[0]

    task = next(e.task for e in s.episodes[20:] if writes(e.task, e.task.params["rules"])
                and writes(e.task, d.versions[1]) and writes(e.task, d.versions[1]) != writes(e.task, e.task.params["rules"]))
    good = _episode(OracleAgent(seed=0), task, "approve")
    recs, _ = records_from([good])
    assert recs and all(r.correct and r.kind == "approve" for r in recs)
    stale = _episode(StaleAgent(seed=0), task, "respond")
    recs2, _ = records_from([stale])
    assert recs2 and all(r.kind == "reject" and r.volunteered for r in recs2)
    # the stale agent's writes are judged on this user's rules in force, not the shown ones
    assert any(not r.correct for r in recs2)


def test_fit_from_an_empty_log_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no feedback on proposed writes"):
        fit_from_ledger(tmp_path, out=tmp_path / "fit")
