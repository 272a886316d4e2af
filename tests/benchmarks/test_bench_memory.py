"""Smoke test: `benchmarks/bench_memory.py --quick` runs and writes the figures the issue names."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_memory_quick_writes_the_named_figures(tmp_path):
    out = tmp_path / "bench_memory.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--quick",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for n in res["sizes"]:
        for key in ("write_items_per_s", "search_p50_ms", "search_p95_ms", "rollback_s",
                    "rollback_undo_adds_s", "rebuild_s", "duplicate_rate", "cross_tenant_hits",
                    "hits_after_forget"):
            assert isinstance(res[f"n{n}_{key}"], (int, float)), key
        assert res[f"n{n}_search_p50_ms"] <= res[f"n{n}_search_p95_ms"]
        assert res[f"n{n}_cross_tenant_hits"] == 0 and res[f"n{n}_hits_after_forget"] == 0
        assert res[f"n{n}_duplicate_rate"] <= 0.01 and res[f"n{n}_rebuild_re_embedded"] == 0
        assert res[f"n{n}_items_stored"] == n
    assert res["target_search_p95_ms"] == 60.0
