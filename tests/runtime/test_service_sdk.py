"""The official `langgraph-sdk` client against a real `evolve serve` process.

A thread plays a DriftBench task; a write pauses for approval (`__interrupt__`); the run is
resumed with accept / edit / ignore / response; events stream over SSE; the thread state and
history read back; the trajectory (token ids, logprobs, policy version) is in the ledger with
its feedback attached.
"""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow
GREEDY = {"configurable": {"temperature": 0}}


def _interrupted(c, h, seeds, assistant="agent"):
    """Threads whose first run paused on a write proposal (the tiny policy proposes writes on most tasks)."""
    found = []
    for seed in seeds:
        t = c.threads.create(metadata={**h.WORLD, "task_seed": seed})
        out = c.runs.wait(t["thread_id"], assistant, config=GREEDY)
        if "__interrupt__" in out:
            found.append((t["thread_id"], out))
    assert found, f"the policy proposed no write on tasks {list(seeds)}"
    return found


def _finish(c, tid, answer):
    """Answer every further approval request the same way until the episode ends."""
    for _ in range(10):
        state = c.threads.get_state(tid)
        if not state["interrupts"]:
            return state
        c.runs.wait(tid, "agent", command={"resume": answer}, config=GREEDY)
    raise AssertionError("episode did not end")


def _trajectory(srv, h, tid, who="alice"):
    c = h.client(srv, who)
    traj_id = c.threads.get_state(tid)["values"]["trajectory_id"]
    r = httpx.get(f"{srv.url}/trajectories/{traj_id}", headers=h.headers(who))
    assert r.status_code == 200, r.text
    return r.json()


def test_task_run_interrupt_accept_stream_state_and_ledger(server, h):
    c = h.client(server)
    assert {a["name"] for a in c.assistants.search()} == {"agent", "agent-plan"}
    tid, out = _interrupted(c, h, range(8))[0]
    req = out["__interrupt__"][0]["value"]
    assert set(req["config"]) == {"allow_accept", "allow_edit", "allow_respond", "allow_ignore"}
    proposed = req["action_request"]
    assert isinstance(proposed["action"], str) and isinstance(proposed["args"], dict)
    thread = c.threads.get(tid)
    assert thread["status"] == "interrupted" and thread["interrupts"]
    state = c.threads.get_state(tid)
    assert state["next"] == ["approval"] and state["interrupts"][0]["value"] == req

    # resume with accept, streaming updates and values over SSE
    parts = list(c.runs.stream(tid, "agent", command={"resume": {"type": "accept", "args": None}},
                               stream_mode=["updates", "values"], config=GREEDY))
    events = [p.event for p in parts]
    assert events[0] == "metadata" and events[-1] == "end"
    assert "updates" in events and "values" in events
    nodes = [n for p in parts if p.event == "updates" for n in p.data]
    assert nodes[:2] == ["tool", "observe"], nodes
    tool_msgs = [m for m in parts[-2].data["messages"] if m["type"] == "tool"] if parts[-2].event == "values" else []
    final = _finish(c, tid, {"type": "accept", "args": None})
    msgs = final["values"]["messages"]
    assert any(m["type"] == "tool" and m["content"].startswith("approved; ") for m in msgs + tool_msgs)
    assert final["values"]["episode"]["done"] is True
    assert final["next"] == []

    history = c.threads.get_history(tid, limit=50)
    assert len(history) > 5 and history[0]["checkpoint"]["checkpoint_id"] == final["checkpoint"]["checkpoint_id"]
    assert any(s["next"] == ["approval"] for s in history)
    runs = c.runs.list(tid)
    assert len(runs) >= 2 and {r["status"] for r in runs} <= {"success", "interrupted"}

    traj = _trajectory(server, h, tid)
    assert traj["tenant"] == "alice" and traj["scaffold"] == "direct" and traj["outcome"] in ("success", "failure")
    assert traj["steps"], "no steps recorded"
    for s in traj["steps"]:
        assert s["prompt_token_ids"] and s["completion_token_ids"]
        assert len(s["behaviour_logprobs"]) == len(s["completion_token_ids"])
        assert all(lp <= 0 for lp in s["behaviour_logprobs"])
        assert s["policy_version"] == "base"
    approvals = [f for f in traj["feedback"] if f["kind"] == "approve"]
    assert approvals and approvals[0]["step"] == req["step"]

    # feedback on a step afterwards is attached to the trajectory in the ledger
    r = httpx.post(f"{server.url}/trajectories/{traj['id']}/feedback", headers=h.headers(),
                   json={"kind": "reject", "step": 0, "payload": {"why": "wrong order"}})
    assert r.status_code == 201, r.text
    traj2 = _trajectory(server, h, tid)
    assert any(f["kind"] == "reject" and f["payload"] == {"why": "wrong order"} for f in traj2["feedback"])


