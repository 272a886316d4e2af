"""Diagnostics: group statistics, the JSONL log, plots, and the diagnosis by rules of thumb."""
from __future__ import annotations

import json

from dynamic_bench.schema import Step, Trajectory
from training.rl.diagnostics import Diagnostics, diagnose, group_stats, held_out_series


def _traj(reward: float, tools: list[str]) -> Trajectory:
    return Trajectory(task_id="t", reward=reward, outcome="success" if reward else "failure",
                      steps=[Step(index=i, action={"name": n, "args": {}}) for i, n in enumerate(tools)])


def test_group_stats_count_variance_and_strategies():
    g1 = [_traj(1, ["get_order", "refund", "reply"]), _traj(0, ["refund", "reply"]), _traj(1, ["get_order", "refund", "reply"])]
    g2 = [_traj(0, ["reply"]), _traj(0, ["reply"])]
    st = group_stats([g1, g2])
    assert st["zero_var_frac"] == 0.5
    assert st["distinct_tool_seqs"] == 1.5  # 2 strategies in g1, 1 in g2
    assert st["reward_mean"] == 0.4 and st["success_rate"] == 0.4
    assert abs(st["reward_var"] - (2 / 9) / 2) < 1e-12


def _rows(n=8, **series):
    return [{"step": i + 1, **{k: v[i] for k, v in series.items()}} for i in range(n)]


def test_diagnosis_fires_each_rule_of_thumb():
    flat = diagnose(_rows(zero_var_frac=[0.9] * 8, reward_mean=[0.0] * 8))
    assert flat[0].startswith("reward variance near zero") and "samples and rollout counts" in flat[0]
    offp = diagnose(_rows(zero_var_frac=[0.2] * 8, reward_mean=[0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
                          heldout_success=[0.3] * 8))
    assert any("held-out stayed flat" in x and "off-policy" in x for x in offp)
    drift = diagnose(_rows(clip_frac=[0.0, 0.01, 0.02, 0.05, 0.08, 0.1, 0.15, 0.2]))
    assert any("drifting from the behaviour policy" in x for x in drift)
    collapse = diagnose(_rows(zero_var_frac=[0.3] * 8, reward_mean=[0.6, 0.6, 0.5, 0.5, 0.3, 0.2, 0.1, 0.1],
                              kl=[0.01, 0.02, 0.1, 0.3, 0.8, 1.5, 2.0, 2.5], entropy=[0.02] * 8))
    assert any("reward fell" in x and "KL to the reference" in x and "entropy" not in x for x in collapse)
    assert not collapse[0].startswith("healthy")
    memorised = diagnose(_rows(reward_mean=[0.5] * 8, sft_loss=[0.47, 0.31, 0.3, 0.25, 0.2, 0.17, 0.15, 0.12],
                               heldout_success=[0.71] * 8))
    assert memorised[0].startswith("the supervised corrections were fitted") and "held-out stayed flat" in memorised[0]
    assert not any("supervised corrections" in x
                   for x in diagnose(_rows(reward_mean=[0.5] * 8, sft_loss=[0.47, 0.31, 0.3, 0.25, 0.2, 0.17, 0.15, 0.12],
                                           heldout_success=[0.7, 0.7, 0.75, 0.8, 0.85, 0.9, 0.9, 0.92])))
    ok = diagnose(_rows(zero_var_frac=[0.3] * 8, reward_mean=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                        heldout_success=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], clip_frac=[0.01] * 8))
    assert ok[0].startswith("healthy")


def test_held_out_series_starts_before_the_first_update():
    """A run that fell at its first evaluation and only climbed back to where it started is flat,
    not improving: the score before any update (logged with step 1) leads the series."""
    rows = [{"step": i + 1, "reward_mean": 0.2 + 0.1 * i, "zero_var_frac": 0.3} for i in range(9)]
    for r, h in zip(rows[2::3], (0.1, 0.2, 0.3)):
        r["heldout_success"] = h
    assert held_out_series(rows) == [0.1, 0.2, 0.3]
    assert diagnose(rows)[0].startswith("healthy")  # without the start: 0.1 -> 0.3 looks like learning
    rows[0]["heldout_success_start"] = 0.3
    assert held_out_series(rows) == [0.3, 0.1, 0.2, 0.3]
    assert any("held-out stayed flat (0.30→0.30)" in x for x in diagnose(rows))


def test_log_survives_a_torn_last_line_and_plots(tmp_path):
    d = Diagnostics(tmp_path)
    for i in range(1, 4):
        d.log({"step": i, "reward_mean": i / 10, "kl": 0.01 * i})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')  # a crash mid-write
    again = Diagnostics(tmp_path)
    assert [r["step"] for r in again.rows] == [1, 2, 3]
    again.truncate(2)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert again.plot().exists()
