"""The promotion gate: paired comparisons of a candidate against the current policy.

Both policies are run on the *same* tasks and seeds, so each pair differs only by the policy.
On the current-rule slice the candidate must be better by more than noise: an exact one-sided
sign test (McNemar on the discordant pairs) at level `alpha`, with the paired-bootstrap
confidence interval reported beside it. On every other slice (older rules still in force for
scoped users, held-out tasks, the current rules with each tenant's memory recalled, as the
service serves) it must not regress beyond `tolerance`: a regression is a point drop larger than
the tolerance, or a drop the sign test calls significant.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
from scipy.stats import binomtest


@dataclass
class GateConfig:
    alpha: float = 0.05            # level of the one-sided tests
    min_improvement: float = 0.0   # required point gain on the current rules, on top of significance
    tolerance: float = 0.03        # largest allowed point drop on any other slice (3 points)
    n_bootstrap: int = 2000
    ci: float = 0.95
    seed: int = 0


@dataclass
class PairedResult:
    slice: str
    n: int
    candidate: float           # success rate of the candidate
    current: float             # success rate of the current policy
    delta: float               # candidate - current
    ci_low: float
    ci_high: float
    wins: int                  # candidate right, current wrong
    losses: int                # candidate wrong, current right
    p_better: float            # one-sided sign test: candidate better
    p_worse: float             # one-sided sign test: candidate worse


@dataclass
class GateDecision:
    promote: bool
    reasons: list[str]
    slices: dict[str, PairedResult] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"promote": self.promote, "reasons": self.reasons,
                "slices": {k: asdict(v) for k, v in self.slices.items()}}


def paired_compare(name: str, candidate: Sequence[float], current: Sequence[float],
                   cfg: GateConfig) -> PairedResult:
    """Compare per-pair outcomes (1 = success) of two policies on the same tasks and seeds."""
    a = np.asarray(candidate, dtype=float)
    b = np.asarray(current, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"slice {name!r}: {a.size} candidate outcomes vs {b.size} current; "
                         "a paired comparison needs the same tasks and seeds")
    n = int(a.size)
    if n == 0:
        return PairedResult(name, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 1.0, 1.0)
    d = a - b
    rng = np.random.default_rng(cfg.seed)
    boots = d[rng.integers(0, n, size=(cfg.n_bootstrap, n))].mean(axis=1)
    q = (1 - cfg.ci) / 2
    lo, hi = np.quantile(boots, [q, 1 - q])
    wins = int(((a > 0.5) & (b <= 0.5)).sum())
    losses = int(((a <= 0.5) & (b > 0.5)).sum())
    disc = wins + losses
    p_better = binomtest(wins, disc, 0.5, alternative="greater").pvalue if disc else 1.0
    p_worse = binomtest(losses, disc, 0.5, alternative="greater").pvalue if disc else 1.0
    return PairedResult(name, n, float(a.mean()), float(b.mean()), float(d.mean()),
                        float(lo), float(hi), wins, losses, float(p_better), float(p_worse))


def decide(slices: dict[str, tuple[Sequence[float], Sequence[float]]], cfg: GateConfig,
           primary: str = "current") -> GateDecision:
    """Promote iff `primary` improves beyond noise and no other slice regresses beyond tolerance."""
    if primary not in slices:
        raise ValueError(f"the gate needs a {primary!r} slice; got {sorted(slices)}")
    results = {k: paired_compare(k, c, o, cfg) for k, (c, o) in slices.items()}
    reasons: list[str] = []
    ok = True
    p = results[primary]
    if p.p_better < cfg.alpha and p.delta > cfg.min_improvement:
        reasons.append(f"{primary}: better by {p.delta:+.3f} ({p.wins} wins / {p.losses} losses, "
                       f"sign test p={p.p_better:.3g} < {cfg.alpha}; 95% CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}])")
    else:
        ok = False
        reasons.append(f"{primary}: not better beyond noise (delta {p.delta:+.3f}, {p.wins} wins / "
                       f"{p.losses} losses, sign test p={p.p_better:.3g} >= {cfg.alpha} or gain <= "
                       f"{cfg.min_improvement})")
    for k, r in results.items():
        if k == primary or r.n == 0:
            continue
        if r.delta < -cfg.tolerance or (r.delta < 0 and r.p_worse < cfg.alpha):
            ok = False
            reasons.append(f"{k}: regression {r.delta:+.3f} (tolerance {cfg.tolerance}, "
                           f"sign test p={r.p_worse:.3g})")
        else:
            reasons.append(f"{k}: no regression beyond tolerance (delta {r.delta:+.3f})")
    return GateDecision(ok, reasons, results)
