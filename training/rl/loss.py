"""GRPO-family policy loss with off-policy corrections, on plain tensors.

Tensors the helpers make are put on the device of their inputs, so the same code runs wherever the
learner's model is (CPU or CUDA).

Three log-probabilities meet here, per completion token t:
  * `logp`   – the policy being trained (π_θ, carries the gradient);
  * `behav`  – what the inference engine reported when the token was sampled (π_behav, recorded
               in the `Step`), possibly several policy versions ago and on another engine;
  * `prox`   – the trainer's own logprob under the parameters at the start of this learner step
               (π_prox, no gradient). Only used with `decoupled=True`.

Decoupled PPO (AReaL; also veRL's "rollout correction" layout) splits the two gaps:
  surrogate   r_t = π_θ / π_prox  clipped to [1-ε_low, 1+ε_high]          (trust region)
  IS weight   ρ_t = π_prox / π_behav, turned into w_t by `correction`      (staleness + mismatch)
  loss_t      = -w_t · min(r_t A, clip(r_t) A)  (+ kl_coef · ½(log π_θ - log π_ref)², see kl_k2)
With `decoupled=False` the surrogate ratio is taken against the behaviour policy directly
(r_t = π_θ / π_behav, plain GRPO/DAPO), and there is no separate weight to correct.

Corrections (w_t as a function of ρ; C = `is_cap`, β = `icepop_beta`):
  none       w = 1
  tis        w = min(ρ_t, C)                          truncated IS, token level
  mis_token  w = ρ_t · 1[ρ_t ≤ C]                     masked IS, token level
  mis_seq    w = ρ_s · 1[ρ_s ≤ C]  for every token of sequence s, ρ_s = Π_t ρ_t
  icepop     w = ρ_t · 1[1/β ≤ ρ_t ≤ β]               IcePop: two-sided token mask
A "sequence" is a trajectory: rows (agent turns) sharing a `seq_index` are one sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

Correction = Literal["none", "tis", "mis_token", "mis_seq", "icepop"]
CORRECTIONS: tuple[str, ...] = ("none", "tis", "mis_token", "mis_seq", "icepop")
Aggregation = Literal["token-mean", "seq-mean-token-mean"]


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[int], scale_by_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages A_i = (r_i - mean_g) [/ std_g]; also a keep-mask.

    A group whose rewards are all equal carries no learning signal (every advantage is 0), so
    `keep` is False for its members: dynamic sampling drops them and the caller counts them.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    g = torch.as_tensor(group_ids, dtype=torch.long)
    adv = torch.zeros_like(r)
    keep = torch.zeros(len(r), dtype=torch.bool)
    for gid in torch.unique(g):
        idx = (g == gid).nonzero(as_tuple=True)[0]
        rg = r[idx]
        centred = rg - rg.mean()
        if len(idx) < 2 or float(rg.max() - rg.min()) <= eps:
            continue
        if scale_by_std:
            centred = centred / (rg.std(unbiased=False) + eps)
        adv[idx] = centred
        keep[idx] = True
    return adv.float(), keep


def is_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    correction: str,
    is_cap: float = 2.0,
    icepop_beta: float = 2.0,
    seq_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token importance weights w_t from log ρ_t = log π_prox - log π_behav (see module doc)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; choose one of {CORRECTIONS}")
    log_ratio = log_ratio.detach() * mask
    rho = torch.exp(log_ratio)
    if correction == "none":
        return torch.ones_like(rho)
    if correction == "tis":
        return torch.clamp(rho, max=is_cap)
    if correction == "mis_token":
        return rho * (rho <= is_cap).to(rho.dtype)
    if correction == "icepop":
        inside = (rho >= 1.0 / icepop_beta) & (rho <= icepop_beta)
        return rho * inside.to(rho.dtype)
    # mis_seq: one ratio per sequence (trajectory), the product over all its tokens.
    rows, dev = log_ratio.shape[0], log_ratio.device
    if seq_index is None:
        seq_index = torch.arange(rows, device=dev)
    seq_index = torch.as_tensor(seq_index, dtype=torch.long, device=dev)
    n_seq = int(seq_index.max()) + 1 if rows else 0
    seq_log = torch.zeros(n_seq, dtype=log_ratio.dtype, device=dev).index_add_(0, seq_index, log_ratio.sum(-1))
    seq_rho = torch.exp(seq_log)
    w_seq = seq_rho * (seq_rho <= is_cap).to(seq_rho.dtype)
    return w_seq[seq_index].unsqueeze(-1).expand_as(rho).clone()


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k2 term of KL(π_θ || π_ref) per token: ½ (logp - ref)² ≥ 0.

    Why k2 and not Schulman's k3 (e^d - d - 1, d = ref - logp): as a loss on samples of π, k2's
    gradient is the gradient of the reverse KL (Tang & Munos 2025; k3's is not), and it grows
    quadratically where k3 grows exponentially. That matters here: exploration puts actions π did
    not sample into the batch, and after a rule shift π has learned to avoid actions the reference
    still likes; on such tokens d is large, and in a silent-shift run the mean k3 over a step's
    tokens jumped from 0.06 to 107.7 in one step, outweighing the whole policy gradient."""
    return 0.5 * (logp - ref_logp) ** 2


