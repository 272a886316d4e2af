"""`evolve memory ...` end to end through the real typer app."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from evolve.cli import app
from memory import MemoryService

runner = CliRunner()


def _prep(d):
    svc = MemoryService(d)
    a = svc.add("alice", "Gold members get refunds within 30 days", kind="strategy", trajectory_id="traj-1")
    v = svc.version
    b = svc.add("alice", "Order O-9 ships from Lyon", trajectory_id="traj-2")
    svc.add("bob", "Bob likes tea", kind="user_preference", trajectory_id="traj-3")
    svc.close()
    return a, b, v


def _cli(*args, input=None):
    return runner.invoke(app, ["memory", *args], input=input)


def test_cli_inspect_commands(tmp_path):
    d = str(tmp_path / "mem")
    a, b, v = _prep(d)
    r = _cli("stats", "--data", d)
    assert r.exit_code == 0 and json.loads(r.stdout)["items"] == 3
    r = _cli("search", "alice", "refund window", "--data", d)
    assert r.exit_code == 0 and a.id in r.stdout and "traj-1" in r.stdout
    r = _cli("search", "carol", "refund window", "--data", d)
    assert r.exit_code == 0 and "no hits" in r.stdout
    r = _cli("show", a.id, "--data", d)
    assert json.loads(r.stdout)["text"] == a.text
    r = _cli("explain", a.id, "--data", d)
    assert json.loads(r.stdout)["provenance"][0]["trajectory_id"] == "traj-1"
    r = _cli("history", a.id, "--data", d)
    assert "added" in r.stdout
    for cmd in (["show", "mem-nope"], ["explain", "mem-nope"], ["history", "mem-nope"]):
        r = _cli(*cmd, "--data", d)
        assert r.exit_code == 1 and "unknown memory item 'mem-nope'" in r.stderr


def test_cli_destructive_commands_confirm(tmp_path):
    d = str(tmp_path / "mem")
    a, b, v = _prep(d)
    r = _cli("rollback", "--version", str(v), "--data", d, input="n\n")
    assert r.exit_code == 1 and "aborted" in r.stdout
    s0 = MemoryService(d)
    assert s0.get(b.id).status == "candidate"
    s0.close()
    r = _cli("rollback", "--version", "9999", "--data", d, "--yes")
    assert r.exit_code == 1 and "unknown ledger version 9999" in r.stderr
    r = _cli("rollback", "--version", str(v), "--data", d, input="y\n")
    assert r.exit_code == 0, r.output
    svc = MemoryService(d)
    assert svc.get(b.id).status == "retracted"
    svc.close()
    r = _cli("retract", "--trajectory", "traj-nope", "--data", d, "--yes")
    assert r.exit_code == 1 and "unknown trajectory" in r.stderr
    r = _cli("retract", "--trajectory", "traj-1", "--data", d, "--yes")
    assert r.exit_code == 0 and json.loads(r.stdout)["retracted"] == [a.id]
    r = _cli("forget", "nobody", "--data", d, "--yes")
    assert r.exit_code == 1 and "unknown tenant" in r.stderr
    r = _cli("forget", "bob", "--data", d, "--yes")
    assert r.exit_code == 0 and json.loads(r.stdout)["items"] == 1
    r = _cli("rebuild", "--data", d)
    assert r.exit_code == 0 and json.loads(r.stdout)["re_embedded"] == 0
    r = _cli("search", "bob", "tea", "--data", d)
    assert "no hits" in r.stdout
