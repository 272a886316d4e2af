"""Trainer-vs-engine logprob consistency: rescore the exact sampled ids with the trainer's model.

Why: off-policy corrections assume the behaviour logprobs recorded at sampling time describe the
policy the trainer thinks it has. Engines with other kernels drift (users of vLLM + FSDP report
mean |Δ| ≈ 0.011); on identical float32 weights here the mismatch must stay below 1e-4 max and
1e-5 mean. `sequence_logprobs` is also the trainer-side scorer the RL loss can use.

Rescoring runs on the device the model is on (CPU or CUDA): the check is of that device's kernels.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch


def sequence_logprobs(model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                      temperature: float = 1.0, pad_id: int = 0) -> list[torch.Tensor]:
    """Per-token logprobs of each completion given its prompt (right padded, one forward pass).

    Keeps the autograd graph when called with gradients enabled (the RL loss uses that). Runs on
    the model's device; the returned tensors are there too.
    """
    dev = next(model.parameters()).device
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits.float()
    t = temperature if temperature > 0 else 1.0
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        n0, n = len(p), len(c)
        lp = torch.log_softmax(logits[i, n0 - 1:n0 + n - 1] / t, dim=-1)
        out.append(lp.gather(1, torch.tensor(list(c), dtype=torch.long, device=dev)[:, None])[:, 0])
    return out


@dataclass
class ConsistencyReport:
    """Per-token |behaviour - trainer| logprob differences over a set of sampled completions."""

    n_sequences: int
    n_tokens: int
    mean_abs: float
    max_abs: float
    per_token: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("per_token")
        return d


def compare(model, prompts: Sequence[Sequence[int]], generations, temperature: float = 1.0,
            batch_size: int = 16) -> ConsistencyReport:
    """Rescore each `Generation`'s exact token ids with `model`; report per-token mismatch."""
    diffs: list[float] = []
    with torch.no_grad():
        for s in range(0, len(prompts), batch_size):
            ps = [list(p) for p in prompts[s:s + batch_size]]
            gs = generations[s:s + batch_size]
            keep = [i for i, g in enumerate(gs) if g.token_ids]
            if not keep:
                continue
            lps = sequence_logprobs(model, [ps[i] for i in keep], [gs[i].token_ids for i in keep], temperature)
            for i, lp in zip(keep, lps):
                behav = torch.tensor(gs[i].logprobs, dtype=torch.float32, device=lp.device)
                diffs.extend((lp - behav).abs().tolist())
    t = torch.tensor(diffs or [0.0], dtype=torch.float64)
    return ConsistencyReport(n_sequences=len(prompts), n_tokens=len(diffs), mean_abs=float(t.mean()),
                             max_abs=float(t.max()), per_token=diffs)


def run_consistency(engine_spec: str, model_path: str | Path, adapter: str | Path | None = None,
                    prompts: Sequence[Sequence[int]] | None = None, n_prompts: int = 16,
                    max_new_tokens: int = 32, temperature: float = 1.0, seed: int = 0,
                    out: str | Path | None = None, device: str = "cpu") -> ConsistencyReport:
    """Sample with `engine_spec` (e.g. `torch:DIR`, `vllm:DIR`) and rescore with HF (+ peft) on
    `device` (a torch engine samples there too; vLLM and servers choose their own)."""
    from training.engines import make_engine
    from training.engines.base import SamplingParams
    from training.policy import load_model, load_tokenizer

    if prompts is None:
        tok = load_tokenizer(model_path)
        prompts = default_prompts(tok, n_prompts)
    torch_spec = engine_spec.partition(":")[0] not in ("vllm", "openai")
    engine = make_engine(engine_spec, **({"device": device} if torch_spec else {}))
    try:
        if adapter is not None:
            engine.load_adapter(str(adapter), "consistency")
        gens = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                                       seed=seed))
    finally:
        engine.close()
    model = load_model(model_path, adapter=adapter).to(device)
    report = compare(model, prompts, gens, temperature=temperature)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"engine": engine_spec, "device": device, **report.to_dict()}, indent=2))
    return report


def default_prompts(tokenizer, n: int) -> list[list[int]]:
    """Short varied prompts for a check that needs no benchmark data."""
    from training.policy import ASSISTANT, USER

    words = ["refund", "order", "check", "cancel", "status", "address", "policy", "escalate"]
    return [tokenizer.encode(f"{USER}{words[i % len(words)]} O-{1000 + 37 * i}{ASSISTANT}",
                             add_special_tokens=False) for i in range(n)]
