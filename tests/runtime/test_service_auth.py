"""Auth: 401 without a valid token (Bearer or x-api-key), tenant isolation, admin-only routes."""
from __future__ import annotations

import httpx
import pytest

from runtime.auth import Principal, TokenAuth


def test_token_sources_and_lookup(tmp_path):
    (tmp_path / "tokens.json").write_text('{"tokens": [{"token": "file-token-1", "tenant": "acme"}]}')
    auth = TokenAuth.load(tmp_path, env={"EVOLVE_TOKENS": "env-token-22=beta,root-token-3=ops:admin"})
    assert len(auth) == 3
    assert auth.authenticate({"authorization": "Bearer file-token-1"}) == Principal("acme")
    assert auth.authenticate({"x-api-key": "env-token-22"}) == Principal("beta")
    assert auth.authenticate({"authorization": "bearer root-token-3"}) == Principal("ops", admin=True)
    assert auth.authenticate({"authorization": "Bearer nope"}) is None
    assert auth.authenticate({}) is None
    with pytest.raises(ValueError):
        TokenAuth.load(tmp_path, env={"EVOLVE_TOKENS": "short=acme"})
    with pytest.raises(ValueError):
        TokenAuth.load(tmp_path, env={"EVOLVE_TOKENS": "long-enough-token=bad tenant!"})
    tok = TokenAuth.bootstrap(tmp_path / "fresh")
    assert TokenAuth.load(tmp_path / "fresh", env={}).authenticate({"x-api-key": tok}).admin


@pytest.mark.slow
def test_missing_or_wrong_token_is_401(server, h):
    routes = [("POST", "/threads", {}), ("POST", "/assistants/search", {}), ("GET", "/policies", None),
              ("POST", "/memory/search", {"query": "x"}), ("GET", "/threads/00000000-0000-0000-0000-000000000000", None),
              ("POST", "/policies/rollback", {})]
    for method, path, body in routes:
        for hdrs in ({}, {"x-api-key": "wrong-token-123"}, {"Authorization": "Bearer wrong-token-123"},
                     {"Authorization": "Basic abc"}):
            r = httpx.request(method, server.url + path, json=body, headers=hdrs)
            assert r.status_code == 401, (method, path, hdrs, r.text)
            assert "token" in r.json()["detail"]
    assert httpx.post(server.url + "/assistants/search", json={}, headers={"x-api-key": h.TOKENS["alice"]}).status_code == 200
    assert httpx.post(server.url + "/assistants/search", json={}, headers=h.headers("alice")).status_code == 200
    for open_path in ("/healthz", "/metrics", "/openapi.json"):
        assert httpx.get(server.url + open_path).status_code == 200


@pytest.mark.slow
def test_tenants_cannot_see_each_others_threads_runs_or_memory(server, h):
    a, b = h.client(server, "alice"), h.client(server, "bob")
    t = a.threads.create(metadata={**h.WORLD, "task_seed": 50})
    tid = t["thread_id"]
    a.runs.wait(tid, "agent-supervised")  # the user answers, then ends the episode with a reply
    a.runs.wait(tid, "agent-supervised", command={"resume": {"type": "response", "args": "my dog ate the parcel"}})
    a.runs.wait(tid, "agent-supervised", command={"resume": {"type": "takeover", "args": {
        "action": "reply", "args": {"text": "sorry to hear that"}}}})
    rid = a.runs.list(tid)[0]["run_id"]
    traj_id = a.threads.get_state(tid)["values"]["trajectory_id"]
    calls = [lambda: b.threads.get(tid), lambda: b.threads.get_state(tid), lambda: b.threads.get_history(tid),
             lambda: b.threads.update(tid, metadata={"x": 1}), lambda: b.threads.delete(tid),
             lambda: b.runs.list(tid), lambda: b.runs.get(tid, rid), lambda: b.runs.join(tid, rid),
             lambda: b.runs.wait(tid, "agent"), lambda: b.runs.create(tid, "agent")]
    for call in calls:
        with pytest.raises(httpx.HTTPStatusError) as e:
            call()
        assert e.value.response.status_code == 404
    assert tid not in {x["thread_id"] for x in b.threads.search(limit=1000)}
    assert tid in {x["thread_id"] for x in a.threads.search(limit=1000)}
    assert len(a.runs.list(tid)) >= 1 and a.threads.get(tid)["metadata"] == t["metadata"]  # nothing changed

    url = server.url
    assert httpx.get(f"{url}/trajectories/{traj_id}", headers=h.headers("alice")).status_code == 200
    assert httpx.get(f"{url}/trajectories/{traj_id}", headers=h.headers("bob")).status_code == 404
    r = httpx.post(f"{url}/trajectories/{traj_id}/feedback", headers=h.headers("bob"), json={"kind": "approve"})
    assert r.status_code == 404
    hits = httpx.post(f"{url}/memory/search", headers=h.headers("alice"), json={"query": "my dog ate the parcel"}).json()
    mine = [x for x in hits if traj_id in {p["trajectory_id"] for p in x["provenance"]}]
    assert mine, "what the user said should become a memory item of alice"
    item = mine[0]["id"]
    assert httpx.get(f"{url}/memory/items/{item}/explain", headers=h.headers("alice")).status_code == 200
    assert httpx.get(f"{url}/memory/items/{item}/explain", headers=h.headers("bob")).status_code == 404
    bob_hits = httpx.post(f"{url}/memory/search", headers=h.headers("bob"), json={"query": "my dog ate the parcel"}).json()
    assert item not in {x["id"] for x in bob_hits}


@pytest.mark.slow
def test_only_admins_promote_roll_back_or_rewrite_memory(server, h):
    url = server.url
    admin_only = [("/policies/v1/promote", {}), ("/policies/rollback", {}), ("/memory/rollback", {"version": 0}),
                  ("/memory/retract", {"trajectory_id": "traj-000000000000"}), ("/memory/forget", {"tenant": "bob"})]
    for path, body in admin_only:
        for who in ("alice", "bob"):
            r = httpx.post(url + path, json=body, headers=h.headers(who))
            assert r.status_code == 403, (path, who, r.text)
    assert httpx.get(url + "/policies", headers=h.headers("alice")).status_code == 200  # listing is open
    r = httpx.post(url + "/policies/nope/promote", json={}, headers=h.headers("admin"))
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    r = httpx.post(url + "/policies/rollback", json={}, headers=h.headers("admin"))
    assert r.status_code == 409 and "base" in r.json()["detail"]
