"""The RL loss on hand-made tensors: each mode does what its formula says."""
from __future__ import annotations

import math

import pytest
import torch

from training.rl.loss import group_advantages, is_weights, kl_k2, policy_loss, sft_loss


def _grad(fn, logp0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = logp0.clone().requires_grad_(True)
    out = fn(logp)
    loss = out.loss if hasattr(out, "loss") else out
    loss.backward()
    return loss.detach(), logp.grad


LOGP = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.3], [0.1, 0.7, 0.4, 0.6]]))
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
ADV = torch.tensor([1.5, -0.5])


@pytest.mark.parametrize("decoupled,correction", [(True, "none"), (True, "tis"), (True, "mis_token"),
                                                  (True, "mis_seq"), (True, "icepop"), (False, "none")])
def test_on_policy_limit_is_plain_policy_gradient(decoupled, correction):
    """behaviour == trainer: every mode's gradient equals that of -Σ A·logp / #tokens."""
    loss, g = _grad(lambda lp: policy_loss(lp, LOGP.clone(), ADV, MASK, decoupled=decoupled,
                                           correction=correction), LOGP)
    _, g_pg = _grad(lambda lp: -(ADV[:, None] * lp * MASK).sum() / MASK.sum(), LOGP)
    assert torch.allclose(g, g_pg, atol=1e-6)
    # value: ratio 1 → -mean(A) over tokens
    assert loss.item() == pytest.approx(-(ADV[:, None] * MASK).sum().item() / MASK.sum().item(), abs=1e-6)
    assert g[0, 3] == 0.0  # padding gets no gradient


def _one_row(rhos, adv=1.0):
    """A row whose trainer logprobs are log(0.5) and behaviour logprobs give the ratios `rhos`."""
    n = len(rhos)
    logp = torch.full((1, n), math.log(0.5))
    behav = logp - torch.log(torch.tensor([rhos]))
    return logp, behav, torch.tensor([adv]), torch.ones(1, n)


def test_truncated_is_caps_the_weight():
    logp, behav, adv, mask = _one_row([0.5, 1.0, 3.0])
    out_loss, g = _grad(lambda lp: policy_loss(lp, behav, adv, mask, correction="tis", is_cap=2.0), logp)
    assert torch.allclose(g, -torch.tensor([[0.5, 1.0, 2.0]]) / 3, atol=1e-6)


def test_masked_is_token_zeroes_tokens_over_the_cap():
    logp, behav, adv, mask = _one_row([0.5, 1.0, 3.0])
    out = policy_loss(logp.clone().requires_grad_(True), behav, adv, mask, correction="mis_token", is_cap=2.0)
    _, g = _grad(lambda lp: policy_loss(lp, behav, adv, mask, correction="mis_token", is_cap=2.0), logp)
    assert torch.allclose(g, -torch.tensor([[0.5, 1.0, 0.0]]) / 3, atol=1e-6)
    assert out.stats["masked_frac"] == pytest.approx(1 / 3)


def test_masked_is_sequence_uses_the_product_over_the_whole_trajectory():
    # rows 0 and 1 are two turns of trajectory 0 (product 1.5*1.6 = 2.4 > cap → masked),
    # row 2 is trajectory 1 (product 0.5*1.2 = 0.6 → weight 0.6 on every token).
    logp = torch.full((3, 2), math.log(0.5))
    rhos = torch.tensor([[1.5, 1.0], [1.6, 1.0], [0.5, 1.2]])
    behav = logp - torch.log(rhos)
    seq = torch.tensor([0, 0, 1])
    adv = torch.ones(3)
    mask = torch.ones(3, 2)
    w = is_weights(logp - behav, mask, "mis_seq", is_cap=2.0, seq_index=seq)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.6, 0.6]]), atol=1e-6)
    _, g = _grad(lambda lp: policy_loss(lp, behav, adv, mask, correction="mis_seq", is_cap=2.0, seq_index=seq), logp)
    assert torch.allclose(g, -torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.6, 0.6]]) / 6, atol=1e-6)
    # treating each row as its own sequence gives a different answer: row 0's product 1.5 passes
    w_rows = is_weights(logp - behav, mask, "mis_seq", is_cap=2.0)
    assert w_rows[0, 0].item() == pytest.approx(1.5)


def test_icepop_masks_outside_the_two_sided_band():
    logp, behav, adv, mask = _one_row([0.3, 0.6, 1.5, 2.5])
    w = is_weights(logp - behav, mask, "icepop", icepop_beta=2.0)
    assert torch.allclose(w, torch.tensor([[0.0, 0.6, 1.5, 0.0]]), atol=1e-6)
    out = policy_loss(logp, behav, adv, mask, correction="icepop", icepop_beta=2.0)
    assert out.stats["masked_frac"] == pytest.approx(0.5)


def test_padding_never_counts_as_masked_or_weighted():
    logp, behav, adv, _ = _one_row([5.0, 1.0])
    mask = torch.tensor([[0.0, 1.0]])
    out = policy_loss(logp, behav, adv, mask, correction="mis_token", is_cap=2.0)
    assert out.stats["masked_frac"] == 0.0
    assert out.stats["tokens"] == 1.0


