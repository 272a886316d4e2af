"""`evolve demo` (what `make demo` runs): the whole loop on one machine, on embedded defaults.

Full demo: cold-start policy → service → simulated users drive a silent-shift drift stream over
HTTP (memory adapts online) → `evolve cycle` → traffic continues on the promoted policy → report
with three arms (static policy, memory only, memory + evolve). When a part of the stack is not
importable the demo says which, and runs the DriftBench baseline agents over the same stream
instead (oracle, stale, random), so `make demo` always produces a table and a curve.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evolve.report import md_table, plot_arms, write_json

FULL_STACK = ("training.coldstart", "training.rollout", "training.rl", "memory", "runtime.service", "evolve.demo_full")


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    preset: str = "small"      # small: the demo; tiny: the end-to-end test
    domain: str = "retail"
    stream: str = "silent"
    episodes: int = 0          # 0: the preset's default
    seed: int = 0
    mode: str = "auto"         # auto | full | baseline
    policy: str = ""           # an existing policy folder to use instead of building the cold-start one
    cycle: dict[str, Any] = field(default_factory=dict)  # CycleConfig fields for the cycle, over the size table's

    def n_episodes(self) -> int:
        return self.episodes or {"tiny": 16, "small": 120}.get(self.preset, 120)


def missing_parts() -> list[str]:
    out = []
    for mod in FULL_STACK:
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any import failure means the part is not usable
            out.append(f"{mod} ({type(e).__name__}: {e})")
    return out


def arm_metrics(successes: list[float], stream, window: int) -> dict[str, Any]:
    """Recovery (over all episodes and over those the shift changed), AULC, per-phase success and
    success on the changed episodes of one arm's per-episode outcomes."""
    from dynamic_bench import metrics

    changed = metrics.changed_episodes(stream)
    ph = [{"phase": k, "version": p["version"], "success_rate":
           (sum(successes[p["start"]:p["end"]]) / max(1, p["end"] - p["start"]))} for k, p in enumerate(stream.phases)]
    hit = [x for x, c in zip(successes, changed) if c]
    return {"success_rate": sum(successes) / max(1, len(successes)), "aulc": metrics.aulc(successes, window),
            "recovery_episodes": metrics.recovery_episodes(successes, stream, window),
            "recovery_episodes_changed": metrics.recovery_episodes(successes, stream, window, only=changed),
            "success_changed": sum(hit) / len(hit) if hit else None, "n_changed": len(hit), "phases": ph}


def recovery_text(recoveries: list[int | None], stream) -> str:
    """Per shift, episodes to recover; "never" where `metrics.recovery_episodes` hit its cap (the
    phase's length), "n/a" where the phase held no episode to judge."""
    caps = [p["end"] - p["start"] for p in stream.phases[1:]]
    return ", ".join("n/a" if r is None else "never" if r >= cap else str(r) for r, cap in zip(recoveries, caps))


def run_baseline(cfg: DemoConfig, why: list[str]) -> dict[str, Any]:
    """The issue-2 stand-in: DriftBench's baseline agents over the demo's drift stream."""
    from rich.progress import Progress

    from dynamic_bench import AGENTS, make_stream, metrics, run_stream

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    stream = make_stream(cfg.stream, cfg.domain, cfg.n_episodes(), cfg.seed)
    window = metrics.default_window(len(stream))
    arms: dict[str, list[float]] = {}
    with Progress() as bar:
        for name in ("oracle", "stale", "random"):
            job = bar.add_task(f"{name} on {cfg.domain}/{cfg.stream}", total=len(stream))
            res = run_stream(AGENTS[name](seed=cfg.seed), stream, on_episode=lambda r: bar.advance(job))
            arms[name] = [float(r["success"]) for r in res]
    shifts = [s["index"] for s in stream.shifts]
    png = plot_arms(out / "curve.png", arms, shifts=shifts, window=window,
                    title=f"DriftBench baselines on {cfg.domain}/{cfg.stream} (stand-in demo)")
    table = {name: arm_metrics(ys, stream, window) for name, ys in arms.items()}
    report = {"mode": "baseline", "missing": why, "config": asdict(cfg), "window": window, "shifts": shifts,
              "arms": table, "curves": arms, "wall_s": time.time() - t0}
    rows = [[n, t["success_rate"], t["aulc"], recovery_text(t["recovery_episodes_changed"], stream),
             recovery_text(t["recovery_episodes"], stream)]
            + [p["success_rate"] for p in t["phases"]] for n, t in table.items()]
    header = ["agent", "success", "AULC", "recovery (changed tasks)", "recovery (all episodes)"] + [
        f"phase {k} (v{p['version']})" for k, p in enumerate(stream.phases)]
    md = "\n".join(["# Evolve demo (stand-in: DriftBench baselines)", "",
                    "The full loop needs: " + ("; ".join(why) if why else "(nothing missing)"), "",
                    md_table(header, rows), "", f"![curve]({png.name})", ""])
    (out / "report.md").write_text(md)
    write_json(out / "report.json", report)
    report["summary_text"] = md_table(header, rows) + f"\n\ncurve: {png}\nreport: {out / 'report.md'}"
    return report


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    why = missing_parts() if cfg.mode != "baseline" else ["--mode baseline"]
    if cfg.mode == "full" and why:
        raise RuntimeError("the full demo needs: " + "; ".join(why))
    if why:
        return run_baseline(cfg, why)
    from evolve.demo_full import run_full

    return run_full(cfg)
