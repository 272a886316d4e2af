"""Restart: SIGKILL the server in the middle of a run; after restart the thread resumes from its
last checkpoint, the run finishes, and every step committed before the kill is still there."""
from __future__ import annotations

import sqlite3

import pytest

pytestmark = pytest.mark.slow


def _run_status(data_dir, run_id):
    with sqlite3.connect(data_dir / "service.sqlite") as db:
        return db.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()[0]


def test_sigkill_mid_run_then_restart_resumes_from_checkpoint(fresh_server, h):
    srv = fresh_server()
    c = h.client(srv)
    for seed in range(80, 86):  # until the kill lands while the run is still going
        tid = c.threads.create(metadata={**h.WORLD, "task_seed": seed})["thread_id"]
        run = c.runs.create(tid, "agent", stream_mode=["updates"])
        seen = None
        for part in c.runs.join_stream(tid, run["run_id"], stream_mode=["updates"]):
            if part.event == "updates" and "act" in part.data and part.data["act"].get("steps"):
                seen = part.data["act"]["steps"][0]
                break
        srv.kill()
        if _run_status(srv.data_dir, run["run_id"]) == "running":
            break
        srv = fresh_server(data_dir=srv.data_dir)
        c = h.client(srv)
    else:
        pytest.fail("every run finished before the kill could land")
    assert seen is not None

    srv2 = fresh_server(data_dir=srv.data_dir)
    assert "resuming run " + run["run_id"] in srv2.read_log()
    c2 = h.client(srv2)
    out = c2.runs.join(tid, run["run_id"])
    assert c2.runs.get(tid, run["run_id"])["status"] in ("success", "interrupted")
    assert "__interrupt__" in out or out["episode"]["done"]
    steps = c2.threads.get_state(tid)["values"]["steps"]
    first = steps[0]  # the step streamed before the kill survived exactly
    assert first["completion_token_ids"] == seen["completion_token_ids"]
    assert first["prompt_token_ids"] == seen["prompt_token_ids"]
    assert first["behaviour_logprobs"] == seen["behaviour_logprobs"]
    history = c2.threads.get_history(tid, limit=100)
    assert any(s["metadata"].get("run_id") == run["run_id"] for s in history)
    # the thread keeps working after the restart
    if "__interrupt__" in out:
        out = c2.runs.wait(tid, "agent", command={"resume": {"type": "ignore"}})
        assert c2.threads.get(tid)["status"] in ("idle", "interrupted")
