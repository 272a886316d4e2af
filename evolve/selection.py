"""Candidate selection: how much of the trained adapter the cycle puts before the gate.

A LoRA fine-tune that learns a shifted rule can also move what it should have kept: on the demo
(build E, seed 0) the candidate gained ~20 points on the current rules and lost ~7 on old-rule
tasks both rule versions answer the same way, so the gate rejected it. Interpolating the weights
toward the base policy (WiSE-FT: `training.policy.scale_adapter`) trades some of the gain for what
was lost. Here the adapter at each of `CycleConfig.select_scales` plays tasks of the gate's slices
drawn apart from the gate's own (purpose "select": the gate stays an independent test), beside the
serving policy (the with-memory slice shown the notes the runtime would recall), and the gate's own
rule (`evolve.gate.decide`) picks: among the scales it would promote, the one with the largest gain
on the current rules; when it would promote none, the one whose worst slice loses least (ties: the
larger scale). Each cycle's adapter is trained on the base policy, so scale 0 is the base.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from evolve.gate import GateConfig, GateDecision, decide


def select_scale(cfg, draw_tasks: Callable[[], tuple[dict[str, list], dict[str, list]]], adapter: Path,
                 serving: tuple[str | None, str], out: Path) -> tuple[Path, dict[str, Any]]:
    """(the adapter to register, what was measured). `draw_tasks` gives the slices and the notes
    shown per slice (`evolve.stages.judged_slices`). Cached in `out/selection.json`, so a cycle
    resumed after this point chooses the same scale without playing the tasks again."""
    from evolve.report import write_json
    from evolve.stages import evaluate
    from training.policy import scale_adapter

    scales = sorted({float(s) for s in cfg.select_scales}, reverse=True)
    if scales == [1.0]:
        return adapter, {}
    record = out / "selection.json"
    if record.exists():
        done = json.loads(record.read_text())
        return (adapter if done["scale"] == 1.0 else out / f"scale-{done['scale']}"), done
    paths = {s: adapter if s == 1.0 else scale_adapter(adapter, out / f"scale-{s}", s) for s in scales}
    slices, notes = draw_tasks()
    outcomes = evaluate(cfg, [serving] + [(str(p), f"select-{s}") for s, p in paths.items()], slices,
                        seed=cfg.seed * 11 + 3, memory=notes)
    ref = outcomes[0]
    chosen, verdicts = choose_scale(ref, dict(zip(scales, outcomes[1:], strict=True)), cfg.gate_config())
    done = {"scale": chosen, "tasks": {k: len(v) for k, v in slices.items()},
            "passing": [s for s in scales if verdicts[s].promote],
            "serving": {k: sum(v) / max(1, len(v)) for k, v in ref.items()},
            "scales": {str(s): {k: round(r.delta, 4) for k, r in verdicts[s].slices.items()} for s in scales}}
    write_json(record, done)
    return paths[chosen], done


def choose_scale(serving: dict[str, list[int]], per_scale: dict[float, dict[str, list[int]]],
                 gate_cfg: GateConfig) -> tuple[float, dict[float, GateDecision]]:
    """The scale to put before the gate, from each scale's outcomes and the serving policy's on the
    same tasks (per slice, "current" among them), and the gate's decision for each scale."""
    verdicts = {s: decide({k: (o[k], serving[k]) for k in serving}, gate_cfg) for s, o in per_scale.items()}
    passing = [s for s, v in verdicts.items() if v.promote]
    if passing:
        return max(passing, key=lambda s: (verdicts[s].slices["current"].delta, s)), verdicts
    return max(verdicts, key=lambda s: (min(r.delta for r in verdicts[s].slices.values()), s)), verdicts
