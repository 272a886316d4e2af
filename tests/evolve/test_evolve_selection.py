"""Choosing the adapter's scale before the gate (evolve.selection.choose_scale): the gate's rule on
tasks apart from the gate's."""
from __future__ import annotations

from evolve.gate import GateConfig
from evolve.selection import choose_scale

CFG = GateConfig(n_bootstrap=200)
N = 40


def outcomes(current: int, old: int) -> dict[str, list[int]]:
    """Successes on N current-rule and N old-rule tasks (the first ones solved)."""
    return {"current": [1] * current + [0] * (N - current), "old_rules": [1] * old + [0] * (N - old)}


def test_a_scale_the_gate_would_promote_beats_a_full_adapter_that_forgets():
    serving = outcomes(20, 40)
    chosen, verdicts = choose_scale(serving, {1.0: outcomes(36, 33), 0.75: outcomes(34, 40), 0.5: outcomes(30, 40)},
                                    CFG)
    assert chosen == 0.75  # 1.0 forgets 7 of 40; of those that pass, 0.75 gains most
    assert not verdicts[1.0].promote and verdicts[0.75].promote and verdicts[0.5].promote


def test_the_full_adapter_is_kept_when_it_passes_and_gains_most():
    serving = outcomes(20, 40)
    chosen, _ = choose_scale(serving, {1.0: outcomes(36, 40), 0.5: outcomes(30, 40)}, CFG)
    assert chosen == 1.0


def test_when_none_would_pass_the_scale_whose_worst_slice_loses_least_is_chosen():
    serving = outcomes(20, 40)
    chosen, verdicts = choose_scale(serving, {1.0: outcomes(21, 30), 0.75: outcomes(21, 36), 0.5: outcomes(19, 38)},
                                    CFG)
    assert not any(v.promote for v in verdicts.values())
    assert chosen == 0.5  # worst slices: -0.25, -0.10, -0.05


def test_ties_go_to_the_larger_scale():
    serving = outcomes(20, 40)
    chosen, _ = choose_scale(serving, {1.0: outcomes(36, 40), 0.5: outcomes(36, 40)}, CFG)
    assert chosen == 1.0
