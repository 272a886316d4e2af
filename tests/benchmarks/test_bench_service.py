"""Smoke test of benchmarks/bench_service.py --quick: it runs, writes the figures, no errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_service_quick(tmp_path):
    out = tmp_path / "bench_service.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_service.py"), "--quick", "--out", str(out),
                        "--users", "1,4", "--work-dir", str(ROOT / "runs" / "bench_service")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["errors"] == 0
    for n in (1, 4):
        assert r[f"u{n}_turns"] >= n and r[f"u{n}_turn_p50_s"] > 0 and r[f"u{n}_turn_p99_s"] >= r[f"u{n}_turn_p50_s"]
        assert r[f"u{n}_turns_per_s"] > 0
    assert r["bare_engine_call_s"] > 0 and r["overhead_ratio"] > 0
