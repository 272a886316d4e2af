"""Drift streams and baselines: oracle 100% everywhere, stale drops, determinism, scoped, reverted."""
import json

import pytest

from dynamic_bench import (PRESETS, OracleAgent, RandomAgent, StaleAgent, get_domain, make_stream, rule_change_notes,
                           run_stream)
from dynamic_bench.metrics import summarize

DOMAINS = ("retail", "telecom")


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("preset", PRESETS)
def test_oracle_scores_100_on_every_preset_over_seeds(domain, preset):
    for seed in (0, 1, 2):
        stream = make_stream(preset, domain, 60, seed)
        results = run_stream(OracleAgent(seed=seed), stream)
        assert len(results) == 60
        assert all(r["success"] for r in results), [r for r in results if not r["success"]][:1]
        assert sum(r["n_stale"] for r in results) == 0


@pytest.mark.parametrize("domain", DOMAINS)
def test_stale_agent_drops_after_a_silent_shift_and_commits_stale_violations(domain):
    stream = make_stream("silent", domain, 200, 0)
    assert stream.shifts[0]["announced"] is False
    shift = stream.shifts[0]["index"]
    results = run_stream(StaleAgent(seed=0), stream)
    before = sum(r["success"] for r in results[:shift]) / shift
    after = sum(r["success"] for r in results[shift:]) / (len(results) - shift)
    assert before == 1.0 and after < 0.9
    assert all(r["n_stale"] == 0 for r in results[:shift])
    assert sum(r["n_stale"] for r in results[shift:]) > 0
    s = summarize(results, stream)
    assert s["stale_violation_rate"] > 0 and s["recovery_episodes"][0] > 0
    # silent: the shown policy is still version 1 while version 2 is in force
    assert all(ep.shown_version == 1 and ep.version == 2 for ep in stream.episodes[shift:])


def test_announced_shift_shows_the_new_policy():
    stream = make_stream("announced", "retail", 40, 0)
    ep = stream.episodes[-1]
    assert ep.version == ep.shown_version == 2
    assert ep.task.params["shown_rules"] == get_domain("retail").versions[2]


def _trajectories(stream, agent):
    return [(r["actions"], r["observations"], r["success"]) for r in run_stream(agent, stream)]


@pytest.mark.parametrize("agent_cls", [OracleAgent, RandomAgent])
def test_same_seed_same_stream_and_trajectories(agent_cls):
    a, b, c = (make_stream("mixed", "telecom", 50, s) for s in (5, 5, 6))
    assert [e.task for e in a] == [e.task for e in b]
    assert [e.task.id for e in a] != [e.task.id for e in c]
    assert _trajectories(a, agent_cls(seed=3)) == _trajectories(b, agent_cls(seed=3))
    assert _trajectories(a, agent_cls(seed=3)) != _trajectories(c, agent_cls(seed=3))


def test_oracle_seed_varies_valid_action_orders():
    stream = make_stream("static", "retail", 40, 0)
    runs = [run_stream(OracleAgent(seed=s), stream) for s in range(3)]
    assert all(r["success"] for run in runs for r in run)
    orders = {tuple(tuple(r["actions"]) for r in run) for run in runs}
    assert len(orders) == 3


def test_scoped_shift_touches_only_scoped_users():
    stream = make_stream("scoped", "retail", 300, 1)
    shift = stream.shifts[0]["index"]
    moved, kept = set(), set()
    for ep in stream.episodes[shift:]:
        (moved if ep.in_scope else kept).add(ep.task.user_id)
        assert ep.version == (2 if ep.in_scope else 1)
        assert ep.task.params["rules"] == get_domain("retail").versions[ep.version]
    assert moved and kept and not moved & kept
    assert all(ep.version == 1 for ep in stream.episodes[:shift])
    stale = run_stream(StaleAgent(seed=0), stream)
    assert all(r["success"] for r, ep in zip(stale, stream.episodes) if not ep.in_scope)


def test_reverted_shift_restores_the_old_rule():
    d = get_domain("telecom")
    stream = make_stream("reverted", "telecom", 150, 2)
    assert [(p["version"]) for p in stream.phases] == [1, 2, 1]
    last = [ep for ep in stream.episodes if ep.phase == 2]
    assert all(ep.version == 1 and ep.task.params["rules"] == d.versions[1] for ep in last)
    # a user who lived under v2 now has v2 as the prior rule: v2 behaviour is labelled stale
    assert any([2, d.versions[2]] in ep.task.params["prior_rules"] for ep in last)
    stale = run_stream(StaleAgent(seed=0), stream)
    assert all(r["success"] for r in stale if r["phase"] == 2)
    assert not all(r["success"] for r in stale if r["phase"] == 1)


