"""The gate's statistics: better beyond noise on current rules, no regression elsewhere."""
import numpy as np
import pytest

from evolve.gate import GateConfig, decide, paired_compare

CFG = GateConfig(n_bootstrap=1000)


def test_clear_improvement_promotes():
    d = decide({"current": ([1] * 18 + [0] * 2, [1] * 8 + [0] * 12),
                "old_rules": ([1] * 20, [1] * 20), "held_out": ([1] * 19 + [0], [1] * 19 + [0])}, CFG)
    assert d.promote
    s = d.slices["current"]
    assert s.wins == 10 and s.losses == 0 and s.p_better < 0.01 and s.ci_low > 0


def test_noise_sized_gain_does_not_promote():
    # 3 wins vs 1 loss: a +10-point point estimate, but a sign test cannot tell it from noise.
    cand = [1, 1, 1, 0] + [1] * 10 + [0] * 6
    cur = [0, 0, 0, 1] + [1] * 10 + [0] * 6
    d = decide({"current": (cand, cur)}, CFG)
    assert not d.promote and d.slices["current"].delta == pytest.approx(0.1)


def test_regression_on_old_rules_blocks_promotion():
    d = decide({"current": ([1] * 20, [0] * 20), "old_rules": ([1] * 15 + [0] * 5, [1] * 20)}, CFG)
    assert not d.promote
    assert any("old_rules: regression" in r for r in d.reasons)


def test_drop_within_tolerance_is_allowed():
    n = 100
    old_c = [1] * 98 + [0] * 2
    old_o = [1] * 100
    d = decide({"current": ([1] * n, [0] * n), "old_rules": (old_c, old_o)}, GateConfig(tolerance=0.03))
    assert d.promote


def test_pairs_must_match():
    with pytest.raises(ValueError, match="same tasks and seeds"):
        paired_compare("x", [1, 0], [1], CFG)


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    r1, r2 = paired_compare("x", a, b, CFG), paired_compare("x", a, b, CFG)
    assert (r1.ci_low, r1.ci_high) == (r2.ci_low, r2.ci_high)
    assert r1.ci_low <= r1.delta <= r1.ci_high


def test_gate_slices_after_a_silent_shift_test_forgetting_only_where_the_rules_agree():
    """Old-rule tasks shown the same policy as the latest rules (a silent shift) are kept only where
    both rule versions want the same actions; after an announced change every old-rule task counts."""
    from dynamic_bench import get_domain
    from dynamic_bench.actions import format_action
    from evolve.cycle import CycleConfig
    from evolve.stages import gate_slices

    d = get_domain("retail")
    v1, v2 = d.versions[1], d.versions[2]

    def ctx(rules, shown_version, shown_rules):
        return {"rules": rules, "shown_rules": shown_rules, "shown_version": shown_version, "prior": [],
                "version": 2 if rules == v2 else 1, "domain": "retail", "n": 1}

    def agrees(t):
        a, b = d.solve(t.params, v1), d.solve(t.params, v2)
        return [format_action(c) for c in a[0]] == [format_action(c) for c in b[0]] and a[1] == b[1]

    assert all(agrees(t) == d.same_answer(t.params, v1, v2) for t in gate_slices(
        CycleConfig(domain="retail", gate_tasks=40), [ctx(v1, 1, v1), ctx(v2, 2, v2)])["old_rules"])

    cfg = CycleConfig(domain="retail", gate_tasks=30)
    silent = gate_slices(cfg, [ctx(v1, 1, v1), ctx(v2, 1, v1)])
    assert len(silent["old_rules"]) == 30 and all(agrees(t) for t in silent["old_rules"])
    assert all(t.params["rules"] == v2 and t.params["shown_rules"] == v1 for t in silent["current"])
    announced = gate_slices(cfg, [ctx(v1, 1, v1), ctx(v2, 2, v2)])
    assert len(announced["old_rules"]) == 30 and not all(agrees(t) for t in announced["old_rules"])
