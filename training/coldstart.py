"""Cold start: SFT of the built-in policy on DriftBench oracle episodes (training/sft_data.py).

Loss on completion tokens, plus a down-weighted language-model loss on the context tokens
(`context_loss_weight`): a model trained from scratch must first learn to copy ids (an order id
from the request into a tool call), and observations that repeat ids give it that practice; on
completions alone the copying did not emerge within 400 steps of the `small` preset. A short
warm-up on synthetic copy sequences (`copy_warmup_steps`: ids in a sentence, then the same ids in
tool-call form) forms the copying circuit first; measured on the `small` model, that circuit
appears after ~250 steps at lr 1e-3 and was still incomplete after 400 at 3e-3. Decision
completions (actions that apply the rules, not reads) weigh `decision_loss_weight` times the others:
the choice among refund / escalate / deny is one token of ~80 target tokens per episode, the rest
is copying ids. On `small` (12,000 examples, 2,100 SFT steps) weight 3 raised direct pass@1 from
0.70 to 0.82 and memory-following from 0.68 to 0.76; 20,000 examples and 4,000 steps then gave 0.96
and 0.81 (benchmarks/bench_cold_start.py, 50 test tasks per domain). Resumable: a
checkpoint (model, optimizer, scheduler, step) is written atomically every `save_every` steps and
picked up by the next run with the same config. A fixed step count left one domain behind: the
CPU build of `small` followed retail memory 0.72 (telecom 0.90), so the preset ends on a quality
target (`quality_target`, see the config) instead of the step count alone.
`ensure_coldstart(out_dir, preset, seed)` returns `out_dir/policy` (a Hugging Face folder) and builds it only if it is missing. Judged by `evaluate`: pass@1 and pass@k,
format-valid action rate, action-space coverage, distinct successful strategies, and success
following a correct memory item on changed-rule tasks (training/coldstart_eval.py).
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

DONE = "DONE.json"


@dataclass
class ColdStartConfig:
    """Flat config (TRL style). `preset` picks model size and the default budget."""

    preset: str = "tiny"
    seed: int = 0
    n_examples: int = 3000
    n_corpus: int = 1200  # episodes the tokenizer is trained on
    max_steps: int = 300
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    context_loss_weight: float = 0.2  # LM loss on prompt/observation tokens, relative to completions
    decision_loss_weight: float = 1.0  # weight of decision completions (sft_data.DECISION) vs other completions
    copy_warmup_steps: int = 0  # steps on synthetic id-copy sequences before the SFT (batch 32, short)
    max_len: int = 1024
    save_every: int = 50
    num_threads: int = 2
    max_seconds: float | None = None  # wall-clock cap (breaks step-exact determinism when it bites)
    # Quality target: after `max_steps`, greedy memory-following on train-split changed-rule tasks
    # (`quality_tasks` per domain) is checked; while a domain is below `quality_target`, training
    # goes on for up to `refine_max_steps`, each batch half fresh memory examples of the lagging
    # domains and half the main data, at `refine_lr_scale` × lr, re-checked every `refine_every`.
    # If the cap comes first, the policy is the best-checked weights (by the worst domain): one CPU
    # build's retail went 0.73 → 0.60 → 0.63 over the first 600 refinement steps.
    quality_target: float | None = None
    quality_tasks: int = 30
    refine_max_steps: int = 0
    refine_every: int = 300
    refine_examples: int = 3000
    refine_lr_scale: float = 0.25


PRESET_CONFIGS = {
    "tiny": ColdStartConfig(preset="tiny", n_examples=200, n_corpus=200, max_steps=20, batch_size=8,
                            save_every=10),
    "small": ColdStartConfig(preset="small", n_examples=20000, n_corpus=1500, max_steps=4000, batch_size=16,
                             lr=1e-3, context_loss_weight=0.3, decision_loss_weight=3.0, copy_warmup_steps=300,
                             save_every=50, quality_target=0.8, refine_max_steps=1200),
}


def config_for(preset: str, seed: int = 0, **overrides) -> ColdStartConfig:
    base = PRESET_CONFIGS.get(preset, ColdStartConfig(preset=preset))
    return replace(base, seed=seed, **overrides)


def machine_info(device: str = "cpu") -> dict:
    """Where the weights were computed. Same config and seed give the same weights on one machine;
    CPU builds of one config (same code, torch and seed) on this project's session machines fell into
    two sets of quality checks: AVX2 machines one, AVX-512 machines the other. torch's own kernels
    round differently per `cpu_capability` (MKL/oneDNN instruction switches changed nothing,
    `ATEN_CPU_CAPABILITY` did: with it set to avx2 an AVX-512 machine gave the AVX2 machines' build),
    so each build records it: two builds to compare must say the same here."""
    import platform

    import torch

    cpuinfo = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if ln.startswith("model name")]
    return {"device": device, "cpu": names[0] if names else platform.processor() or platform.machine(),
            "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def _atomic_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def _lr_at(step: int, cfg: ColdStartConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def build_base(out: Path, cfg: ColdStartConfig) -> Path:
    """Tokenizer trained on DriftBench text + a freshly initialised model (`out/base`)."""
    from training.policy import build_policy
    from training.sft_data import corpus_texts

    base = out / "base"
    if not (base / "config.json").exists():
        build_policy(base, cfg.preset, corpus_texts(cfg.n_corpus, seed=cfg.seed), seed=cfg.seed)
    return base


def _batches(data: list[tuple[list[int], list[int]]], cfg: ColdStartConfig, step: int):
    """The batch of `step`: a seeded permutation per epoch, padded on the right (deterministic)."""
    per_epoch = max(1, len(data) // cfg.batch_size)
    epoch, k = divmod(step, per_epoch)
    order = list(range(len(data)))
    random.Random(f"{cfg.seed}/{epoch}").shuffle(order)
    return _pad([data[i] for i in order[k * cfg.batch_size:(k + 1) * cfg.batch_size]])


def _pad(rows: list[tuple[list[int], list[int]]]):
    """(ids, attention mask, labels, loss mask) of `(ids, loss mask)` rows, padded on the right."""
    import torch

    width = max(len(x) for x, _ in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (x, m) in enumerate(rows):
        ids[r, :len(x)] = torch.tensor(x)
        att[r, :len(x)] = 1
        mask[r, :len(x)] = torch.tensor(m)
        labels[r, :len(x)] = torch.tensor([t if mk else -100 for t, mk in zip(x, m)])
    return ids, att, labels, mask


def copy_batch(tokenizer, rng: random.Random, n: int = 32):
    """(ids, attention mask, labels) of `n` synthetic copy sequences: a request naming ids
    (DriftBench's formats) among distractor numbers, then those ids in tool-call form (the loss is
    on that part only)."""
    from training.policy import ASSISTANT, USER

    rows = []
    for _ in range(n):
        a = f"{rng.choice('OA')}-{rng.randint(100, 9999)}"
        b = f"{rng.choice('UL')}-{rng.randint(10, 9999)}"
        nums = " ".join(f"{rng.choice(['days', 'amount', 'hours', 'due'])}={rng.randint(0, 300)}" for _ in range(3))
        context = f"{USER}please check {a}, my id is {b}. {nums}{ASSISTANT}"
        target = f'lookup {{"id":"{a}"}} then {{"id":"{b}"}}'
        x = tokenizer.encode(context, add_special_tokens=False)
        y = tokenizer.encode(target, add_special_tokens=False)
        rows.append((x + y, [0] * len(x) + [1] * len(y)))
    return _pad(rows)


def sft_step_loss(model, ids, att, labels, context_weight: float, mask=None, decision_weight: float = 1.0):
    """Weighted mean NLL of completion tokens (`labels` != -100; tokens whose `mask` is
    `DECISION` count `decision_weight` times) + `context_weight` × mean NLL of the other real
    tokens (the context: policy, tools, requests, observations)."""
    import torch

    from training.sft_data import DECISION

    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                            reduction="none").view(ids.shape[0], -1)
    target = (labels[:, 1:] != -100).float()
    context = att[:, 1:].float() * (1.0 - target)
    weight = target if mask is None else torch.where(mask[:, 1:] == DECISION, decision_weight, target)
    loss = (nll * weight).sum() / weight.sum().clamp(min=1.0)
    if context_weight:
        loss = loss + context_weight * (nll * context).sum() / context.sum().clamp(min=1.0)
    return loss


def train_coldstart(out_dir: str | Path, cfg: ColdStartConfig, progress: bool = True, device: str = "cpu") -> Path:
    """Run (or resume) cold-start SFT; write `out_dir/policy` and `out_dir/DONE.json`.

    `device` ("cpu", "cuda") is where the steps run, not part of the config: a checkpoint written on
    one device resumes on another, and a run finished on a GPU is reused by a CPU machine."""
    import torch
    from tqdm.auto import tqdm

    from training.policy import load_model, load_tokenizer, save_policy
    from training.sft_data import encode_example, generate_examples

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.num_threads)
    cfg_dict = asdict(cfg)
    base = build_base(out, cfg)
    tok = load_tokenizer(base)
    examples = generate_examples(cfg.n_examples, seed=cfg.seed)
    data = [d for d in (encode_example(e, tok) for e in examples) if len(d[0]) <= cfg.max_len]
    torch.manual_seed(cfg.seed)
    model = load_model(base, trainable=True).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    ckpt, best, step, log, checks = out / "checkpoint.pt", out / "best_check.pt", 0, [], []
    if ckpt.exists():
        try:
            state = torch.load(ckpt, map_location="cpu", weights_only=False)
        except Exception as e:  # a corrupt checkpoint: say so and start over (nothing else is lost)
            print(f"checkpoint {ckpt} unreadable ({e}); starting from scratch")
            state = None
        if state is not None and state.get("config") == cfg_dict:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])  # moves the moments to the parameters' device
            step, log, checks = state["step"], state["log"], state.get("checks", [])
    t0, c0 = time.time(), time.process_time()  # CPU seconds too: wall time depends on the machine's load
    total = cfg.copy_warmup_steps + cfg.max_steps
    end = total + (cfg.refine_max_steps if cfg.quality_target is not None else 0)
    bar = tqdm(total=end, initial=step, desc=f"coldstart[{cfg.preset}]", disable=not progress)
    model.train()
    rng = random.Random(f"copy/{cfg.seed}")
    for _ in range(min(step, cfg.copy_warmup_steps)):  # a resumed run continues the same copy stream
        copy_batch(tok, rng)
    refine: list = []

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "log": log,
                    "config": cfg_dict, "checks": checks}, tmp)
        os.replace(tmp, ckpt)

    def check() -> None:
        checks.append(quality_check(model, tok, cfg, step))
        bar.write(f"quality check at step {step}: {checks[-1]}")
        if _worst(checks[-1]) > max((_worst(c) for c in checks[:-1]), default=-1.0):
            tmp = best.with_suffix(".tmp")  # the best-checked weights so far (the earliest on ties)
            torch.save(model.state_dict(), tmp)
            os.replace(tmp, best)
        save()

    while step < end:
        if cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds:
            break
        if step >= total and (step - total) % cfg.refine_every == 0 and (not checks or checks[-1]["step"] != step):
            check()
        if step >= total and checks[-1]["met"]:
            break
        if step < cfg.copy_warmup_steps:
            ids, att, labels, _ = (t.to(device) for t in copy_batch(tok, rng))
            lr, loss = cfg.lr, model(input_ids=ids, attention_mask=att, labels=labels).loss
        elif step >= total:
            if not refine:
                refine = refine_data(cfg, tok, checks[0])  # the domains behind when refinement began
            ids, att, labels, mask = (t.to(device) for t in _refine_batch(data, refine, cfg, step))
            lr = cfg.lr * cfg.refine_lr_scale
            loss = sft_step_loss(model, ids, att, labels, cfg.context_loss_weight, mask, cfg.decision_loss_weight)
        else:
            ids, att, labels, mask = (t.to(device) for t in _batches(data, cfg, step - cfg.copy_warmup_steps))
            lr = _lr_at(step - cfg.copy_warmup_steps, cfg)
            loss = sft_step_loss(model, ids, att, labels, cfg.context_loss_weight, mask, cfg.decision_loss_weight)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        log.append({"step": step, "loss": loss.item(), "lr": lr,
                    "phase": "copy" if step <= cfg.copy_warmup_steps else "sft" if step <= total else "refine",
                    "tokens": int(att.sum()),
                    "elapsed_s": round(time.time() - t0, 3), "cpu_s": round(time.process_time() - c0, 3)})
        bar.update(1)
        bar.set_postfix(loss=f"{log[-1]['loss']:.3f}")
        if step % cfg.save_every == 0 or step == total:
            save()
    if step > total and step == end and checks[-1]["step"] != step:  # where the refinement ended
        check()
    bar.close()
    selected = step
    if checks and not checks[-1]["met"] and best.exists():  # refinement never met the target: keep the best check
        top = max(checks, key=_worst)
        if top["step"] != step:
            model.load_state_dict(torch.load(best, map_location="cpu"))
            selected = top["step"]
            print(f"target not met; the policy is the weights of the best check (step {selected}: {top})")
    model.cpu().eval()
    machine = machine_info(device)
    policy = save_policy(model, tok, out / "policy", meta={"preset": cfg.preset, "seed": cfg.seed, "steps": step,
                                                            "selected_step": selected, "coldstart": cfg_dict,
                                                            "quality_checks": checks,
                                                            "machine": machine})
    with open(out / "train_log.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in log)
    _plot(log, out / "loss.png")
    _atomic_json(out / DONE, {"config": cfg_dict, "steps": step, "selected_step": selected, "n_examples": len(data),
                              "quality_checks": checks, "machine": machine,
                              "final_loss": log[-1]["loss"] if log else None,
                              "train_seconds_this_run": round(time.time() - t0, 1)})
    return policy


def quality_check(model, tokenizer, cfg: ColdStartConfig, step: int) -> dict:
    """Greedy memory-following per domain on train-split changed-rule tasks (never the test split
    the benchmark reports), and whether the worst domain meets `cfg.quality_target`."""
    from dynamic_bench.domains import DOMAINS
    from training.coldstart_eval import memory_following
    from training.engines.torch_engine import TorchEngine

    engine = TorchEngine(model=model, tokenizer=tokenizer, seed=cfg.seed)  # puts the model in eval mode
    scores = {d: memory_following(engine, tokenizer, d, cfg.quality_tasks, cfg.seed, split="train")["success"]
              for d in DOMAINS}
    model.train()
    return {"step": step, **scores, "met": _worst(scores) >= (cfg.quality_target or 0.0)}


def _worst(check: dict) -> float:
    """A quality check's score: its worst domain."""
    from dynamic_bench.domains import DOMAINS

    return min(check[d] for d in DOMAINS)


def refine_data(cfg: ColdStartConfig, tokenizer, check: dict) -> list[tuple[list[int], list[int]]]:
    """Fresh memory examples (seeded, unseen in the main data) of the domains below the target."""
    from dynamic_bench.domains import DOMAINS
    from training.sft_data import encode_example, generate_examples

    lagging = tuple(d for d in DOMAINS if check[d] < (cfg.quality_target or 0.0)) or tuple(DOMAINS)
    examples = generate_examples(cfg.refine_examples, seed=20_000 + cfg.seed, domains=lagging,
                                 kind_weights={"memory": 1.0})
    return [d for d in (encode_example(e, tokenizer) for e in examples) if len(d[0]) <= cfg.max_len]


def _refine_batch(data: list, refine: list, cfg: ColdStartConfig, step: int):
    """Half refine examples, half main data, drawn by a generator seeded with the step (resumable)."""
    rng = random.Random(f"{cfg.seed}/refine/{step}")
    half = cfg.batch_size // 2
    return _pad([refine[rng.randrange(len(refine))] for _ in range(half)]
                + [data[rng.randrange(len(data))] for _ in range(cfg.batch_size - half)])


def _plot(log: list[dict], path: Path) -> None:
    if not log:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log])
    ax.set_xlabel("step")
    ax.set_ylabel("SFT loss (completion tokens)")
    ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def ensure_coldstart(out_dir: str | Path, preset: str = "small", seed: int = 0, progress: bool = True,
                     device: str = "cpu", **overrides) -> Path:
    """The cold-start policy folder `out_dir/policy`: reused if built with the same config, else
    built (or resumed from its checkpoint)."""
    cfg = config_for(preset, seed, **overrides)
    out = Path(out_dir)
    done = out / DONE
    if done.exists() and (out / "policy" / "config.json").exists():
        try:
            if json.loads(done.read_text()).get("config") == asdict(cfg):
                return out / "policy"
        except json.JSONDecodeError:
            pass
        done.unlink()
    return train_coldstart(out, cfg, progress=progress, device=device)
