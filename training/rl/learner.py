"""The learner: a LoRA (peft, all linear layers) policy, `ppo_epochs` optimizer steps per batch of groups.

Rows are agent turns: (prompt ids, completion ids, behaviour logprobs) exactly as sampled, so the
ids trained on are the ids that were sampled (token in, token out). Every turn of a trajectory
shares the trajectory's group-relative advantage, and all turns of one trajectory form one
"sequence" for sequence-level IS. Supervised rows (corrections from feedback: the right action
after a rejection or an edit; approved successes) are mixed into the same step with weight
`sft_coef`, and preference pairs (chosen vs rejected action in the same state) with a DPO term
of weight `pref_coef` against the base model (the adapter switched off).

`device` ("cpu", "cuda") is where the model, its optimizer state and every batch live; the LoRA
weights are initialised on the CPU first, so a seed gives the same starting adapter on any device.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from training.rl.loss import dpo_loss, group_advantages, policy_loss, sft_loss


@dataclass
class Row:
    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    advantage: float = 0.0
    seq: int = 0  # trajectory index within the batch
    sft: bool = False


@dataclass
class PrefPair:
    """One preference: in the state `prompt_ids`, `chosen_ids` is preferred to `rejected_ids`."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]


@dataclass
class LossSettings:
    """The loss knobs, read off RLConfig (see training/rl/loss.py for their meaning)."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    decoupled: bool = True
    correction: str = "tis"
    is_cap: float = 2.0
    icepop_beta: float = 2.0
    kl_coef: float = 0.0
    track_kl: bool = True
    agg: str = "token-mean"
    scale_adv_by_std: bool = True
    temperature: float = 1.0
    sft_coef: float = 0.0
    pref_coef: float = 0.0
    dpo_beta: float = 0.1
    micro_batch_tokens: int = 16384
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1

    @classmethod
    def from_config(cls, cfg: Any) -> "LossSettings":
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__ if hasattr(cfg, k)})


def rows_from_groups(groups: Sequence[Sequence[Any]], scale_by_std: bool = True) -> tuple[list[Row], dict]:
    """Turn groups of `Trajectory` into training rows with group-relative advantages.

    Zero-variance groups give no rows (dynamic sampling) and are counted in the returned stats.
    """
    rewards, gids, trajs = [], [], []
    for g, group in enumerate(groups):
        for t in group:
            rewards.append(float(t.reward))
            gids.append(g)
            trajs.append(t)
    if not trajs:
        return [], {"groups": 0, "zero_var_groups": 0}
    adv, keep = group_advantages(rewards, gids, scale_by_std=scale_by_std)
    rows: list[Row] = []
    seq = 0
    for t, a, k in zip(trajs, adv.tolist(), keep.tolist()):
        if not k:
            continue
        for s in t.steps:
            if s.completion_token_ids:
                rows.append(Row(list(s.prompt_token_ids), list(s.completion_token_ids),
                                list(s.behaviour_logprobs), a, seq))
        seq += 1
    n_groups = len(groups)
    kept_groups = len({g for g, k in zip(gids, keep.tolist()) if k})
    return rows, {"groups": n_groups, "zero_var_groups": n_groups - kept_groups}


def packed_sequences(rows: Sequence[Row]) -> tuple[list[list[int]], list[int]]:
    """The id sequences to run and, per row, the index of the one that holds it: a row is held by
    the next row's sequence when its prompt + completion is a prefix of it (checked exactly, so
    truncated contexts simply get a sequence of their own)."""
    seqs: list[list[int]] = []
    host = [0] * len(rows)
    for i in range(len(rows) - 1, -1, -1):
        ids = rows[i].prompt_ids + rows[i].completion_ids
        if not (seqs and len(ids) <= len(seqs[-1]) and seqs[-1][:len(ids)] == ids):
            seqs.append(ids)
        host[i] = len(seqs) - 1
    return seqs, host


def episode_chains(rows: Sequence[Row]) -> list[list[Row]]:
    """`rows` cut into runs of consecutive turns of one episode: the rows `packed_sequences` puts in
    one sequence (a row that is no earlier turn of the next one is a run of its own)."""
    _, host = packed_sequences(rows)
    chains: list[list[Row]] = []
    for i, r in enumerate(rows):
        if i and host[i] == host[i - 1]:
            chains[-1].append(r)
        else:
            chains.append([r])
    return chains


class Learner:
    """Owns the trainable LoRA model and its optimizer; `step()` is one learner update."""

    def __init__(self, model_path: str | Path, *, lora_r: int = 8, lora_alpha: int = 16, lr: float = 1e-4,
                 settings: LossSettings | None = None, seed: int = 0, adapter: str | Path | None = None,
                 device: str = "cpu") -> None:
        from peft import PeftModel, get_peft_model

        from training.policy import load_model, load_tokenizer, lora_config

        torch.manual_seed(seed)
        self.settings = settings or LossSettings()
        self.tokenizer = load_tokenizer(model_path)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        base = load_model(model_path)
        if adapter is not None:
            self.model = PeftModel.from_pretrained(base, str(adapter), is_trainable=True)
        else:
            self.model = get_peft_model(base, lora_config(r=lora_r, alpha=lora_alpha))
        self.device = torch.device(device)
        self.model.to(self.device).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)

    def set_lr(self, lr: float) -> None:
        """The optimizer's learning rate from the next step on (the warm-up takes its own)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---- scoring --------------------------------------------------------------------------
    def _forward(self, rows: Sequence[Row], reference: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Right-padded batch → per-token logprobs [R, T] on completion slots, mask [R, T], entropy.

        A row whose ids are a prefix of the next row's (the turns of one episode: each turn's prompt
        is the last prompt, its completion and the observation) is scored inside that row's
        sequence: one forward pass per episode instead of one per turn (a causal model gives each
        position the same logits either way). Rows that are not prefixes get their own sequence."""
        seqs, host = packed_sequences(rows)
        width = max(len(x) for x in seqs)
        tmax = max(len(r.completion_ids) for r in rows)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, :len(seq)] = torch.tensor(seq)
            attn[i, :len(seq)] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)  # built on the host, sent once
        if reference:
            with torch.no_grad(), self.model.disable_adapter():
                logits = self.model(input_ids=ids, attention_mask=attn).logits.float()
        else:
            logits = self.model(input_ids=ids, attention_mask=attn).logits.float()
        t = self.settings.temperature if self.settings.temperature > 0 else 1.0
        lps, ent_sum, n_tok = [], 0.0, 0
        mask = torch.zeros((len(rows), tmax), device=self.device)
        for i, r in enumerate(rows):
            n0, n = len(r.prompt_ids), len(r.completion_ids)
            logz = torch.log_softmax(logits[host[i], n0 - 1:n0 + n - 1] / t, dim=-1)
            target = torch.tensor(r.completion_ids, device=self.device)
            lps.append(torch.nn.functional.pad(logz.gather(1, target[:, None])[:, 0], (0, tmax - n)))
            mask[i, :n] = 1.0
            if not reference:
                with torch.no_grad():
                    ent_sum += float(-(logz.exp() * logz).sum())
                    n_tok += n
        lp = torch.stack(lps)
        return lp, mask, ent_sum / max(n_tok, 1)

    def _micro_batches(self, rows: list[Row]) -> list[list[Row]]:
        """Chunks of whole trajectories, each at most `micro_batch_tokens` padded tokens (as packed
        by `_forward`: an episode's turns run as one sequence)."""
        out: list[list[Row]] = []
        cur: list[Row] = []
        n_seqs = i = 0
        while i < len(rows):
            j = i
            while j < len(rows) and rows[j].seq == rows[i].seq and rows[j].sft == rows[i].sft:
                j += 1
            traj = rows[i:j]
            k = len(packed_sequences(traj)[0])
            width = max(len(r.prompt_ids) + len(r.completion_ids) for r in cur + traj)
            if cur and width * (n_seqs + k) > self.settings.micro_batch_tokens:
                out.append(cur)
                cur, n_seqs = [], 0
            cur, n_seqs = cur + traj, n_seqs + k
            i = j
        if cur:
            out.append(cur)
        return out

    # ---- update ---------------------------------------------------------------------------
    def step(self, rows: list[Row], sft_rows: Sequence[Row] = (),
             pref_pairs: Sequence[PrefPair] = ()) -> dict[str, float | None]:
        """One learner update on `rows` (policy gradient) plus `sft_rows` (supervised corrections)
        plus `pref_pairs` (DPO): `ppo_epochs` optimizer steps over the same batch. With more than
        one, the proximal policy is frozen at the parameters the update started from, so the clip
        (not the learning rate alone) bounds how far the update moves each token's probability;
        the supervised and DPO terms join the first epoch only. Policy-gradient stats are averaged
        over the epochs; `clip_frac` then shows the trust region at work."""
        s = self.settings
        epochs = max(1, int(s.ppo_epochs))
        mbs = self._micro_batches(rows)
        prox = ref = None
        with torch.no_grad():
            if epochs > 1 and rows and s.decoupled:
                prox = [self._forward(mb)[0] for mb in mbs]
            if rows and (s.kl_coef or s.track_kl):  # the base model does not change: score it once
                ref = [self._forward(mb, reference=True)[0] for mb in mbs]
        # the supervised and preference terms are taken once: no clip bounds them, so repeating
        # them per epoch multiplies their step (4 epochs: KL 0.009 -> 0.92 in five steps, measured)
        runs = [self._one_epoch(rows, mbs, sft_rows if e == 0 else (), pref_pairs if e == 0 else (), prox, ref)
                for e in range(epochs)]
        once = ("sft_rows", "sft_loss", "pref_pairs", "pref_loss", "pref_accuracy")
        stats: dict[str, float | None] = {}
        for k, v in runs[0].items():
            seen = [float(r[k]) for r in runs if r.get(k) is not None]  # epochs that took a step
            stats[k] = v if k in once or v is None else sum(seen) / len(seen)
        stats["epochs"] = float(epochs)
        return stats

    def _one_epoch(self, rows: list[Row], mbs: list[list[Row]], sft_rows: Sequence[Row],
                   pref_pairs: Sequence[PrefPair], prox: list[torch.Tensor] | None,
                   ref: list[torch.Tensor] | None) -> dict[str, float | None]:
        """One optimizer step over `rows`, chunked as `mbs` (`_micro_batches(rows)`, made once per step)."""
        s = self.settings
        self.optimizer.zero_grad(set_to_none=True)
        total_tok = sum(len(r.completion_ids) for r in rows)
        stats: dict[str, float | None] = {}
        weighted: dict[str, float] = {}
        ent_tok = loss_sum = 0.0
        for j, mb in enumerate(mbs):
            lp, mask, ent = self._forward(mb)
            behav = torch.zeros(lp.shape, dtype=lp.dtype)
            for i, r in enumerate(mb):
                behav[i, :len(r.behav_logprobs)] = torch.tensor(r.behav_logprobs[:lp.shape[1]])
            behav = behav.to(self.device)  # filled on the host, sent once
            adv = torch.tensor([r.advantage for r in mb], device=self.device)
            seq_ids = torch.tensor([r.seq for r in mb], device=self.device)
            seq_ids = seq_ids - seq_ids.min()
            out = policy_loss(lp, behav, adv, mask, prox_logp=None if prox is None else prox[j],
                              ref_logp=None if ref is None else ref[j],
                              seq_index=seq_ids, eps_low=s.eps_low, eps_high=s.eps_high, decoupled=s.decoupled,
                              correction=s.correction, is_cap=s.is_cap, icepop_beta=s.icepop_beta,
                              kl_coef=s.kl_coef, agg=s.agg)
            ntok = float(mask.sum())
            part = out.loss * (ntok / max(total_tok, 1))
            part.backward()
            loss_sum += float(part.detach())
            for k, v in out.stats.items():
                if k != "tokens":
                    weighted[k] = weighted.get(k, 0.0) + v * ntok
            ent_tok += ent * ntok
        for k, v in weighted.items():
            stats[k] = v / max(total_tok, 1)
        stats["loss"] = loss_sum
        stats["entropy"] = ent_tok / total_tok if total_tok else None  # no policy-gradient tokens this step
        stats["tokens"] = float(total_tok)
        stats["sft_rows"] = float(len(sft_rows))
        if sft_rows and s.sft_coef:
            lp, mask, _ = self._forward(list(sft_rows))
            sl = sft_loss(lp, mask)
            (s.sft_coef * sl).backward()
            stats["sft_loss"] = float(sl.detach())
        stats["pref_pairs"] = float(len(pref_pairs))
        if pref_pairs and s.pref_coef:
            stats.update(self._preference_step(pref_pairs))
        if rows or (sft_rows and s.sft_coef) or (pref_pairs and s.pref_coef):
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, s.max_grad_norm))
            self.optimizer.step()
        return stats

    def _preference_step(self, pairs: Sequence[PrefPair]) -> dict[str, float]:
        """Backpropagate `pref_coef` × DPO over `pairs`; returns the loss and the preference accuracy."""
        both = [Row(p.prompt_ids, p.chosen_ids, []) for p in pairs] + [Row(p.prompt_ids, p.rejected_ids, [])
                                                                      for p in pairs]
        lp, mask, _ = self._forward(both)
        ref, _, _ = self._forward(both, reference=True)
        seq, ref_seq, n = (lp * mask).sum(1), (ref * mask).sum(1), len(pairs)
        loss = dpo_loss(seq[:n], seq[n:], ref_seq[:n], ref_seq[n:], beta=self.settings.dpo_beta)
        (self.settings.pref_coef * loss).backward()
        with torch.no_grad():
            acc = float(((seq[:n] - ref_seq[:n]) > (seq[n:] - ref_seq[n:])).float().mean())
        return {"pref_loss": float(loss.detach()), "pref_accuracy": acc}

    # ---- persistence ------------------------------------------------------------------------
    def save_adapter(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        self.model.save_pretrained(str(out))
        return out

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                "py_rng": random.getstate()}

    def load_state_dict(self, d: dict) -> None:
        self.optimizer.load_state_dict(d["optimizer"])
        torch.set_rng_state(d["torch_rng"])
        random.setstate(d["py_rng"])