def test_clip_higher_is_asymmetric():
    """Decoupled surrogate r = π_θ/π_prox: A>0 stops at 1+ε_high, A<0 stops at 1-ε_low."""
    prox = torch.full((1, 4), math.log(0.5))
    logp = prox + torch.log(torch.tensor([[1.1, 1.25, 1.5, 0.7]]))
    behav = prox.clone()
    mask = torch.ones(1, 4)
    kw = dict(prox_logp=prox, correction="none", eps_low=0.2)
    _, g_hi = _grad(lambda lp: policy_loss(lp, behav, torch.tensor([1.0]), mask, eps_high=0.28, **kw), logp)
    _, g_sym = _grad(lambda lp: policy_loss(lp, behav, torch.tensor([1.0]), mask, eps_high=0.2, **kw), logp)
    # A>0: 1.1 inside both; 1.25 inside only with clip-higher; 1.5 clipped; 0.7 below but A>0 → min keeps r·A
    assert (g_hi[0] != 0).tolist() == [True, True, False, True]
    assert (g_sym[0] != 0).tolist() == [True, False, False, True]
    _, g_neg = _grad(lambda lp: policy_loss(lp, behav, torch.tensor([-1.0]), mask, eps_high=0.28, **kw), logp)
    # A<0: ratio 0.7 < 0.8 is clipped; large ratios are not (pessimistic bound)
    assert (g_neg[0] != 0).tolist() == [True, True, True, False]
    out = policy_loss(logp, behav, torch.tensor([1.0]), mask, eps_high=0.28, **kw)
    assert out.stats["clip_frac"] == pytest.approx(0.25)


def test_decoupled_weight_uses_prox_over_behaviour_and_ratio_uses_prox():
    prox = torch.full((1, 2), math.log(0.4))
    behav = torch.full((1, 2), math.log(0.2))  # ρ = 2 → tis cap 1.5 → w = 1.5
    logp = prox.clone()
    _, g = _grad(lambda lp: policy_loss(lp, behav, torch.tensor([1.0]), torch.ones(1, 2), prox_logp=prox,
                                        correction="tis", is_cap=1.5), logp)
    assert torch.allclose(g, torch.full((1, 2), -1.5 / 2), atol=1e-6)


def test_non_decoupled_refuses_corrections_and_clips_against_behaviour():
    logp, behav, adv, mask = _one_row([1.5])  # π_θ/π_behav = 1.5 → clipped for A>0
    with pytest.raises(ValueError):
        policy_loss(logp, behav, adv, mask, decoupled=False, correction="tis")
    _, g = _grad(lambda lp: policy_loss(lp, behav, adv, mask, decoupled=False, correction="none"), logp)
    assert g.abs().sum() == 0.0


def test_kl_k2_is_zero_at_reference_positive_elsewhere_and_grows_quadratically():
    lp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    assert torch.allclose(kl_k2(lp, lp), torch.zeros(3))
    assert (kl_k2(lp, torch.log(torch.tensor([0.4, 0.1, 0.5]))) > 0).all()
    logp, behav, adv, mask = _one_row([1.0, 1.0])
    ref = logp - 0.3
    base = policy_loss(logp, behav, adv, mask, correction="none")
    with_kl = policy_loss(logp, behav, adv, mask, correction="none", ref_logp=ref, kl_coef=0.5)
    expected_kl = 0.5 * 0.3 ** 2
    assert with_kl.stats["kl"] == pytest.approx(expected_kl, rel=1e-5)
    assert with_kl.loss.item() == pytest.approx(base.loss.item() + 0.5 * expected_kl, rel=1e-5)
    # a token the policy moved 10 nats below the reference: k2's pull is 10 per token, not e^10
    far = torch.tensor([[-12.0]], requires_grad=True)
    kl_k2(far, torch.tensor([[-2.0]])).sum().backward()
    assert far.grad.item() == pytest.approx(-10.0)


def test_group_advantages_drop_zero_variance_groups():
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    adv, keep = group_advantages(rewards, groups, scale_by_std=False)
    assert keep.tolist() == [True] * 3 + [False] * 6
    assert adv[:3].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert adv[:3].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3])
    adv_std, _ = group_advantages(rewards, groups, scale_by_std=True)
    assert adv_std[:3].std(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)
    assert adv[3:].abs().sum() == 0.0


def test_token_mean_and_seq_mean_aggregations_differ_by_length():
    logp = torch.zeros(2, 4)
    behav = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    tok = policy_loss(logp, behav, adv, mask, correction="none").loss.item()
    seq = policy_loss(logp, behav, adv, mask, correction="none", agg="seq-mean-token-mean").loss.item()
    assert tok == pytest.approx(-(1 - 4) / 5)  # long sequence dominates token-mean
    assert seq == pytest.approx(0.0)


def test_sft_loss_is_token_nll():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    assert sft_loss(lp, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx((math.log(2) + math.log(4)) / 2)
