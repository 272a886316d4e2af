"""Action-level exploration: the proposal comes from the prompt, and behaviour logprobs stay honest."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from training.engines.base import SamplingParams
from training.rl.explore import ExploringEngine, proposal_from_prompt

PROMPT = ("<|system|>retail policy\n- Refunds within 30 days. End with a reply that states the outcome: "
          "refunded, denied or escalated.\n<|tools|>get_order(order_id:str)\n"
          "refund_order(order_id:str, reason:damaged|unwanted)\n<|user|>refund O-1042 please<|obs|>"
          "order O-1042 placed 12 days ago, customer C-7<|assistant|>")


def test_proposal_parses_tools_ids_and_outcomes():
    prop = proposal_from_prompt(PROMPT)
    assert [t[0] for t in prop.tools] == ["get_order", "refund_order"]
    assert dict(prop.tools[1][1])["reason"] == ["damaged", "unwanted"]
    assert dict(prop.tools[0][1])["order_id"] == ["C-7", "O-1042"]
    assert prop.replies == ["refunded", "denied", "escalated"]
    # u is a distribution: enumerate every action it can produce
    actions = ['get_order {"order_id":"%s"}' % i for i in ("C-7", "O-1042")]
    actions += ['refund_order {"order_id":"%s","reason":"%s"}' % (i, r)
                for i, r in itertools.product(("C-7", "O-1042"), ("damaged", "unwanted"))]
    actions += ['reply {"text":"%s"}' % w for w in prop.replies]
    assert sum(prop.prob(a) for a in actions) == pytest.approx(1.0)
    assert prop.prob('cancel_order {"order_id":"O-1042"}') == 0.0
    rng = random.Random(0)
    for _ in range(20):
        text, u = prop.draw(rng)
        assert u == pytest.approx(prop.prob(text)) and u > 0


@pytest.mark.parametrize("mode", ["policy", "mixture"])
def test_substituted_actions_carry_engine_scored_logprobs(tiny_policy, mode):
    from training.engines.torch_engine import TorchEngine
    from runtime.scaffolds import get as get_scaffold
    from training.policy import stop_token_ids

    inner = TorchEngine(tiny_policy, seed=0)
    tok = inner.tokenizer
    eng = ExploringEngine(inner, tok, eps=0.5, mode=mode, rng=random.Random(1),
                          completion_text=get_scaffold("direct").completion_text)
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    gens = eng.generate([prompt] * 12, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    subs = [g for g in gens if g.extra["explore"]["substituted"]]
    kept = [g for g in gens if not g.extra["explore"]["substituted"]]
    assert subs and kept and eng.stats["explored"] == len(subs)
    for g in gens:
        ex = g.extra["explore"]
        scored = inner.logprobs(prompt, g.token_ids)
        assert ex["log_pi"] == pytest.approx(sum(scored), abs=1e-4)
        expect_mu = math.log(0.5 * math.exp(ex["log_pi"]) + 0.5 * ex["u"]) if ex["u"] > 0 else math.log(0.5) + ex["log_pi"]
        assert ex["log_mu"] == pytest.approx(expect_mu, abs=1e-6)
        if mode == "policy":  # π's own per-token logprobs
            assert g.logprobs == pytest.approx(scored, abs=1e-4)
        else:  # shifted so that they sum to log μ(a), the mixture's probability of the action
            assert sum(g.logprobs) == pytest.approx(ex["log_mu"], abs=1e-4)
    for g in subs:
        text = tok.decode(g.token_ids, skip_special_tokens=True)
        assert text == g.extra["explore"]["action"] and g.token_ids[-1] in stop_token_ids(tok)
        assert g.extra["explore"]["u"] > 0


def test_eps_zero_is_the_inner_engine(tiny_policy):
    from training.engines.torch_engine import TorchEngine

    inner = TorchEngine(tiny_policy, seed=0)
    eng = ExploringEngine(inner, inner.tokenizer, eps=0.0)
    prompt = inner.tokenizer.encode(PROMPT, add_special_tokens=False)
    p = SamplingParams(max_new_tokens=6, seed=3)
    assert [g.token_ids for g in eng.generate([prompt] * 3, p)] == [g.token_ids for g in inner.generate([prompt] * 3, p)]
