"""`evolve bench list|policy|run` through the real typer app."""
import json

from typer.testing import CliRunner

from evolve.cli import app

runner = CliRunner()


def test_bench_list_and_policy():
    out = runner.invoke(app, ["bench", "list"])
    assert out.exit_code == 0 and "driftbench/retail-v1" in out.stdout and "tool-drift" in out.stdout
    out = runner.invoke(app, ["bench", "policy", "--domain", "telecom", "--version", "3"])
    assert out.exit_code == 0 and "at least 6 hours" in out.stdout and "set_line_status" in out.stdout
    out = runner.invoke(app, ["bench", "policy", "--domain", "retail", "--version", "9"])
    assert out.exit_code != 0 and "no rule version 9" in out.output


def test_bench_run_writes_result_and_curve(tmp_path):
    out = runner.invoke(app, ["bench", "run", "--agent", "stale", "--domain", "retail", "--stream", "silent",
                              "--episodes", "60", "--seed", "3", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    res = json.loads((tmp_path / "result.json").read_text())
    for key in ("bench_version", "success_rate", "phases", "recovery_episodes", "stale_violation_rate", "pass_k",
                "aulc"):
        assert key in res
    assert res["phases"][0]["success_rate"] == 1.0 and res["phases"][1]["success_rate"] < 1.0
    assert set(res["pass_k"]) == {"1", "2", "3", "4"}
    png = (tmp_path / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    bad = runner.invoke(app, ["bench", "run", "--agent", "genius", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "unknown agent" in bad.output
