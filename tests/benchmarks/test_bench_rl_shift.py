"""Smoke test of benchmarks/bench_rl_shift.py --quick: both arms run, figures are flat JSON keys, a PNG."""
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


def test_bench_rl_shift_quick(tmp_path, tiny_rl_policy):
    out = tmp_path / "bench_rl_shift.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_rl_shift.py"), "--quick", "--out", str(out),
                           "--model", tiny_rl_policy, "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert all(not isinstance(v, (dict, list)) for v in res.values())
    assert 0.0 < res["new_rule_affected_share"] <= 1.0  # the shift changes some held-out answers
    for arm in ("no_replay", "replay"):
        assert 0.0 <= res[f"{arm}_new_success_final"] <= 1.0
        assert res[f"{arm}_forgetting_pts"] == 100 * (res["old_success_before"] - res[f"{arm}_old_success_final"])
        assert res[f"{arm}_wall_s"] > 0
    curves = json.loads(Path(res["curves_file"]).read_text())
    assert curves["replay"][0]["step"] == 0 and curves["replay"][-1]["step"] == 1
    assert Path(res["plot"]).exists()