def aggregate(values: torch.Tensor, mask: torch.Tensor, agg: str, seq_index: torch.Tensor | None = None) -> torch.Tensor:
    """Token-level aggregation (DAPO: every token counts once across the batch) or GRPO's seq mean."""
    mask = mask.to(values.dtype)
    if agg == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    if agg == "seq-mean-token-mean":
        rows, dev = values.shape[0], values.device
        idx = (torch.arange(rows, device=dev) if seq_index is None
               else torch.as_tensor(seq_index, dtype=torch.long, device=dev))
        n_seq = int(idx.max()) + 1 if rows else 0
        tok = torch.zeros(n_seq, dtype=values.dtype, device=dev).index_add(0, idx, (values * mask).sum(-1))
        cnt = torch.zeros(n_seq, dtype=values.dtype, device=dev).index_add(0, idx, mask.sum(-1))
        present = cnt > 0
        return (tok[present] / cnt[present]).mean() if present.any() else values.sum() * 0.0
    raise ValueError(f"unknown aggregation {agg!r}")


@dataclass
class LossOutput:
    loss: torch.Tensor
    stats: dict[str, float]


def policy_loss(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    prox_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    seq_index: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    decoupled: bool = True,
    correction: str = "tis",
    is_cap: float = 2.0,
    icepop_beta: float = 2.0,
    kl_coef: float = 0.0,
    agg: str = "token-mean",
) -> LossOutput:
    """The clipped surrogate with IS correction and optional KL, aggregated over tokens.

    Shapes: `[rows, T]` for the logprobs and `mask` (1 on completion tokens), `[rows]` or
    `[rows, T]` for `advantages`. With `decoupled=True` and no `prox_logp` given, the proximal
    policy is the current parameters (`logp.detach()`): right when the learner takes one
    optimizer step per batch.
    """
    mask = mask.to(logp.dtype)
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(logp)
    adv = adv.to(logp.dtype)
    if decoupled:
        prox = logp.detach() if prox_logp is None else prox_logp.detach()
        weights = is_weights(prox - behav_logp, mask, correction, is_cap, icepop_beta, seq_index)
        ratio = torch.exp(logp - prox)
    else:
        if correction != "none":
            raise ValueError("off-policy corrections need the proximal policy: set decoupled=True")
        weights = torch.ones_like(logp)
        ratio = torch.exp(logp - behav_logp.detach())
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    per_token = -weights * surrogate
    kl = None
    if ref_logp is not None:
        kl = kl_k2(logp, ref_logp.detach())
        if kl_coef:
            per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, agg, seq_index)

    with torch.no_grad():
        trainer = logp.detach() if prox_logp is None else prox_logp.detach()
        n_tok = mask.sum().clamp(min=1.0)
        was_clipped = ((ratio * adv) > (clipped * adv)).to(logp.dtype)  # the min picked the clip
        stats = {
            "clip_frac": float((was_clipped * mask).sum() / n_tok),
            "masked_frac": float(((weights == 0).to(logp.dtype) * mask).sum() / n_tok),
            "is_weight_mean": float((weights * mask).sum() / n_tok),
            "logprob_mismatch": float((trainer - behav_logp).abs().mul(mask).sum() / n_tok),
            # How far the trainer's policy has moved from the one that sampled (beyond the clip).
            "drift_clip_frac": float((outside_clip((trainer - behav_logp).exp(), eps_low, eps_high) * mask).sum() / n_tok),
            "kl": float((kl * mask).sum() / n_tok) if kl is not None else 0.0,
            "tokens": float(mask.sum()),
        }
    return LossOutput(loss, stats)


def outside_clip(ratio: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """1.0 where a ratio lies outside the trust region [1-ε_low, 1+ε_high]."""
    return ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)).to(ratio.dtype)


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of target tokens (corrections from feedback), token mean."""
    mask = mask.to(logp.dtype)
    return -(logp * mask).sum() / mask.sum().clamp(min=1.0)


def dpo_loss(chosen_logp: torch.Tensor, rejected_logp: torch.Tensor, ref_chosen_logp: torch.Tensor,
             ref_rejected_logp: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """DPO on preference pairs (approved or corrected action vs the rejected one, same state).

    Inputs are sequence logprobs [P] (summed over each completion's tokens) under the policy and
    the reference (the base model without the adapter): -log σ(β·(Δchosen − Δrejected)), mean.
    """
    margin = (chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp)
    return -torch.nn.functional.logsigmoid(beta * margin).mean()


def token_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean entropy of the next-token distribution over completion positions (exploration gauge)."""
    with torch.no_grad():
        logz = torch.log_softmax(logits.float(), dim=-1)
        ent = -(logz.exp() * logz).sum(-1)
        m = mask.to(ent.dtype)
        return float((ent * m).sum() / m.sum().clamp(min=1.0))
