"""The learner on a real tiny policy: rows from groups, on-policy consistency, improvement, determinism."""
from __future__ import annotations

import pytest
import torch

from dynamic_bench.schema import Step, Trajectory
from training.engines.base import SamplingParams
from training.rl.learner import Learner, LossSettings, PrefPair, Row, rows_from_groups

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="no CUDA device on this machine"))]


def _groups(engine, tok, n_prompts=3, g=4, seed=0):
    """Sample G completions per prompt; reward 1 when the first sampled token id is even."""
    groups = []
    for p in range(n_prompts):
        prompt = tok.encode(f"<|user|>order O-{1000 + p} refund<|assistant|>", add_special_tokens=False)
        gens = engine.generate([prompt] * g, SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed + 10 * p))
        groups.append([Trajectory(task_id=f"t{p}", reward=float(x.token_ids[0] % 2 == 0),
                                  steps=[Step(index=0, prompt_token_ids=prompt, completion_token_ids=x.token_ids,
                                              behaviour_logprobs=x.logprobs, policy_version=x.policy_version)])
                       for x in gens])
    return groups


@pytest.fixture(scope="module")
def batch(tiny_policy):
    from training.engines.torch_engine import TorchEngine

    eng = TorchEngine(tiny_policy, seed=0)
    groups = _groups(eng, eng.tokenizer, n_prompts=4, g=4)
    return groups


