"""Metrics: pass^k against brute force, recovery, stale rates, forgetting/BWT, AULC, summaries."""
import itertools
import random

import pytest

from dynamic_bench import BENCH_VERSION, OracleAgent, make_stream, repeat_tasks, run_stream
from dynamic_bench.metrics import (aulc, backward_transfer, forgetting, pass_hat_k, recovery_episodes, rolling,
                                   stale_violation_rates, summarize)


def brute_force_pass_k(trials, k):
    """Fraction of k-subsets of each task's trials that all succeed, averaged over tasks."""
    vals = []
    for row in trials:
        if len(row) < k:
            continue
        subsets = list(itertools.combinations(range(len(row)), k))
        vals.append(sum(all(row[i] for i in s) for s in subsets) / len(subsets))
    return sum(vals) / len(vals) if vals else None


def test_pass_k_matches_brute_force_enumeration():
    rng = random.Random(0)
    for _ in range(200):
        trials = [[rng.random() < rng.random() for _ in range(rng.randint(1, 7))] for _ in range(rng.randint(1, 5))]
        for k in range(1, 5):
            want, got = brute_force_pass_k(trials, k), pass_hat_k(trials, k)
            assert (want is None and got is None) or got == pytest.approx(want)


def test_pass_k_small_cases_by_hand():
    assert pass_hat_k({"a": [True, True, False, False]}, 2) == pytest.approx(1 / 6)
    assert pass_hat_k({"a": [True] * 4, "b": [False] * 4}, 4) == 0.5
    assert pass_hat_k({"a": [True]}, 2) is None


def _stream(n=40):
    return make_stream("reverted", "retail", n, 0)  # phases at 0, 13, 27


def test_recovery_episodes_counts_until_the_window_is_back():
    s = _stream(60)  # phases 0-20, 20-40, 40-60
    succ = [1.0] * 20 + [0.0] * 5 + [1.0] * 15 + [1.0] * 20
    assert recovery_episodes(succ, s, window=5) == [5, 0]
    never = [1.0] * 20 + [0.0] * 20 + [1.0] * 20
    assert recovery_episodes(never, s, window=5) == [20, 0]  # capped at the phase length
    lucky_end = [1.0] * 20 + [0.0] * 17 + [1.0] * 3 + [1.0] * 20
    assert recovery_episodes(lucky_end, s, window=5) == [20, 0]  # three good episodes are not a full window

    only = [False] * 60
    for i in (21, 23, 30, 33, 41):
        only[i] = True
    flagged = [1.0] * 60
    flagged[21] = flagged[23] = 0.0  # windows of 2 flagged episodes: (21, 23) fails, (23, 30) is at 0.5
    # counted from the first flagged episode (21) to the first window back (30); 41 is back at once
    assert recovery_episodes(flagged, s, window=2, only=only) == [9, 0]
    assert recovery_episodes([1.0] * 60, s, window=2, only=[False] * 60) == [None, None]  # nothing changed


def test_recovery_on_changed_episodes_is_never_for_a_policy_that_did_not_adapt():
    """The stale agent "recovers" over all episodes in windows of unchanged tasks; on the changed
    ones it never does, and the oracle recovers at once on both."""
    from dynamic_bench import StaleAgent
    from dynamic_bench.metrics import changed_episodes

    stream = make_stream("silent", "retail", 120, 0)
    shift = stream.shifts[0]["index"]
    changed = changed_episodes(stream)
    assert not any(changed[:shift]) and 0 < sum(changed[shift:]) < len(stream) - shift
    results = run_stream(StaleAgent(seed=0), stream)
    assert all(not r["success"] for r, c in zip(results, changed) if c)
    assert all(r["success"] for r, c in zip(results, changed) if not c)
    s = summarize(results, stream)
    assert s["recovery_episodes_changed"] == [len(stream) - shift]
    assert s["recovery_episodes"][0] < len(stream) - shift  # the all-episode metric is fooled
    oracle = summarize(run_stream(OracleAgent(seed=0), stream), stream)
    assert oracle["recovery_episodes_changed"] == oracle["recovery_episodes"] == [0]


def test_stale_violation_rate_uses_the_window_after_each_shift():
    s = _stream(60)
    results = [{"n_stale": 0} for _ in range(60)]
    for i in (20, 22, 41):
        results[i]["n_stale"] = 2
    assert stale_violation_rates(results, s, window=4) == [0.5, 0.25]


def test_forgetting_and_backward_transfer():
    m = {0: {1: 1.0}, 1: {2: 0.8}, 2: {1: 0.6, 2: 0.9}}
    assert backward_transfer(m) == pytest.approx(((0.6 - 1.0) + (0.9 - 0.8)) / 2)
    assert forgetting(m) == pytest.approx(((1.0 - 0.6) + (0.8 - 0.9)) / 2)
    assert forgetting({0: {1: 1.0}}) is None and backward_transfer({}) is None


def test_rolling_and_aulc():
    assert rolling([1, 0, 1, 1], 2) == [1.0, 0.5, 0.5, 1.0]
    assert aulc([1, 0, 1, 1], 2) == pytest.approx(3 / 4)
    assert aulc([1.0] * 10, 3) == 1.0


def test_summary_has_every_result_key_and_the_bench_version():
    stream = make_stream("mixed", "telecom", 40, 0)
    results = run_stream(OracleAgent(seed=0), stream)
    trials = repeat_tasks(lambda s: OracleAgent(seed=s), [ep.task for ep in stream.episodes[-5:]], n_trials=4)
    s = summarize(results, stream, pass_trials=trials)
    for key in ("bench_version", "success_rate", "phases", "recovery_episodes", "recovery_episodes_changed",
                "stale_violation_rate", "pass_k", "aulc", "forgetting", "backward_transfer"):
        assert key in s
    assert s["bench_version"] == BENCH_VERSION and s["success_rate"] == 1.0 and s["aulc"] == 1.0
    assert s["pass_k"] == {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}
    assert s["recovery_episodes"] == [0, 0, 0] and len(s["phases"]) == 4
    assert all(r in (0, None) for r in s["recovery_episodes_changed"])


def test_evaluate_versions_feeds_a_forgetting_matrix():
    from dynamic_bench import StaleAgent, evaluate_versions

    oracle = evaluate_versions(lambda s: OracleAgent(seed=s), "telecom", [1, 2, 3], n_tasks=20)
    stale = evaluate_versions(lambda s: StaleAgent(seed=s), "telecom", [1, 2, 3], n_tasks=20)
    assert oracle == {1: 1.0, 2: 1.0, 3: 1.0}
    assert stale[1] == 1.0 and stale[2] < 1.0 and stale[3] < 1.0
    # an agent that learned v2 (the oracle's row) and then regressed to v1 behaviour forgets v2
    m = {0: {2: oracle[2]}, 1: {2: stale[2]}}
    assert forgetting(m) == pytest.approx(1.0 - stale[2]) and backward_transfer(m) == pytest.approx(stale[2] - 1.0)
