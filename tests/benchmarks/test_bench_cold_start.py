"""Smoke test of benchmarks/bench_cold_start.py --quick: a tiny cold start, judged by every figure."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_cold_start_quick(tmp_path):
    out = tmp_path / "cold_start.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cold_start.py"), "--quick", "--threads", "1",
                        "--run-dir", str(tmp_path / "run"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for scaffold in ("direct", "plan_act"):
        for dom in ("retail", "telecom"):
            for m in ("pass@1", "pass@2", "valid_action_rate", "coverage", "memory_success"):
                v = res[f"{scaffold}/{dom}/{m}"]
                assert 0.0 <= v <= 1.0, (scaffold, dom, m, v)
    assert res["train_steps"] == 6 and isinstance(res["target_pass@1_first_rule_met"], bool)