def test_rows_follow_groups_and_drop_zero_variance(batch):
    flat = Trajectory(task_id="same", reward=1.0, steps=batch[0][0].steps)
    rows, st = rows_from_groups(batch + [[flat, flat.model_copy(), flat.model_copy()]], scale_by_std=False)
    assert st["zero_var_groups"] >= 1
    informative = [g for g in batch if len({t.reward for t in g}) > 1]
    assert st["groups"] - st["zero_var_groups"] == len(informative)
    assert len(rows) == 4 * len(informative)
    for r in rows:
        assert len(r.completion_ids) == len(r.behav_logprobs)
    # advantages are centred within each informative group
    by_seq = {}
    for r in rows:
        by_seq.setdefault(r.seq // 4, []).append(r.advantage)
    for advs in by_seq.values():
        assert sum(advs) == pytest.approx(0.0, abs=1e-5)


def test_on_policy_step_has_no_mismatch_and_improves_rewarded_tokens(tiny_policy, batch):
    torch.manual_seed(0)
    learner = Learner(tiny_policy, lr=1e-2, seed=0, settings=LossSettings(correction="tis"))
    rows, _ = rows_from_groups(batch)
    assert rows, "the fixture batch should contain informative groups"
    first = learner.step(rows)
    # same weights (LoRA B=0) in engine and trainer: behaviour == trainer logprobs
    assert first["logprob_mismatch"] < 1e-4
    assert first["masked_frac"] == 0.0 and first["kl"] == pytest.approx(0.0, abs=1e-6)

    def margin():
        with torch.no_grad():
            lp, mask, _ = learner._forward(rows)
        seq_lp = (lp * mask).sum(-1)
        adv = torch.tensor([r.advantage for r in rows])
        return float(seq_lp[adv > 0].mean() - seq_lp[adv < 0].mean())

    m0 = margin()
    for _ in range(4):
        stats = learner.step(rows)
    assert margin() > m0 + 0.5  # rewarded completions became more likely than unrewarded ones
    assert stats["logprob_mismatch"] > 1e-3  # the policy moved away from the behaviour samples
    assert stats["kl"] > 0.0


def test_ppo_epochs_freeze_the_proximal_policy_so_the_clip_binds(tiny_policy, batch):
    """One batch, four optimizer steps: the proximal policy is frozen at the start, so tokens whose
    ratio leaves [1-ε_low, 1+ε_high] stop pulling (clip fraction > 0); one epoch per batch never
    clips (the ratio to the proximal policy is 1). Either way the update learns from the batch."""
    rows, _ = rows_from_groups(batch)
    adv = torch.tensor([r.advantage for r in rows])

    def margin(learner) -> float:
        with torch.no_grad():
            lp, mask, _ = learner._forward(rows)
        seq_lp = (lp * mask).sum(-1)
        return float(seq_lp[adv > 0].mean() - seq_lp[adv < 0].mean())

    for epochs in (1, 4):
        learner = Learner(tiny_policy, lr=2e-2, seed=0, settings=LossSettings(ppo_epochs=epochs, track_kl=False))
        m0 = margin(learner)
        st = learner.step(rows)
        assert st["epochs"] == float(epochs)
        assert (st["clip_frac"] > 0.0) if epochs > 1 else (st["clip_frac"] == 0.0)
        assert margin(learner) > m0 + 0.1


def test_ppo_epochs_take_the_supervised_term_once(tiny_policy, batch):
    """No clip bounds a supervised row, so extra epochs must not repeat it: with corrections only,
    four epochs leave exactly the parameters one epoch leaves."""
    prompt = batch[0][0].steps[0].prompt_token_ids
    learners = []
    for epochs in (1, 4):
        learner = Learner(tiny_policy, lr=5e-3, seed=0, settings=LossSettings(sft_coef=1.0, ppo_epochs=epochs))
        target = learner.tokenizer.encode('refund_order {"order_id":"O-1000"}<|end|>', add_special_tokens=False)
        st = learner.step([], [Row(prompt, target, [0.0] * len(target), sft=True)])
        assert st["sft_rows"] == 1.0 and st["sft_loss"] > 0.0
        learners.append(learner)
    for a, b in zip(learners[0].params, learners[1].params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_engine_and_learner_on_one_device_agree(tiny_policy, device):
    """Sampled by the engine and scored by the learner on `device` (passed explicitly), on the same
    float32 weights: per-token |Δ| below 1e-4 max and 1e-5 mean, the conformance target. Then one
    update with every loss term that makes tensors of its own (sequence-level IS, per-sequence
    aggregation, KL, supervised rows, DPO, a frozen proximal policy) runs there too."""
    from training.engines.torch_engine import TorchEngine

    eng = TorchEngine(tiny_policy, seed=0, device=device)
    assert next(eng.model.parameters()).device.type == device
    rows, _ = rows_from_groups(_groups(eng, eng.tokenizer, n_prompts=4, g=4))
    assert rows, "the sampled groups should contain informative ones"
    learner = Learner(tiny_policy, lr=1e-2, seed=0, device=device,
                      settings=LossSettings(correction="mis_seq", agg="seq-mean-token-mean", kl_coef=0.1,
                                            sft_coef=1.0, pref_coef=1.0, ppo_epochs=2))
    assert all(p.device.type == device for p in learner.params)
    with torch.no_grad():
        lp, mask, _ = learner._forward(rows)
    behav = torch.zeros_like(lp)
    for i, r in enumerate(rows):
        behav[i, :len(r.behav_logprobs)] = torch.tensor(r.behav_logprobs, device=lp.device)
    diff = (lp - behav).abs() * mask
    assert float(diff.max()) < 1e-4 and float(diff.sum() / mask.sum()) < 1e-5
    pair = PrefPair(rows[0].prompt_ids, rows[0].completion_ids, rows[-1].completion_ids)
    st = learner.step(rows, [Row(rows[0].prompt_ids, rows[0].completion_ids, [], sft=True)], [pair])
    assert st["logprob_mismatch"] < 1e-4 and st["masked_frac"] == 0.0
    assert all(st[k] is not None and st[k] == st[k] for k in ("loss", "sft_loss", "pref_loss", "grad_norm"))
    assert st["grad_norm"] > 0.0


def test_same_seed_same_losses(tiny_policy, batch):
    rows, _ = rows_from_groups(batch)
    runs = []
    for _ in range(2):
        learner = Learner(tiny_policy, lr=1e-3, seed=3)
        runs.append([learner.step(rows)["loss"] for _ in range(2)])
    assert runs[0] == runs[1]


def test_supervised_corrections_raise_target_likelihood(tiny_policy, batch):
    learner = Learner(tiny_policy, lr=5e-3, seed=0, settings=LossSettings(sft_coef=1.0))
    prompt = batch[0][0].steps[0].prompt_token_ids
    target = learner.tokenizer.encode('refund_order {"order_id":"O-1000"}<|end|>', add_special_tokens=False)
    sft = [Row(prompt, target, [0.0] * len(target), sft=True)]
    with torch.no_grad():
        before = float(learner._forward(sft)[0].sum())
    for _ in range(5):
        st = learner.step([], sft)
    with torch.no_grad():
        after = float(learner._forward(sft)[0].sum())
    assert st["sft_rows"] == 1.0 and after > before + 1.0


def test_dpo_loss_follows_its_formula():
    from training.rl.loss import dpo_loss

    c, r = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rc, rr = torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])
    beta = 0.5
    margin = (c - rc) - (r - rr)  # [2, -1]
    expected = -torch.nn.functional.logsigmoid(beta * margin).mean()
    assert float(dpo_loss(c, r, rc, rr, beta=beta)) == pytest.approx(float(expected))
    # equal policy and reference: log 2, whatever the pair
    assert float(dpo_loss(rc, rr, rc, rr)) == pytest.approx(float(torch.log(torch.tensor(2.0))))


