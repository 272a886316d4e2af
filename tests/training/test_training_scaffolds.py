"""Scaffolds: completion format round trips, segment-wise encoding, old-turn truncation."""
from __future__ import annotations

import pytest

from dynamic_bench import generate_tasks, make
from dynamic_bench.actions import ActionError, parse_action
from runtime.scaffolds import Context, fit_turns, get
from training.policy import load_tokenizer


@pytest.mark.parametrize("name", ["direct", "plan_act"])
def test_completion_round_trip(name):
    sc = get(name)
    action = 'refund {"order_id":"O-1042","reason":"damaged"}'
    text = sc.completion_text(action, plan="get_order > decide > reply")
    got, plan = sc.parse_completion(text)
    assert got == action
    assert plan == ("get_order > decide > reply" if name == "plan_act" else None)


def test_malformed_completion_gives_an_action_error_not_a_crash():
    for text in ["", "plan: only a plan", "\n\n", 'refund {"order_id":', "<|end|>"]:
        action, _ = get("plan_act").parse_completion(text)
        assert isinstance(parse_action(action), ActionError)


def test_unknown_scaffold_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown scaffold"):
        get("chain_of_thought")


def test_segments_encode_like_the_whole_text(bench_policy):
    """Segments begin/end at special tokens, so encoding them one by one equals encoding the text:
    the runtime (text history) and rollouts (id segments) give the model the same ids."""
    tok = load_tokenizer(bench_policy)
    env = make("driftbench/retail-v1")
    task = generate_tasks("retail", 1, seed=3)[0]
    obs, info = env.reset(options={"task": task})
    for name in ("direct", "plan_act"):
        sc = get(name)
        ctx = Context(policy_text=info["policy_text"], tools=info["tools"], memory=["refund window is now 14 days"],
                      history=[("user", obs[6:]), ("assistant", 'get_order {"order_id":"O-1"}'),
                               ("obs", "error: no order O-1"), ("user", "it is O-2")])
        ids = sc.encode_prompt(tok, ctx)
        whole = [tok.bos_token_id] + tok.encode(sc.prompt_text(ctx), add_special_tokens=False)
        assert ids == whole
        assert tok.decode(ids[1:]) == sc.prompt_text(ctx)
        assert "14 days" in sc.prompt_text(ctx) and "reply(text:str)" in sc.prompt_text(ctx)


def test_fit_turns_drops_oldest_pairs_and_keeps_the_request():
    lens = [10, 5, 7, 5, 7, 5, 7]  # user request, then (completion, observation) pairs
    assert fit_turns(100, lens, None) == 1
    assert fit_turns(100, lens, 1000) == 1
    assert fit_turns(100, lens, 100 + 10 + 12 + 12) == 3  # the oldest pair dropped
    keep = fit_turns(100, lens, 100 + 10 + 12)
    assert keep == 5  # two oldest pairs dropped, the last pair kept
    assert 100 + 10 + sum(lens[keep:]) <= 122
    assert fit_turns(100, lens, 50) == 5  # cannot fit: still keeps the request and the last pair


def test_encode_prompt_truncates_to_budget(bench_policy):
    tok = load_tokenizer(bench_policy)
    sc = get("direct")
    hist = [("user", "I want a refund for order O-1042.")]
    for i in range(12):
        hist += [("assistant", f'get_order {{"order_id":"O-{1000 + i}"}}'), ("obs", f"error: no order O-{1000 + i}")]
    ctx = Context(policy_text="retail policy v1", tools=[], history=hist)
    full = sc.encode_prompt(tok, ctx)
    short = sc.encode_prompt(tok, ctx, max_tokens=len(full) // 2)
    assert len(short) <= len(full) // 2
    assert tok.decode(short).count("O-1042") == 1  # the request stays
    assert "O-1011" in tok.decode(short) and "O-1000" not in tok.decode(short)  # newest kept, oldest dropped


def test_without_memory_equals_encoding_the_prompt_with_no_memory(bench_policy):
    """Memory distillation: emptying a logged prompt's memory section gives exactly the ids of the
    same prompt rendered with no memory; a prompt that showed none is left alone (None)."""
    from runtime.scaffolds import without_memory

    tok = load_tokenizer(bench_policy)
    env = make("driftbench/retail-v1")
    task = generate_tasks("retail", 1, seed=3)[0]
    obs, info = env.reset(options={"task": task})
    history = [("user", obs), ("assistant", 'get_order {"order_id":"O-1"}'), ("obs", "days=3 amount=40")]
    notes = ["retail refund_window now 14 days (was 30)", "gold customers now get a 10 coupon"]
    for name in ("direct", "plan_act"):
        sc = get(name)
        with_mem = sc.encode_prompt(tok, Context(info["policy_text"], info["tools"], notes, history))
        bare = sc.encode_prompt(tok, Context(info["policy_text"], info["tools"], (), history))
        assert with_mem != bare
        assert without_memory(tok, with_mem) == bare
        assert without_memory(tok, bare) is None
