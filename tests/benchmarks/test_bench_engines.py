"""Smoke test of benchmarks/bench_engines.py --quick: it runs and writes the named figures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_engines_quick(tmp_path):
    out = tmp_path / "engines.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_engines.py"), "--quick", "--threads", "1",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("torch/tokens_per_s@1", "torch/tokens_per_s@8", "torch/logprob_mismatch_mean",
                "torch/logprob_mismatch_max", "torch/logprob_mismatch_max_adapter", "torch/hot_swap_pause_ms"):
        assert key in res and res[key] >= 0, key
    assert res["torch/tokens_per_s@8"] > 0
    assert res["torch/logprob_mismatch_max"] < 1e-4