def test_preference_pairs_move_the_policy_towards_the_chosen_action(tiny_policy):
    from training.rl.learner import PrefPair

    learner = Learner(tiny_policy, lr=5e-3, seed=0, settings=LossSettings(pref_coef=1.0, dpo_beta=0.5))
    tok = learner.tokenizer
    prompt = tok.encode("<|user|>order O-1001 refund<|assistant|>", add_special_tokens=False)
    chosen = tok.encode('refund_order {"order_id":"O-1001"}<|end|>', add_special_tokens=False)
    rejected = tok.encode('escalate {"order_id":"O-1001"}<|end|>', add_special_tokens=False)
    pair = PrefPair(prompt, chosen, rejected)
    stats = [learner.step([], (), [pair]) for _ in range(6)]
    assert stats[0]["pref_loss"] == pytest.approx(float(torch.log(torch.tensor(2.0))), abs=1e-4)  # B = 0: policy == ref
    assert stats[-1]["pref_loss"] < stats[0]["pref_loss"] - 0.05
    assert stats[-1]["pref_accuracy"] == 1.0


def test_an_episodes_turns_are_scored_in_one_sequence_as_they_would_be_one_by_one(tiny_policy):
    """Packing: each turn's prompt extends the last turn's ids, so one forward pass per episode
    gives every turn's logprobs; the same as scoring the turns apart, and the engine's own."""
    from dynamic_bench import generate_tasks
    from training.engines.torch_engine import TorchEngine
    from training.rl.learner import packed_sequences
    from training.rollout import RolloutConfig, rollout

    eng = TorchEngine(tiny_policy, seed=0)
    trajs = rollout(eng, eng.tokenizer, generate_tasks("retail", 3, seed=4), RolloutConfig(temperature=1.0,
                                                                                           max_steps=4, seed=2))
    rows = [Row(list(s.prompt_token_ids), list(s.completion_token_ids), list(s.behaviour_logprobs), 1.0, k)
            for k, t in enumerate(trajs) for s in t.steps]
    ids = [r.prompt_ids + r.completion_ids for r in rows]
    held = [i + 1 < len(ids) and ids[i + 1][:len(ids[i])] == ids[i] for i in range(len(ids))]
    seqs, host = packed_sequences(rows)
    assert len(seqs) == held.count(False) < len(rows)  # random weights: some turns were re-encoded
    learner = Learner(tiny_policy, seed=0)
    with torch.no_grad():
        packed, mask, _ = learner._forward(rows)
        apart = [learner._forward([r])[0][0] for r in rows]
    for i, r in enumerate(rows):
        n = len(r.completion_ids)
        assert mask[i, :n].sum() == n
        assert torch.allclose(packed[i, :n], apart[i][:n], atol=1e-5)
        assert torch.allclose(packed[i, :n], torch.tensor(r.behav_logprobs), atol=1e-4)
    broken = rows[:1] + [Row([7] + rows[1].prompt_ids[1:], rows[1].completion_ids, rows[1].behav_logprobs)]
    assert len(packed_sequences(broken)[0]) == 2  # not a prefix (a truncated context): scored on its own
