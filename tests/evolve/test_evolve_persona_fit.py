"""The simulator's fit recovers known persona parameters from synthetic logs, and validates."""
import random

import pytest

from dynamic_bench.personas import DECISIONS, Persona
from evolve.simulator.fit import FeedbackRecord, fit, validate
from evolve.simulator.persona import SimPersona

TOOLS = ("refund", "exchange", "escalate")
TRUE = SimPersona(Persona("known", {
    ("refund", True): {"approve": 0.85, "reject": 0.0, "edit": 0.0, "takeover": 0.15},
    ("refund", False): {"approve": 0.1, "reject": 0.3, "edit": 0.4, "takeover": 0.2},
    ("exchange", False): {"approve": 0.5, "reject": 0.5, "edit": 0.0, "takeover": 0.0},
    ("*", True): {"approve": 0.9, "reject": 0.0, "edit": 0.1, "takeover": 0.0},
    ("*", False): {"approve": 0.0, "reject": 0.25, "edit": 0.5, "takeover": 0.25},
}), patience=6, volunteer=0.3)


def synthetic_log(persona: SimPersona, n: int, seed: int) -> tuple[list[FeedbackRecord], list[int]]:
    """Logs as the service would record them: judgement → the persona's answer (+ volunteered?)."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        tool, correct = rng.choice(TOOLS), rng.random() < 0.5
        j = {"tool": tool, "correct": correct, "action_text": f"{tool} {{}}",
             "correct_write": f'{tool} {{"fixed":1}}'}
        d = persona.decide(j, rng)
        vol = persona.volunteers(rng) if d.kind != "approve" else None
        recs.append(FeedbackRecord(tool, correct, d.kind, vol, trajectory_id=f"t{i}"))
    quits = [persona.patience + rng.randrange(0, 3) for _ in range(20)]
    return recs, quits


def effective(p: SimPersona, tool: str, correct: bool) -> dict[str, float]:
    """What a log can show: a persona's edit of a right action is recorded as an approval."""
    q = dict(p.base.probs(tool, correct))
    if correct:
        q["approve"] += q.pop("edit")
        q["edit"] = 0.0
    return q


def test_fit_recovers_known_parameters():
    recs, quits = synthetic_log(TRUE, 12000, seed=1)
    f = fit(recs, quit_turns=quits)
    for tool in TOOLS:
        for correct in (True, False):
            got, want = f.cell(tool, correct), effective(TRUE, tool, correct)
            n = sum(f.counts[(tool, correct)].values())
            assert n > 1500
            for k in DECISIONS:
                assert got[k] == pytest.approx(want[k], abs=0.035), (tool, correct, k)
    assert f.volunteer == pytest.approx(TRUE.volunteer, abs=0.03)
    assert f.patience == TRUE.patience


def test_fitted_persona_round_trips_and_validates():
    recs, quits = synthetic_log(TRUE, 4000, seed=2)
    sim = fit(recs, quit_turns=quits).to_persona("fitted")
    again = SimPersona.from_dict(sim.to_dict())
    assert again.base.propensities == sim.base.propensities and again.patience == sim.patience
    # Same judgements answered by the fitted persona (through DriftBench's decide): no difference.
    rep = validate(recs, fit(recs), seed=3,
                   sampler=lambda tool, c, rng: sim.decide({"tool": tool, "correct": c, "action_text": "x",
                                                            "correct_write": "y"}, rng).kind)
    assert set(rep) == set(TOOLS)
    for r in rep.values():
        assert r["p_chi2"] > 0.001 and r["tv_distance"] < 0.06


def test_validation_detects_a_wrong_persona():
    recs, _ = synthetic_log(TRUE, 3000, seed=4)
    wrong = SimPersona(Persona("always-approve", {("*", True): {"approve": 1.0}, ("*", False): {"approve": 1.0}}))
    rep = validate(recs, fit(recs), seed=5, n_perm=200,
                   sampler=lambda tool, c, rng: wrong.decide({"tool": tool, "correct": c, "action_text": "x",
                                                              "correct_write": "y"}, rng).kind)
    for r in rep.values():
        assert r["p_chi2"] < 1e-6 and r["p_permutation"] < 0.01


def test_unknown_feedback_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown feedback kinds"):
        fit([FeedbackRecord("refund", True, "shrug")])
