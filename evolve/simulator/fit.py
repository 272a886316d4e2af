"""Fit persona parameters from logged feedback, and check the fit against the log.

The parameters are those of DriftBench's personas (`dynamic_bench.personas`): for each action
type (tool) × correctness cell, a distribution over the user's answer (approve / reject / edit
/ take over); plus patience in turns and how often the user volunteers information
(`evolve.simulator.persona.SimPersona`). Note what a log can identify: a DriftBench persona
that "edits" a right action leaves it unchanged, which the log records as an approval, so for
right actions only approve+edit together is identifiable. The
maximum-likelihood estimate of a categorical cell is its empirical frequency, so the fit is
counting; cells never observed fall back to the pooled distribution of the same correctness.
Validation simulates one answer per logged judgement from the fitted persona and compares the
two samples per action type with a chi-square test of homogeneity and a permutation test.
"""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy.stats import chi2_contingency

from dynamic_bench.personas import DECISIONS as KINDS
from dynamic_bench.personas import Persona
from evolve.simulator.persona import SimPersona


@dataclass(frozen=True)
class FeedbackRecord:
    """One logged answer to a proposed write action, with the judge's verdict on that action."""

    action_type: str
    correct: bool
    kind: str
    volunteered: bool | None = None     # did the user add information (a reason, the rule)?
    user_id: str = ""
    trajectory_id: str = ""


@dataclass
class FittedPersona:
    propensities: dict[tuple[str, bool], dict[str, float]]
    counts: dict[tuple[str, bool], dict[str, int]]
    volunteer: float
    patience: int | None = None
    n_records: int = 0
    fallback: dict[bool, dict[str, float]] = field(default_factory=dict)

    def cell(self, action_type: str, correct: bool) -> dict[str, float]:
        return self.propensities.get((action_type, correct)) or self.fallback[correct]

    def to_persona(self, name: str = "fitted", default_patience: int = 10) -> SimPersona:
        """The fit as a simulator persona (DriftBench propensities, `*` cells = pooled fallback)."""
        props = {**{("*", c): p for c, p in self.fallback.items()}, **self.propensities}
        return SimPersona(Persona(name, props), self.patience or default_patience, self.volunteer)

    def to_dict(self) -> dict:
        return {"propensities": {f"{a}|{'correct' if c else 'wrong'}": p
                                 for (a, c), p in sorted(self.propensities.items())},
                "counts": {f"{a}|{'correct' if c else 'wrong'}": p
                           for (a, c), p in sorted(self.counts.items())},
                "volunteer": self.volunteer, "patience": self.patience, "n_records": self.n_records}


def _normalise(c: Counter) -> dict[str, float]:
    n = sum(c.values())
    return {k: (c[k] / n if n else 1.0 / len(KINDS)) for k in KINDS}


def fit(records: Iterable[FeedbackRecord], quit_turns: Sequence[int] = ()) -> FittedPersona:
    """Maximum-likelihood persona parameters from logged feedback.

    `quit_turns`: the turn at which users gave up, for episodes that ended that way; a
    deterministic patience P is consistent with every quit at turn ≥ P, so its MLE is the
    smallest observed quit turn (None when nobody quit).
    """
    records = list(records)
    bad = {r.kind for r in records} - set(KINDS)
    if bad:
        raise ValueError(f"unknown feedback kinds {sorted(bad)}; expected {KINDS}")
    cells: dict[tuple[str, bool], Counter] = defaultdict(Counter)
    pooled: dict[bool, Counter] = {True: Counter(), False: Counter()}
    for r in records:
        cells[(r.action_type, r.correct)][r.kind] += 1
        pooled[r.correct][r.kind] += 1
    vol = [r.volunteered for r in records if r.volunteered is not None and r.kind != "approve"]
    return FittedPersona(
        propensities={k: _normalise(c) for k, c in cells.items()},
        counts={k: {kk: c[kk] for kk in KINDS} for k, c in cells.items()},
        volunteer=float(np.mean(vol)) if vol else 0.0,
        patience=min(quit_turns) if quit_turns else None,
        n_records=len(records),
        fallback={c: _normalise(pooled[c]) for c in (True, False)},
    )


def sample_kind(p: FittedPersona, action_type: str, correct: bool, rng: random.Random) -> str:
    probs = p.cell(action_type, correct)
    return rng.choices(KINDS, weights=[probs[k] for k in KINDS])[0]


def _permutation_p(a: Sequence[str], b: Sequence[str], rng: np.random.Generator, n_perm: int) -> float:
    """Two-sample permutation test on the total-variation distance between kind frequencies."""
    pool = np.array([KINDS.index(k) for k in list(a) + list(b)])
    na = len(a)

    def tv(x: np.ndarray) -> float:
        ca = np.bincount(x[:na], minlength=len(KINDS)) / max(na, 1)
        cb = np.bincount(x[na:], minlength=len(KINDS)) / max(len(x) - na, 1)
        return 0.5 * float(np.abs(ca - cb).sum())

    obs = tv(pool)
    hits = sum(tv(rng.permutation(pool)) >= obs - 1e-12 for _ in range(n_perm))
    return (hits + 1) / (n_perm + 1)


def validate(records: Sequence[FeedbackRecord], persona: FittedPersona, seed: int = 0,
             sampler: Callable[[str, bool, random.Random], str] | None = None,
             n_perm: int = 500) -> dict[str, dict]:
    """Per action type: logged vs simulated answer distributions, chi-square and permutation p.

    The simulated sample answers the *same* judgements as the log (same action types and
    correctness), so a difference is the persona's, not the agent's. `sampler` defaults to
    the fitted cell probabilities; pass DriftBench's persona `decide` to validate that path.
    """
    rng = np.random.default_rng(seed)
    srng = random.Random(seed)
    draw = sampler or (lambda a, c, g: sample_kind(persona, a, c, g))
    by_type: dict[str, list[FeedbackRecord]] = defaultdict(list)
    for r in records:
        by_type[r.action_type].append(r)
    out: dict[str, dict] = {}
    for atype, recs in sorted(by_type.items()):
        logged = [r.kind for r in recs]
        sim = [draw(atype, r.correct, srng) for r in recs]
        cl, cs = Counter(logged), Counter(sim)
        cols = [k for k in KINDS if cl[k] + cs[k] > 0]
        if len(cols) > 1:
            chi2, p_chi2, dof, _ = chi2_contingency(np.array([[cl[k] for k in cols], [cs[k] for k in cols]]))
        else:
            chi2, p_chi2, dof = 0.0, 1.0, 0
        out[atype] = {"n": len(recs), "logged": {k: cl[k] / len(recs) for k in KINDS},
                      "simulated": {k: cs[k] / len(recs) for k in KINDS},
                      "tv_distance": 0.5 * sum(abs(cl[k] - cs[k]) for k in KINDS) / len(recs),
                      "chi2": float(chi2), "dof": int(dof), "p_chi2": float(p_chi2),
                      "p_permutation": _permutation_p(logged, sim, rng, n_perm)}
    return out