def test_gradual_shift_mixes_versions_over_its_window():
    stream = make_stream("gradual", "retail", 400, 0)
    sh = stream.shifts[0]
    window = [ep.version for ep in stream.episodes[sh["index"]:sh["index"] + sh["gradual"]]]
    assert set(window) == {1, 2}
    assert window[: len(window) // 2].count(2) < window[len(window) // 2:].count(2)
    assert all(ep.version == 2 for ep in stream.episodes[sh["index"] + sh["gradual"]:])


def test_tool_drift_preset_changes_tools_only():
    d = get_domain("retail")
    stream = make_stream("tool-drift", "retail", 40, 0)
    a, b = d.versions[stream.phases[0]["version"]], d.versions[stream.phases[1]["version"]]
    assert a["tools"] != b["tools"] and {k: v for k, v in a.items() if k != "tools"} == {
        k: v for k, v in b.items() if k != "tools"}
    notes = rule_change_notes("retail", 1, 4)
    assert "tool get_customer was renamed to get_profile" in notes
    assert "tool escalate is deprecated, use handoff" in notes
    assert any("refund now needs argument reason" in n for n in notes)
    assert any(n.startswith("an error now reads: error 404") for n in notes)


def test_rule_change_notes_state_new_values():
    assert "refund window is now 20 days" in rule_change_notes("retail", 1, 2)
    assert "the outage credit is now 15" in rule_change_notes("telecom", 1, 3)
    assert rule_change_notes("retail", 1, 1) == []


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_custom_schedule_from_a_file(tmp_path, suffix):
    spec = {"name": "my-drift", "phases": [{"version": 1},
                                           {"at": 10, "version": {"base": 1, "refund_window": 9}, "announced": False},
                                           {"at": 0.75, "version": 3, "scope": 0.5}]}
    path = tmp_path / f"s{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(spec))
    else:
        import yaml

        path.write_text(yaml.safe_dump(spec))
    stream = make_stream(str(path), "retail", 40, 0)
    assert stream.name == "my-drift" and [s["index"] for s in stream.shifts] == [10, 30]
    assert all(ep.task.params["rules"]["refund_window"] == 9 for ep in stream.episodes[10:30])
    assert all(r["success"] for r in run_stream(OracleAgent(seed=0), stream))


@pytest.mark.parametrize("bad,msg", [
    ([{"version": 1}, {"at": 0, "version": 2}], "not after the previous phase"),
    ([{"version": 1}, {"at": 25, "version": 2}], "beyond the stream's 20 episodes"),
    ([{"version": 1}, {"at": 5, "version": 2, "scope": 1.5}], "scope must be within"),
    ([{"version": 1}, {"at": 5, "version": {"refund_windw": 3}}], "unknown rule parameter"),
    ([{"nope": 1}], "with a 'version'"),
    ([], "non-empty list"),
])
def test_bad_schedule_files_give_clear_errors(tmp_path, bad, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=msg):
        make_stream(str(path), "retail", 20, 0)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot parse"):
        make_stream(str(path), "retail", 20, 0)


@pytest.mark.parametrize("domain", DOMAINS)
def test_random_agent_is_far_below_the_oracle(domain):
    results = run_stream(RandomAgent(seed=0), make_stream("static", domain, 200, 0))
    assert sum(r["success"] for r in results) / len(results) < 0.2


def test_the_shipped_example_schedule_runs():
    from pathlib import Path

    import dynamic_bench

    path = Path(dynamic_bench.__file__).parent / "schedules" / "example.yaml"
    stream = make_stream(str(path), "retail", 100, 0)
    assert [s["kind"] for s in stream.shifts] == ["silent", "scoped-gradual"]
    assert all(r["success"] for r in run_stream(OracleAgent(seed=0), stream))
    stale = run_stream(StaleAgent(seed=0), stream)
    assert sum(r["n_stale"] for r in stale[30:]) > 0 and all(r["n_stale"] == 0 for r in stale[:30])
