"""Hot swap: promoting an adapter changes the policy version of the next run without a restart;
rolling back restores the old one. The evolve cycle's way (the registry module, from another
process) and the admin API's way both work."""
from __future__ import annotations

import httpx
import pytest

from runtime.policy_registry import PolicyRegistry

pytestmark = pytest.mark.slow
ONE_TURN = {"configurable": {"max_turns": 1}}


def _adapter(policy_dir, out, seed):
    from training.policy import save_random_adapter

    return save_random_adapter(policy_dir, out, seed=seed)


def _versions_of_next_run(c, h, seed):
    tid = c.threads.create(metadata={**h.WORLD, "task_seed": seed})["thread_id"]
    c.runs.wait(tid, "agent", config=ONE_TURN)
    return {s["policy_version"] for s in c.threads.get_state(tid)["values"]["steps"]}


def test_promote_and_roll_back_without_restart(server, h, tiny_policy, tmp_path):
    srv = server  # the shared server: base serves again when this test ends
    pid = srv.proc.pid
    c = h.client(srv)
    reg = PolicyRegistry(srv.data_dir)
    try:
        _swap_cycle(srv, c, h, reg, tiny_policy, tmp_path, pid)
    finally:
        if reg.current() is not None:
            reg.roll_back(to="base")


def _swap_cycle(srv, c, h, reg, tiny_policy, tmp_path, pid):
    reg.register("v1", _adapter(tiny_policy, tmp_path / "a1", 1), parent="base", cycle="cycle-0001")
    reg.register("v2", _adapter(tiny_policy, tmp_path / "a2", 2), parent="v1", cycle="cycle-0002")
    assert _versions_of_next_run(c, h, 90) == {"base"}

    r = httpx.post(f"{srv.url}/policies/v1/promote", json={"reason": "better"}, headers=h.headers("alice"))
    assert r.status_code == 403
    r = httpx.post(f"{srv.url}/policies/v1/promote", json={"reason": "better"}, headers=h.headers("admin"))
    assert r.status_code == 200 and r.json()["serving"] == "v1", r.text
    assert _versions_of_next_run(c, h, 91) == {"v1"}

    reg.promote("v2")  # what `evolve cycle` does, from its own process
    assert _versions_of_next_run(c, h, 92) == {"v2"}
    assert httpx.get(f"{srv.url}/healthz").json()["policy_version"] == "v2"

    r = httpx.post(f"{srv.url}/policies/rollback", json={}, headers=h.headers("admin"))
    assert r.status_code == 200 and r.json()["serving"] == "v1", r.text
    assert _versions_of_next_run(c, h, 93) == {"v1"}
    listing = httpx.get(f"{srv.url}/policies", headers=h.headers("alice")).json()
    assert {v["version"]: v["status"] for v in listing["versions"]} == {"v1": "promoted", "v2": "rolled_back"}

    reg.roll_back()
    assert _versions_of_next_run(c, h, 94) == {"base"}
    assert srv.proc.pid == pid and srv.proc.poll() is None  # never restarted
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert 'evolve_policy_info{version="base"} 1.0' in metrics
