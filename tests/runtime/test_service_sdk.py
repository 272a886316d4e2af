"""The official `langgraph-sdk` client against a real `evolve serve` process.

A thread plays a DriftBench task; proposals pause for approval (`__interrupt__`); the run is
resumed with edit / accept / ignore / response / takeover; events stream over SSE; the thread
state and history read back; the trajectory (token ids, logprobs, policy version) is in the
ledger with its feedback attached. The `agent-supervised` assistant sends every proposal to the
human, so these paths do not depend on what the briefly trained policy happens to propose.
"""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow
SUP = "agent-supervised"
WRITES = {"refund", "exchange", "escalate", "issue_coupon"}


def _value(out):
    assert "__interrupt__" in out, f"expected an approval request, got keys {sorted(out)}"
    return out["__interrupt__"][0]["value"]


def _obs_of_last_answer(c, tid):
    """The observation the last answer produced (the transcript then holds the next proposal)."""
    hist = c.threads.get_state(tid)["values"]["history"]
    assert hist[-1]["role"] == "assistant" and hist[-2]["role"] == "obs"
    return hist[-2]["text"]


def _trajectory(srv, h, traj_id, who="alice"):
    return httpx.get(f"{srv.url}/trajectories/{traj_id}", headers=h.headers(who))


def test_task_run_with_every_kind_of_answer(server, h):
    c = h.client(server)
    assert {a["name"] for a in c.assistants.search()} == {"agent", "agent-plan", SUP}
    t = c.threads.create(metadata={**h.WORLD, "task_seed": 1})
    tid = t["thread_id"]
    req = _value(c.runs.wait(tid, SUP))
    assert set(req["config"]) == {"allow_accept", "allow_edit", "allow_respond", "allow_ignore"}
    assert isinstance(req["action_request"]["action"], str) and isinstance(req["action_request"]["args"], dict)
    assert req["step"] == 0 and req["trajectory_id"].startswith("traj-")
    thread = c.threads.get(tid)
    assert thread["status"] == "interrupted" and thread["interrupts"]
    state = c.threads.get_state(tid)
    assert state["next"] == ["approval"] and state["interrupts"][0]["value"] == req
    instruction = state["values"]["episode"]["instruction"]
    order = instruction.split("order ")[1].split(",")[0].split(" ")[0]

    # edit: the human's action runs instead; streamed over SSE
    parts = list(c.runs.stream(tid, SUP, command={"resume": {"type": "edit", "args": {
        "action": "get_order", "args": {"order_id": order}}}}, stream_mode=["updates", "values"]))
    events = [p.event for p in parts]
    assert events[0] == "metadata" and events[-1] == "end" and "values" in events
    nodes = [n for p in parts if p.event == "updates" for n in p.data]
    assert nodes[:3] == ["approval", "tool", "observe"] and nodes[-1] == "__interrupt__", nodes
    edited = f'get_order {{"order_id":"{order}"}}'
    assert _obs_of_last_answer(c, tid).startswith(f"user edited it to {edited}; order {order}")
    assert c.threads.get_state(tid)["values"]["applied"] == [edited]

    # accept: a valid tool call runs ("approved; ..."), an unparsable one comes back as its error
    req = c.threads.get_state(tid)["interrupts"][0]["value"]
    assert req["step"] == 1
    c.runs.wait(tid, SUP, command={"resume": {"type": "accept", "args": None}})
    obs = _obs_of_last_answer(c, tid)
    if req["action_request"]["action"] == "invalid_action":
        assert obs.startswith("error"), obs
    else:
        assert obs.startswith("approved; "), obs

    # a malformed answer is asked again and changes nothing
    before = c.threads.get_state(tid)["values"]
    again = _value(c.runs.wait(tid, SUP, command={"resume": {"type": "approve-it-please"}}))
    assert "unrecognised response" in again["error"]
    after = c.threads.get_state(tid)["values"]
    assert after["applied"] == before["applied"] and after["feedback"] == before["feedback"]

    # ignore: nothing is applied; response: the user's words are the observation
    c.runs.wait(tid, SUP, command={"resume": {"type": "ignore", "args": None}})
    assert _obs_of_last_answer(c, tid) == "user rejected it; nothing changed"
    assert c.threads.get_state(tid)["values"]["applied"] == before["applied"]
    c.runs.wait(tid, SUP, command={"resume": {"type": "response", "args": "please deny it, it is too late"}})
    assert _obs_of_last_answer(c, tid) == "user: please deny it, it is too late"

    # take-over with a reply ends the episode
    out = c.runs.wait(tid, SUP, command={"resume": {"type": "takeover", "args": {
        "action": "reply", "args": {"text": f"Order {order} cannot be refunded: it is denied."}}}})
    assert "__interrupt__" not in out and out["episode"]["done"] is True
    assert out["messages"][-1]["type"] == "ai" and "denied" in out["messages"][-1]["content"]
    final = c.threads.get_state(tid)
    assert final["next"] == [] and c.threads.get(tid)["status"] == "idle"

    history = c.threads.get_history(tid, limit=100)
    assert len(history) > 10 and history[0]["checkpoint"]["checkpoint_id"] == final["checkpoint"]["checkpoint_id"]
    assert sum(s["next"] == ["approval"] for s in history) >= 5
    runs = c.runs.list(tid, limit=100)
    assert len(runs) == 7 and runs[0]["status"] == "success" and {r["status"] for r in runs[1:]} == {"interrupted"}

    r = _trajectory(server, h, out["trajectory_id"])
    assert r.status_code == 200, r.text
    traj = r.json()
    assert traj["tenant"] == "alice" and traj["scaffold"] == "direct" and traj["outcome"] in ("success", "failure")
    assert traj["metadata"]["verdict"] is not None and len(traj["steps"]) == 5
    for s in traj["steps"]:
        assert s["prompt_token_ids"] and s["completion_token_ids"] and s["policy_version"] == "base"
        assert len(s["behaviour_logprobs"]) == len(s["completion_token_ids"])
        assert all(lp <= 0 for lp in s["behaviour_logprobs"])
    assert [f["kind"] for f in traj["feedback"]] == ["edit", "approve", "reject", "respond", "takeover"]
    assert [f["step"] for f in traj["feedback"]] == [0, 1, 2, 3, 4]

    r = httpx.post(f"{server.url}/trajectories/{traj['id']}/feedback", headers=h.headers(),
                   json={"kind": "reject", "step": 4, "payload": {"why": "too blunt"}})
    assert r.status_code == 201, r.text
    fb = _trajectory(server, h, traj["id"]).json()["feedback"]
    assert fb[-1]["kind"] == "reject" and fb[-1]["step"] == 4 and fb[-1]["payload"] == {"why": "too blunt"}

    # what the user said became a memory item of this tenant, with provenance
    q = {"query": "please deny it, it is too late"}
    hits = httpx.post(f"{server.url}/memory/search", headers=h.headers(), json=q).json()
    mine = [x for x in hits if "too late" in x["text"]]
    assert mine and mine[0]["kind"] == "task_experience" and mine[0]["text"] == "Rule: please deny it, it is too late."
    assert mine[0]["provenance"][0]["trajectory_id"] == traj["id"]
    bob = httpx.post(f"{server.url}/memory/search", headers=h.headers("bob"), json=q).json()
    assert not [x for x in bob if "too late" in x["text"]]


