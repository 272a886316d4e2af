"""Smoke test of benchmarks/bench_async_rl.py --quick: sync and async runs side by side, flat JSON, a PNG."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_rl_policy(tmp_path_factory) -> str:
    """A tiny (untrained) policy with a DriftBench tokenizer: the smoke test checks plumbing, not skill."""
    from training.policy import build_policy
    from training.sft_data import corpus_texts

    return str(build_policy(tmp_path_factory.mktemp("policy"), "tiny", corpus_texts(150, seed=0), seed=0))


def test_bench_async_rl_quick(tmp_path, tiny_rl_policy):
    out = tmp_path / "bench_async_rl.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_async_rl.py"), "--quick", "--out", str(out),
                           "--model", tiny_rl_policy, "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert all(not isinstance(v, (dict, list)) for v in res.values())
    assert res["rules"] == "shift" and 0.0 <= res["heldout_success_before"] <= 1.0
    for eta in (0, 2):
        assert res[f"learner_wall_s_eta{eta}"] > 0
        assert 0.0 <= res[f"heldout_success_eta{eta}"] <= 1.0
    assert res["speedup_eta2"] == res["learner_wall_s_eta0"] / res["learner_wall_s_eta2"]
    p, q, n = res["heldout_success_eta2"], res["heldout_success_eta0"], res["heldout_tasks"]
    assert n > 0 and res["heldout_gap_se_pts_eta2"] == pytest.approx(100 * ((p * (1 - p) + q * (1 - q)) / n) ** 0.5)
    assert res["stale_rejected_eta0"] == 0 and res["staleness_mean_eta0"] == 0.0
    assert res["meets_target"] == (res["best_speedup_at_equal_reward"] >= 2.5)
    assert Path(res["plot"]).exists()
