"""Diagnostics: one JSONL row per learner step, PNG plots, and a diagnosis in words.

The rules of thumb come from the practice of agentic RL: reward variance near zero means no
gradient (look at samples and rollout counts before touching the loss); training reward rising
while held-out reward stays flat points at off-policy data or train/inference mismatch; a rising
clip fraction means the policy drifts from the behaviour policy that sampled the data.
"""
from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any, Iterable, Sequence

PLOTTED = ("reward_mean", "heldout_success", "reward_var", "zero_var_frac", "clip_frac", "drift_clip_frac",
           "masked_frac", "kl", "entropy", "distinct_tool_seqs", "logprob_mismatch", "staleness_mean")


def tool_sequence(traj: Any) -> tuple[str, ...]:
    """The tool names a trajectory called, in order (its strategy, for diversity counts)."""
    names = []
    for s in traj.steps:
        if isinstance(s.action, dict) and s.action.get("name"):
            names.append(str(s.action["name"]))
        else:
            names.append((s.action_text.split(" ", 1)[0] or "?") if s.action_text else "?")
    return tuple(names)


def group_stats(groups: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Reward mean, mean within-group variance, zero-variance fraction, distinct strategies per group."""
    if not groups:
        return {"reward_mean": 0.0, "reward_var": 0.0, "zero_var_frac": 0.0, "distinct_tool_seqs": 0.0,
                "success_rate": 0.0}
    rewards = [float(t.reward) for g in groups for t in g]
    vars_, distinct, zero = [], [], 0
    for g in groups:
        r = [float(t.reward) for t in g]
        m = mean(r)
        v = mean((x - m) ** 2 for x in r)
        vars_.append(v)
        zero += v <= 1e-12
        distinct.append(len({tool_sequence(t) for t in g}))
    return {"reward_mean": mean(rewards), "reward_var": mean(vars_), "zero_var_frac": zero / len(groups),
            "distinct_tool_seqs": mean(distinct),
            "success_rate": mean(float(t.outcome == "success") for g in groups for t in g)}


class Diagnostics:
    """Appends rows to `metrics.jsonl` (resumable: rows beyond a checkpoint are dropped on resume)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "metrics.jsonl"
        self.rows: list[dict] = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self.rows.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a crash mid-write
                    break

    def truncate(self, done: int) -> None:
        """Keep rows of the first `done` steps (a resumed run rewrites what came after its checkpoint)."""
        self.rows = [r for r in self.rows if r["step"] <= done]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def log(self, row: dict) -> None:
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def plot(self, name: str = "metrics.png") -> Path:
        return plot_rows(self.rows, self.out / name)

    def diagnosis(self) -> list[str]:
        return diagnose(self.rows)


def plot_rows(rows: Sequence[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in PLOTTED if any(r.get(k) is not None for r in rows)]
    cols = 3
    n = max(len(keys), 1)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 2.6 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, k in zip(axes.flat, keys):
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 40 else None)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("learner step", fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def series(rows: Iterable[dict], key: str) -> list[float]:
    """The logged values of `key`, in step order (steps that did not log it are skipped)."""
    return [float(r[key]) for r in rows if r.get(key) is not None]


def held_out_series(rows: Sequence[dict], key: str = "heldout_success") -> list[float]:
    """Held-out scores in step order, led by the score before any update (`<key>_start`, logged with
    step 1) where the run measured it: without it a run that never improved on its start looks flat
    from its first evaluation, and one that fell then recovered looks healthy."""
    start = rows[0].get(f"{key}_start") if rows else None
    return ([float(start)] if start is not None else []) + series(rows, key)


def _ends(xs: list[float]) -> tuple[float, float]:
    q = max(1, len(xs) // 4)
    return mean(xs[:q]), mean(xs[-q:])


def diagnose(rows: Sequence[dict]) -> list[str]:
    """The run's diagnosis by the practice's rules of thumb, most urgent first."""
    if not rows:
        return ["no learner steps were logged"]
    out: list[str] = []
    zv = series(rows, "zero_var_frac")
    if zv and mean(zv) > 0.7:
        out.append(f"reward variance near zero: {mean(zv):.0%} of groups had all-equal rewards, so most "
                   "rollouts gave no gradient. Look at samples and rollout counts first (larger groups, "
                   "action-level exploration, corrections as supervised signal, the scheduler's retire/"
                   "circuit-break thresholds, the reward itself) before changing the loss.")
    tr, ho = series(rows, "reward_mean"), held_out_series(rows)
    if len(tr) >= 4 and len(ho) >= 2:
        (t0, t1), (h0, h1) = _ends(tr), _ends(ho)
        if t1 - t0 > 0.1 and h1 - h0 < 0.03:
            out.append(f"training reward rose {t0:.2f}→{t1:.2f} but held-out stayed flat ({h0:.2f}→{h1:.2f}): "
                       "suspect off-policy data or train/inference mismatch (check logprob_mismatch, the "
                       "staleness histogram, the IS correction), or overfitting to the training tasks.")
    sl = series(rows, "sft_loss")
    if len(sl) >= 4 and len(ho) >= 2:
        (s0, s1), (h0, h1) = _ends(sl), _ends(ho)
        if s1 < 0.5 * s0 and h1 - h0 < 0.03:
            out.append(f"the supervised corrections were fitted (loss {s0:.2f}→{s1:.2f}) but held-out stayed flat "
                       f"({h0:.2f}→{h1:.2f}): they are memorised, not generalised. Get more varied corrections "
                       "(more tasks, fewer redraws of the same rows) or train longer before raising the learning rate.")
    for key in ("clip_frac", "drift_clip_frac"):
        cf = series(rows, key)
        if len(cf) >= 4:
            c0, c1 = _ends(cf)
            if c1 > 0.05 and c1 > 2 * c0 + 0.01:
                out.append(f"{key} rising ({c0:.3f}→{c1:.3f}): the policy is drifting from the behaviour policy "
                           "that sampled the data; lower the learning rate or η, or use a stronger correction.")
    mm = series(rows, "logprob_mismatch")
    if mm and mean(mm) > 0.01:
        out.append(f"mean |trainer - behaviour| logprob gap {mean(mm):.4f} per token is large: staleness or an "
                   "engine mismatch; the IS correction is doing real work (see masked_frac).")
    rej = [r.get("stale_rejected", 0) for r in rows]
    seen = [r.get("groups_seen", 0) for r in rows]
    if sum(seen) and sum(rej) / sum(seen) > 0.2:
        out.append(f"{sum(rej) / sum(seen):.0%} of groups were rejected as stale: raise η or bound the queue "
                   "tighter so rollouts do not run that far ahead.")
    ent, kl = series(rows, "entropy"), series(rows, "kl")
    t0, t1 = _ends(tr) if len(tr) >= 4 else (0.0, 0.0)
    if t1 < t0 - 0.1:
        rising = []
        for name, xs in (("KL to the reference", kl), ("token entropy", ent)):
            x0, x1 = _ends(xs) if len(xs) >= 4 else (0.0, 0.0)
            if x1 > 2 * x0 + 0.01:
                rising.append(f"{name} {x0:.3f}→{x1:.3f}")
        out.append(f"training reward fell {t0:.2f}→{t1:.2f}" + (f" while {' and '.join(rising)} rose: the policy "
                   "is collapsing away from the reference" if rising else "") + "; lower the learning rate, raise "
                   "kl_coef, and look at what the collapsed policy does (samples) before training longer.")
    if len(ent) >= 4:
        e0, e1 = _ends(ent)
        if e0 > 0 and e1 < 0.3 * e0:
            out.append(f"token entropy collapsed ({e0:.3f}→{e1:.3f}): exploration is ending; raise ε_high or the "
                       "exploration rate if reward has not plateaued at the top.")
    if len(tr) >= 4:  # t0, t1: the training reward's ends, from above
        trend = f"training reward {t0:.2f}→{t1:.2f}"
        if not out:
            out.append(f"healthy: {trend}, no rule of thumb fired.")
        else:
            out.append(trend)
    return out
