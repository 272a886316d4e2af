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
