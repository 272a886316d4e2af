"""Smoke test of benchmarks/bench_env.py --quick: it runs, and writes the figures as flat JSON keys."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_env_quick_writes_flat_json(tmp_path):
    out = tmp_path / "bench_env.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_env.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert all(not isinstance(v, (dict, list)) for v in res.values())  # flat keys
    for d in ("retail", "telecom"):
        assert res[f"oracle_steps_per_s_{d}"] > 0 and res[f"runtime_mode_steps_per_s_{d}"] > 0
        assert 2 <= res[f"steps_per_episode_{d}"] <= 6
    assert res["oracle_steps_per_s"] == min(res["oracle_steps_per_s_retail"], res["oracle_steps_per_s_telecom"])
    assert res["meets_target"] == (res["oracle_steps_per_s"] >= res["target_steps_per_s"] == 5000)
    assert res["bench_version"].startswith("driftbench-")