def test_default_agent_pauses_on_writes_only(server, h):
    c = h.client(server)
    for seed in (2, 3):
        tid = c.threads.create(metadata={**h.WORLD, "task_seed": seed})["thread_id"]
        out = c.runs.wait(tid, "agent")
        steps = c.threads.get_state(tid)["values"]["steps"]
        names = [s["action"]["name"] for s in steps if s["action"]]
        if "__interrupt__" in out:
            assert names[-1] in WRITES and "a write action" in out["__interrupt__"][0]["value"]["description"]
            assert not [n for n in names[:-1] if n in WRITES]
        else:
            assert not [n for n in names if n in WRITES] and out["episode"]["done"]


def test_background_run_join_and_plan_act_scaffold(server, h):
    c = h.client(server)
    tid = c.threads.create(metadata={**h.WORLD, "task_seed": 4})["thread_id"]
    run = c.runs.create(tid, "agent-plan", config={"configurable": {"max_turns": 2}})
    assert run["status"] in ("pending", "running")
    with pytest.raises(httpx.HTTPStatusError) as e:  # one run at a time on a thread
        c.runs.create(tid, "agent")
    assert e.value.response.status_code == 409
    out = c.runs.join(tid, run["run_id"])
    assert out["episode"]["scaffold"] == "plan_act"
    assert c.runs.get(tid, run["run_id"])["status"] in ("success", "interrupted")
    if out["episode"].get("done"):
        traj = _trajectory(server, h, out["trajectory_id"]).json()
        assert traj["scaffold"] == "plan_act"
