"""`evolve demo` end to end at the tiny size: service, simulated users, memory, one cycle, report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_demo_tiny_end_to_end(tmp_path):
    out = tmp_path / "demo"
    evolve = str(Path(sys.executable).parent / "evolve")
    p = subprocess.run([evolve, "demo", "--preset", "tiny", "--mode", "full", "--out", str(out),
                        "--cycle-set", "distill_tasks=6"],
                       capture_output=True, text=True, timeout=1700,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    rep = json.loads((out / "report.json").read_text())
    assert rep["mode"] == "full"
    n = rep["episodes"]
    assert set(rep["arms"]) == {"static policy", "memory only", "memory + evolve"}
    for name, ys in rep["curves"].items():
        assert len(ys) == n, name
    # the arms share the stream up to the cycle, then diverge only after it
    assert rep["curves"]["memory only"][:rep["cycle_at"]] == rep["curves"]["memory + evolve"][:rep["cycle_at"]]
    assert rep["gate"]["outcome"] in ("promoted", "rejected", "nothing-to-learn")
    for k in ("aulc", "recovery_episodes", "recovery_episodes_changed", "success_changed", "success_rate"):
        assert all(k in a for a in rep["arms"].values())
    assert (out / "curve.png").stat().st_size > 0 and (out / "report.md").read_text().startswith("# Evolve demo")
    assert Path(rep["cycle_report"]).exists()
    # the cycle ran with the setting given on the command line, over the tiny size's 8
    assert rep["config"]["cycle"] == {"distill_tasks": 6}
    assert rep["cycle_config"]["distill_tasks"] == 6 and rep["cycle_config"]["gate_tasks"] == 4  # tiny's table
    state = json.loads(next((out / "service" / "cycles").glob("cycle-*/state.json")).read_text())
    assert state["stages"]["experience"]["output"]["distill_tasks"] == 6
    # after the cycle, every policy on the same fresh tasks under the latest rules, tiny's 4
    after = rep["after_cycle_fresh_tasks"]
    assert after["tasks"] == 4 and all(len(v) == 4 for v in after["outcomes"].values())
    assert after["paired"]["n"] == 4 and after["paired"]["delta"] == pytest.approx(
        after["success"]["candidate, no memory"] - after["success"]["memory only (cold-start + memory)"])
    assert "fresh test tasks under the latest rules" in (out / "report.md").read_text()
    assert "curve:" in p.stdout
