"""Report writers: every cycle and every demo leaves Markdown, JSON and a PNG in its folder."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def write_json(path: Path, obj: Any) -> None:
    """Atomic JSON write: a reader never sees half a file, a kill leaves the old one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """One JSON object a line, written atomically (a killed stage leaves the old file or none)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    """`write_jsonl`'s rows; none if the file is absent."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_cycle_report(cycle_dir: Path, report: dict) -> dict[str, Path]:
    """`report.json`, `report.md`, `report.png` (gate slices side by side) in the cycle folder."""
    cycle_dir = Path(cycle_dir)
    paths = {"json": cycle_dir / "report.json", "md": cycle_dir / "report.md",
             "png": cycle_dir / "report.png"}
    write_json(paths["json"], report)
    gate = report.get("gate") or {}
    slices = gate.get("slices", {})
    lines = [f"# Evolve cycle {report.get('cycle_id', '?')}", "",
             f"Outcome: **{report.get('outcome', '?')}**" + (" (dry run)" if report.get("dry_run") else ""), ""]
    for stage, out in (report.get("stages") or {}).items():
        summary = ", ".join(f"{k}={v}" for k, v in (out or {}).items()
                            if isinstance(v, (int, float, str, bool)) and len(str(v)) < 80)
        lines.append(f"- **{stage}**: {summary}")
    diagnosis = ((report.get("stages") or {}).get("train") or {}).get("diagnosis") or []
    if diagnosis:
        lines += ["", "## Training diagnosis", "", *diagnosis]
    selection = ((report.get("stages") or {}).get("train") or {}).get("selection") or {}
    if selection.get("scales"):
        names = list(selection["tasks"])
        lines += ["", "## Candidate selection (adapter scaled toward the base; tasks apart from the gate's)", "",
                  md_table(["scale", *[f"{k} delta (n={selection['tasks'][k]})" for k in names], "gate rule"],
                           [[s, *[d.get(k) for k in names], "promote" if float(s) in selection["passing"] else "reject"]
                            for s, d in selection["scales"].items()]),
                  "", f"Chosen: scale {selection['scale']}."]
    if slices:
        lines += ["", "## Gate (paired, same tasks and seeds)", "",
                  md_table(["slice", "n", "current", "candidate", "delta", "95% CI", "wins", "losses", "p(better)"],
                           [[k, s["n"], s["current"], s["candidate"], s["delta"],
                             f"[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}]", s["wins"], s["losses"],
                             f"{s['p_better']:.3g}"] for k, s in slices.items()]),
                  "", *[f"- {r}" for r in gate.get("reasons", [])]]
    cons = report.get("consolidation") or {}
    if cons:
        lines += ["", "## Memory consolidation", "",
                  md_table(["measure", "value"], [[k, v] for k, v in cons.items()
                                                  if isinstance(v, (int, float, str))])]
    paths["md"].write_text("\n".join(lines) + "\n")

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if slices:
        names = list(slices)
        x = np.arange(len(names))
        ax.bar(x - 0.2, [slices[k]["current"] for k in names], 0.4, label="current policy")
        ax.bar(x + 0.2, [slices[k]["candidate"] for k in names], 0.4, label="candidate")
        ax.set_xticks(x, names)
        ax.set_ylim(0, 1.05)
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no gate evaluation in this cycle", ha="center", va="center")
    ax.set_ylabel("success rate")
    ax.set_title(f"cycle {report.get('cycle_id', '?')}: {report.get('outcome', '?')}")
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=100)
    plt.close(fig)
    return paths


def plot_arms(path: Path, arms: dict[str, Sequence[float]], shifts: Sequence[int] = (),
              promotions: Sequence[int] = (), window: int = 10, title: str = "") -> Path:
    """Success over episodes (rolling mean) for each arm, shifts and promotions marked."""
    from dynamic_bench.metrics import rolling

    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, ys in arms.items():
        ax.plot(np.arange(len(ys)), rolling(ys, window), label=name, lw=1.8)
    for i, s in enumerate(shifts):
        ax.axvline(s, color="red", ls="--", lw=1, label="rule shift" if i == 0 else None)
    for i, p in enumerate(promotions):
        ax.axvline(p, color="green", ls=":", lw=1.5, label="promotion" if i == 0 else None)
    ax.set_xlabel("episode")
    ax.set_ylabel(f"success (rolling mean, window {window})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