def test_resume_with_edit_ignore_and_response(server, h):
    c = h.client(server)
    threads = _interrupted(c, h, range(8, 24))
    assert len(threads) >= 3, "need three paused threads"
    (t_edit, o_edit), (t_ign, o_ign), (t_resp, o_resp) = threads[:3]

    args = o_edit["__interrupt__"][0]["value"]["action_request"]["args"]
    order = args.get("order_id", "O-1")
    c.runs.wait(t_edit, "agent", command={"resume": {"type": "edit", "args": {"action": "escalate",
                                                                              "args": {"order_id": order}}}})
    edited = f'escalate {{"order_id":"{order}"}}'
    s = c.threads.get_state(t_edit)["values"]
    assert any(m["type"] == "tool" and m["content"].startswith(f"user edited it to {edited}; ") for m in s["messages"])
    assert edited in s["applied"]

    proposed = o_ign["__interrupt__"][0]["value"]["description"].split(": ", 1)[1]
    c.runs.wait(t_ign, "agent", command={"resume": {"type": "ignore", "args": None}}, config=GREEDY)
    s = c.threads.get_state(t_ign)["values"]
    assert any(m["type"] == "tool" and m["content"] == "user rejected it; nothing changed" for m in s["messages"])
    assert proposed not in s["applied"]  # a write is applied only once approved

    c.runs.wait(t_resp, "agent", command={"resume": {"type": "response", "args": "ask a human about it first"}},
                config=GREEDY)
    s = c.threads.get_state(t_resp)["values"]
    assert any(m["type"] == "tool" and m["content"] == "user: ask a human about it first" for m in s["messages"])

    for tid in (t_edit, t_ign, t_resp):
        _finish(c, tid, {"type": "ignore", "args": None})
    kinds = {tid: [f["kind"] for f in _trajectory(server, h, tid)["feedback"]] for tid in (t_edit, t_ign, t_resp)}
    assert kinds[t_edit][0] == "edit" and kinds[t_ign][0] == "reject" and kinds[t_resp][0] == "respond"

    # what the user said became a (tenant-scoped) memory item with provenance
    r = httpx.post(f"{server.url}/memory/search", headers=h.headers(), json={"query": "ask a human about it first"})
    assert r.status_code == 200
    hits = [x for x in r.json() if "ask a human about it first" in x["text"]]
    assert hits and hits[0]["kind"] == "user_preference" and hits[0]["provenance"][0]["trajectory_id"]
    r = httpx.post(f"{server.url}/memory/search", headers=h.headers("bob"), json={"query": "ask a human about it first"})
    assert r.status_code == 200 and not [x for x in r.json() if "ask a human" in x["text"]]


def test_bad_resume_value_asks_again_and_changes_nothing(server, h):
    c = h.client(server)
    tid, out = _interrupted(c, h, range(24, 32))[0]
    before = c.threads.get_state(tid)["values"]
    again = c.runs.wait(tid, "agent", command={"resume": {"type": "approve-it-please"}})
    assert "__interrupt__" in again
    assert "unrecognised response" in again["__interrupt__"][0]["value"]["error"]
    after = c.threads.get_state(tid)["values"]
    assert after["applied"] == before["applied"] and after["feedback"] == before["feedback"]


def test_background_run_join_and_plan_act_scaffold(server, h):
    c = h.client(server)
    t = c.threads.create(metadata={**h.WORLD, "task_seed": 40})
    run = c.runs.create(t["thread_id"], "agent-plan", config=GREEDY)
    assert run["status"] in ("pending", "running")
    out = c.runs.join(t["thread_id"], run["run_id"])
    assert out["trajectory_id"] and out["episode"]["scaffold"] == "plan_act"
    assert c.runs.get(t["thread_id"], run["run_id"])["status"] in ("success", "interrupted")
    # a second run while one is in progress on the same thread is refused
    if "__interrupt__" not in out:
        return
    with pytest.raises(httpx.HTTPStatusError) as e:
        c.runs.create(t["thread_id"], "agent")  # input while waiting for approval
    assert e.value.response.status_code == 409
