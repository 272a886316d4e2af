"""Continual-learning metrics over a stream's per-episode results.

- pass^k (tau-bench): the chance that k independent trials of a task all succeed, estimated
  without bias as the mean over tasks of C(c, k) / C(n, k) (n trials, c successes).
- Success per phase; recovery episodes after each shift (episodes until the success over a
  window is back to >= 90% of the pre-shift plateau, capped at the phase length), over all
  episodes and over the episodes the shift changed (those acting on older rules gets wrong);
  the stale-violation rate in the window after each shift.
- Forgetting and backward transfer over rule versions, from a phase x version success matrix.
- AULC: the area under the (trailing-window) success curve, normalised to [0, 1].
"""
from __future__ import annotations

from math import comb
from typing import Any, Mapping, Sequence

from dynamic_bench.env import BENCH_VERSION
from dynamic_bench.streams import Stream
from dynamic_bench.tasks import old_rules_fail

Matrix = Mapping[int, Mapping[int, float]]  # phase -> version -> success rate


def pass_hat_k(trials: Mapping[str, Sequence[bool]] | Sequence[Sequence[bool]], k: int) -> float | None:
    """Unbiased pass^k: mean over tasks with >= k trials of C(c, k) / C(n, k); None if no such task."""
    rows = trials.values() if isinstance(trials, Mapping) else trials
    vals = [comb(sum(map(bool, r)), k) / comb(len(r), k) for r in rows if len(r) >= k]
    return sum(vals) / len(vals) if vals else None


def pass_k_table(trials: Mapping[str, Sequence[bool]], ks: Sequence[int] = (1, 2, 3, 4)) -> dict[str, float | None]:
    return {str(k): pass_hat_k(trials, k) for k in ks}


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def rolling(xs: Sequence[float], window: int) -> list[float]:
    """Trailing mean (partial windows at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def aulc(successes: Sequence[float], window: int) -> float:
    """Normalised area under the trailing-window success curve."""
    return float(sum(rolling(successes, window)) / len(successes)) if successes else 0.0


def phase_success(results: Sequence[dict], stream: Stream) -> list[dict[str, Any]]:
    out = []
    for k, ph in enumerate(stream.phases):
        xs = [float(r["success"]) for r in results if r["phase"] == k]
        out.append({"phase": k, "start": ph["start"], "end": ph["end"], "version": ph["version"], "kind": ph["kind"],
                    "n": len(xs), "success_rate": _mean(xs)})
    return out


def recovery_episodes(successes: Sequence[float], stream: Stream, window: int,
                      only: Sequence[bool] | None = None) -> list[int | None]:
    """Per shift: episodes after it until a window's success is >= 90% of the pre-shift plateau
    (capped at the phase length: never). Windows are full: a few lucky episodes at the end of a
    phase are not a recovery. With `only` (a flag per episode), a window is the next
    `window` flagged episodes of the phase, and the count runs from the phase's first flagged
    episode (the shift's first visible effect) to the window's first; None for a phase without
    flagged episodes. `only=changed_episodes(stream)` measures recovery on what the
    shift changed: over all episodes, a window that happens to hold few changed tasks "recovers"
    a policy that never adapted."""
    out: list[int | None] = []
    for k in range(1, len(stream.phases)):
        prev, ph = stream.phases[k - 1], stream.phases[k]
        before = successes[max(prev["start"], ph["start"] - window):ph["start"]]
        target = 0.9 * (sum(before) / len(before) if before else 0.0)
        idx = [i for i in range(ph["start"], ph["end"]) if only is None or only[i]]
        if not idx:
            out.append(None)
            continue
        rec = ph["end"] - ph["start"]
        for j in range(max(1, len(idx) - window + 1)):  # full windows (all of them, if fewer)
            w = [successes[i] for i in idx[j:j + window]]
            if sum(w) / len(w) >= target - 1e-12:
                rec = idx[j] - (ph["start"] if only is None else idx[0])
                break
        out.append(rec)
    return out


def changed_episodes(stream: Stream) -> list[bool]:
    """Per episode: whether acting on older rules gets it wrong (`dynamic_bench.tasks.old_rules_fail`)."""
    return [old_rules_fail(ep.task) for ep in stream.episodes]


def stale_violation_rates(results: Sequence[dict], stream: Stream, window: int) -> list[float | None]:
    """Per shift: the fraction of episodes in the window after it with at least one stale violation."""
    out = []
    for ph in stream.phases[1:]:
        w = results[ph["start"]:min(ph["start"] + window, ph["end"])]
        out.append(_mean([float(r["n_stale"] > 0) for r in w]))
    return out


def success_matrix(results: Sequence[dict]) -> dict[int, dict[int, float]]:
    """Phase -> rule version -> success rate of the episodes run under that version in that phase."""
    acc: dict[int, dict[int, list[float]]] = {}
    for r in results:
        acc.setdefault(r["phase"], {}).setdefault(r["version"], []).append(float(r["success"]))
    return {p: {v: sum(xs) / len(xs) for v, xs in vs.items()} for p, vs in acc.items()}


def backward_transfer(m: Matrix) -> float | None:
    """Mean over versions first seen before the last phase and seen again in it: R[last][v] - R[first][v]."""
    if not m:
        return None
    last = max(m)
    diffs = []
    for v, acc in m[last].items():
        first = min((p for p in m if v in m[p]), default=last)
        if first < last:
            diffs.append(acc - m[first][v])
    return _mean(diffs)


def forgetting(m: Matrix) -> float | None:
    """Mean over versions seen before the last phase and in it: best earlier success minus the last one."""
    if not m:
        return None
    last = max(m)
    drops = [max(m[p][v] for p in m if p < last and v in m[p]) - acc
             for v, acc in m[last].items() if any(p < last and v in m[p] for p in m)]
    return _mean(drops)


def default_window(n_episodes: int) -> int:
    return max(3, min(20, n_episodes // 10))


def summarize(results: Sequence[dict], stream: Stream, *, window: int | None = None,
              pass_trials: Mapping[str, Sequence[bool]] | None = None, **extra: Any) -> dict[str, Any]:
    """Everything `evolve bench run` writes to result.json (the bench version included)."""
    window = window or default_window(len(results))
    succ = [float(r["success"]) for r in results]
    stale_rates = stale_violation_rates(results, stream, window)
    pooled = [x for x in stale_rates if x is not None]
    m = success_matrix(results)
    return {"bench_version": BENCH_VERSION, "domain": stream.domain, "stream": stream.name, "seed": stream.seed,
            "n_episodes": len(results), "window": window, "success_rate": _mean(succ) or 0.0,
            "phases": phase_success(results, stream), "shifts": stream.shifts,
            "recovery_episodes": recovery_episodes(succ, stream, window),
            "recovery_episodes_changed": recovery_episodes(succ, stream, window, only=changed_episodes(stream)),
            "stale_violation_rate": _mean(pooled) if pooled else 0.0, "stale_violation_rate_per_shift": stale_rates,
            "stale_violations_total": sum(r["n_stale"] for r in results),
            "pass_k": pass_k_table(pass_trials) if pass_trials else {},
            "aulc": aulc(succ, window), "success_matrix": {str(p): {str(v): a for v, a in vs.items()}
                                                           for p, vs in m.items()},
            "forgetting": forgetting(m), "backward_transfer": backward_transfer(m),
            "curve": rolling(succ, window), **extra}
