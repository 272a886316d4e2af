"""`train_rl(cfg)`: async GRPO-family RL with LoRA over DriftBench tasks, resumable.

Loop per learner step: collect `groups_per_step` admitted, informative groups from the rollout
workers (η=0: synchronous; η>0: workers keep running on the previous adapter while the learner
trains) → one optimizer step (policy gradient + supervised corrections) → save the adapter as the
next policy version and publish it to the workers → scheduler tick → diagnostics row →
checkpoint (adapter + optimizer + scheduler + RNG + staleness counters) every few steps.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from training.rl.async_rl import AdapterChannel, StalenessGate, WorkerPool, WorkOrder, collect
from training.rl.diagnostics import Diagnostics, group_stats
from training.rl.learner import Learner, LossSettings, PrefPair, Row, episode_chains, rows_from_groups
from training.rl.runner import EpisodeRunnerFactory, correction_rows, evaluate
from training.rl.scheduler import SchedulerConfig, TaskScheduler


@dataclass
class RLConfig:
    # what to train
    model: str = ""  # policy folder (the cold-start model); the LoRA adapter goes on top of it
    out_dir: str = "runs/rl"
    env_id: str = "driftbench/retail-v1"
    rule_version: int = 1  # rules the RL tasks are drawn under (when no task pool is passed)
    n_tasks: int = 16
    replay_rule_version: int | None = None  # older-rule tasks mixed in to limit forgetting
    n_replay_tasks: int = 0
    n_heldout: int = 0  # test-split tasks under `rule_version` scored greedily every `eval_every` steps
    eval_every: int = 5
    scaffold: str = "direct"
    max_turns: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    seed: int = 0
    device: str = "cpu"  # cpu | cuda: the learner and every rollout engine (threads share it; see EpisodeRunnerFactory)
    # optimisation
    steps: int = 20
    max_minutes: float = 0.0  # wall-clock stop: no new step after this many minutes of steps (0: `steps` only)
    groups_per_step: int = 4
    group_size: int = 0  # 0: adaptive (the scheduler picks G from the task's success rate)
    max_groups_per_step: int = 0  # dynamic sampling budget per step (0: 4 × groups_per_step)
    dynamic_sampling: bool = True
    lr: float = 2e-4
    lora_r: int = 8
    lora_alpha: int = 16
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1  # optimizer steps per batch; > 1 freezes the proximal policy so the clip bounds them
    micro_batch_tokens: int = 16384
    # loss (training/rl/loss.py)
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
    # exploration and corrections (PROTOTYPE-FINDINGS 4)
    explore_eps: float = 0.0  # per-turn chance of substituting an alternative valid action
    explore_is: str = "policy"  # "policy" | "mixture": which behaviour logprob substituted turns carry
    sft_coef: float = 0.0  # weight of supervised corrections (user edits / takeovers) in each step
    pref_coef: float = 0.0  # weight of the DPO term on logged preference pairs (TaskPool.pref_pairs)
    dpo_beta: float = 0.1
    experience_per_step: int = 8  # logged SFT rows and preference pairs drawn into each step
    keep_corrections: bool = True  # the run's corrections join the logged rows that each step draws from
    rehearsal_per_step: int = 8  # rows of TaskPool.rehearsal drawn into each step (with sft_coef > 0)
    sft_warmup_epochs: int = 0  # supervised passes over every logged row (focus, sft, rehearsal) before RL
    sft_warmup_batch: int = 32  # rows per optimizer step of that warm-up (supervised_warmup)
    sft_warmup_lr: float = 0.0  # the warm-up's learning rate (0: `lr`); RL steps keep `lr`
    # async actor/learner
    eta: int = 0  # staleness bound; 0 = synchronous
    n_workers: int = 2
    backend: str = "thread"  # thread | process | ray
    queue_size: int = 2  # orders in flight beyond one per worker (async only)
    tool_latency_mu: float = 0.0  # lognormal log-mean of simulated tool latency, seconds = e^N(mu, sigma)
    tool_latency_sigma: float = 0.0  # 0 and mu 0: no simulated latency
    # scheduler
    use_scheduler: bool = True
    replay_share: float = 0.2
    replay_anchors: bool = True  # a replay task the policy still always solves gives its shortest success as
                                 # supervised rows, like corrections only when sft_coef > 0 (else its
                                 # all-equal group teaches nothing: replay_anchor_rows)
    retire_above: float = 0.95
    break_below: float = 0.05
    cooldown: int = 10
    # bookkeeping
    checkpoint_every: int = 5
    resume: bool = True
    keep_adapters: int = 0  # adapter versions kept on disk (0: η + 3)
    progress: bool = True

    def validate(self) -> None:
        if not self.model:
            raise ValueError("RLConfig.model: give the policy folder to train (e.g. the cold-start model)")
        if self.eta < 0:
            raise ValueError("RLConfig.eta must be ≥ 0")
        if self.explore_is not in ("policy", "mixture"):
            raise ValueError("RLConfig.explore_is must be 'policy' or 'mixture'")
        if not self.decoupled and self.correction != "none":
            raise ValueError("corrections need decoupled=True (the proximal policy); or set correction='none'")


@dataclass
class TaskPool:
    """Tasks the run draws from (ids → Task), the replay subset and held-out sets.

    `heldout`: a list (logged as `heldout_success`) or named lists (`heldout_<name>`; the first
    one is also `heldout_success`), each scored greedily every `eval_every` steps.
    """

    tasks: dict[str, Any] = field(default_factory=dict)
    replay: set[str] = field(default_factory=set)
    heldout: list[Any] | dict[str, list[Any]] = field(default_factory=list)
    # logged experience (the evolve cycle's mining): supervised rows and preference pairs, drawn
    # `experience_per_step` at a time into each learner step beside the rollouts
    sft_rows: list[Row] = field(default_factory=list)
    pref_pairs: list[PrefPair] = field(default_factory=list)
    # rows that fill up to half of each step's draw before `sft_rows` do: the few decisions only
    # memory got right and their anchors (evolve.distill with CycleConfig.distill_focus), which a
    # uniform draw from ~900 rows showed each ~0.5 times in a 30-step cycle
    sft_focus: list[Row] = field(default_factory=list)
    # memory notes shown to the policy when it plays a task (ids → notes; absent: no memory), as the
    # runtime shows recalled memory: RL that rewards acting on what memory says
    memory: dict[str, list[str]] = field(default_factory=dict)
    # supervised rows of a skill the run must keep though no task exercises it (e.g. following a
    # recalled memory item: evolve.training_rows.rehearsal_examples), `rehearsal_per_step` in each step
    rehearsal: list[Row] = field(default_factory=list)


def _draw(items: list, k: int, seed: str) -> list:
    """`k` items of `items` (all if fewer), the same for the same seed (resumes draw alike)."""
    return list(items) if len(items) <= k else random.Random(seed).sample(items, k)


def experience_rows(pool: TaskPool, corrections: list[Row], k: int, seed: str) -> list[Row]:
    """One step's `k` logged SFT rows: up to half from `pool.sft_focus`, the rest from the other
    logged rows and the run's kept corrections."""
    focus = _draw(pool.sft_focus, k // 2, f"{seed}/focus")
    return focus + _draw(pool.sft_rows + corrections, k - len(focus), seed)


def replay_anchor_rows(trajectories: list, is_replay: bool) -> list[Row]:
    """Supervised rows that hold an older-rule behaviour the policy still has: the shortest of a
    replay group's trajectories when every one of them succeeded, its sampled ids as targets.

    Why: dynamic sampling drops all-equal groups, so a replay task the policy still solves gives
    no gradient at all, neither policy gradient nor KL, and replay cannot hold what the other rows
    pull away (the demo's cycle: 40% of draws replayed, old rules -7.0 points). Its own successful
    sample, trained on like a correction, keeps that decision in each step's batch.
    """
    if not is_replay or not trajectories or not all(t.outcome == "success" for t in trajectories):
        return []
    best = min(trajectories, key=lambda t: len(t.steps))
    return [Row(list(s.prompt_token_ids), list(s.completion_token_ids), [], sft=True)
            for s in best.steps if s.completion_token_ids]


def supervised_warmup(learner: Learner, pool: TaskPool, cfg: RLConfig, out: Path) -> dict:
    """`cfg.sft_warmup_epochs` seeded passes over all of the pool's supervised rows (focus, logged,
    rehearsal), about `cfg.sft_warmup_batch` rows per optimizer step (`warmup_batches`); the summary
    goes to `warmup.json`.

    Why: RL steps draw logged rows a few at a time and take them in one optimizer step each, so in
    a 30-step cycle each memory-distilled row was seen ~0.6 times (the demo: 1538 focus rows, 365 of
    them distilled, 32 focus rows a step): what memory taught barely reached the weights. A supervised
    pass first (SFT, then RL, as in the practice) gives every row its gradient steps; the anchors and
    rehearsal rows in the same batches hold what the policy already did right."""
    rows = list(pool.sft_focus) + list(pool.sft_rows) + list(pool.rehearsal)
    bs = max(1, cfg.sft_warmup_batch)
    epochs = cfg.sft_warmup_epochs if rows else 0
    chains = episode_chains(rows)
    plan = [warmup_batches(chains, bs, f"{cfg.seed}/warmup/{epoch}") for epoch in range(epochs)]
    epoch_loss: list[float] = []
    t0 = time.perf_counter()
    lr = cfg.sft_warmup_lr or cfg.lr
    bar = _progress(cfg, sum(map(len, plan)), "sft warm-up") if epochs else None
    learner.set_lr(lr)
    try:
        for batches in plan:
            losses: list[float] = []
            for batch in batches:
                losses.append(float(learner.step([], batch)["sft_loss"]))
                if bar is not None:
                    bar.update(1)
            epoch_loss.append(sum(losses) / len(losses))
    finally:
        learner.set_lr(cfg.lr)
        if bar is not None:
            bar.close()
    summary = {"epochs": epochs, "rows": len(rows), "focus_rows": len(pool.sft_focus),
               "steps": sum(map(len, plan)), "batch": bs, "lr": lr,
               "seconds": round(time.perf_counter() - t0, 1), "epoch_loss": epoch_loss}
    (out / "warmup.json").write_text(json.dumps(summary, indent=2))
    return summary


def warmup_batches(chains: list[list[Row]], batch: int, seed: str) -> list[list[Row]]:
    """One warm-up epoch: the episodes `chains` (`episode_chains` of the rows) in a seeded order,
    whole episodes per batch, a batch closed once it holds `batch` rows.

    Why whole episodes: the learner runs an episode's turns as one sequence (`packed_sequences`),
    so a batch of 32 turns from ~8 episodes costs ~8 sequences where 32 shuffled turns cost 32. The
    demo's warm-up took 244 s an epoch over 2,716 rows shuffled turn by turn, 70-80 s by episode."""
    out: list[list[Row]] = [[]]
    for chain in random.Random(seed).sample(chains, len(chains)):
        if len(out[-1]) >= batch:
            out.append([])
        out[-1].extend(chain)
    return [b for b in out if b]


def default_pool(cfg: RLConfig) -> TaskPool:
    from dynamic_bench import generate_tasks
    from dynamic_bench.env import ENV_IDS

    domain = ENV_IDS[cfg.env_id]
    pool = TaskPool()
    for t in generate_tasks(domain, cfg.n_tasks, seed=cfg.seed, split="train", rule_version=cfg.rule_version):
        pool.tasks[t.id] = t
    if cfg.replay_rule_version is not None and cfg.n_replay_tasks:
        for t in generate_tasks(domain, cfg.n_replay_tasks, seed=cfg.seed + 1, split="train",
                                rule_version=cfg.replay_rule_version):
            pool.tasks[t.id] = t
            pool.replay.add(t.id)
    if cfg.n_heldout:
        pool.heldout = generate_tasks(domain, cfg.n_heldout, seed=cfg.seed + 2, split="test",
                                      rule_version=cfg.rule_version)
    return pool


# ---- checkpoints --------------------------------------------------------------------------------
def _save_checkpoint(out: Path, learner: Learner, state: dict) -> None:
    """Write to `checkpoint.new`, then swap it in: a kill mid-write leaves the previous one intact."""
    new, cur, old = out / "checkpoint.new", out / "checkpoint", out / "checkpoint.old"
    shutil.rmtree(new, ignore_errors=True)
    learner.save_adapter(new / "adapter")
    torch.save({**state, "learner": learner.state_dict()}, new / "state.pt")
    (new / "COMPLETE").write_text(str(state["step"]))
    shutil.rmtree(old, ignore_errors=True)
    if cur.exists():
        cur.rename(old)
    new.rename(cur)
    shutil.rmtree(old, ignore_errors=True)


def _find_checkpoint(out: Path) -> Path | None:
    for name in ("checkpoint", "checkpoint.old"):
        if (out / name / "COMPLETE").exists():
            return out / name
    return None


# ---- the run ------------------------------------------------------------------------------------
def train_rl(cfg: RLConfig, pool: TaskPool | None = None,
             on_step: Callable[[int, dict], None] | None = None) -> Path:
    """Train a LoRA adapter with RL; returns `out_dir/adapter`. Metrics: `out_dir/metrics.jsonl`.

    `pool` overrides the generated task pool (the evolve cycle passes its mined RL task pool);
    `on_step(step, row)` is called after every logged step (progress hooks, tests).
    """
    cfg.validate()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    pool = pool or default_pool(cfg)
    if not pool.tasks:
        raise ValueError("the RL task pool is empty")

    sched = TaskScheduler(SchedulerConfig(replay_share=cfg.replay_share, retire_above=cfg.retire_above,
                                          break_below=cfg.break_below, cooldown=cfg.cooldown))
    for tid in pool.tasks:
        sched.add_task(tid, replay=tid in pool.replay)
    gate = StalenessGate(cfg.eta)
    rng = random.Random(cfg.seed)
    step = version = order_id = 0
    ckpt = _find_checkpoint(out) if cfg.resume else None
    learner = Learner(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lr=cfg.lr, seed=cfg.seed,
                      settings=LossSettings.from_config(cfg), adapter=ckpt / "adapter" if ckpt else None,
                      device=cfg.device)
    diag = Diagnostics(out)
    channel = AdapterChannel(out / "adapters")
    adapter_path: Path | None = None
    ckpt_state: dict | None = None

    def checkpoint(corrections: list[Row]) -> None:
        _save_checkpoint(out, learner, {"step": step, "version": version, "order_id": order_id,
                                        "scheduler": sched.state_dict(), "gate": gate.state_dict(),
                                        "rng": rng.getstate(), "corrections": corrections})

    if ckpt is not None:
        # read on the host: a checkpoint written on one device resumes on another (the optimizer's
        # load_state_dict moves its moments to the parameters' device)
        st = ckpt_state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
        learner.load_state_dict(st["learner"])
        step, version, order_id = st["step"], st["version"], st["order_id"]
        sched = TaskScheduler.from_state_dict(st["scheduler"])
        gate.load_state_dict(st["gate"])
        rng.setstate(st["rng"])
        adapter_path = learner.save_adapter(out / "adapters" / f"v{version}")
        diag.truncate(step)
    else:
        diag.truncate(0)
        if cfg.sft_warmup_epochs and cfg.sft_coef:  # then checkpointed: a resumed run does not redo it
            supervised_warmup(learner, pool, cfg, out)
            adapter_path = learner.save_adapter(out / "adapters" / "v0")
            checkpoint(corrections=[])
    channel.publish(adapter_path, version)

    def make_order() -> WorkOrder:
        nonlocal order_id
        tid = sched.sample(1, rng)[0] if cfg.use_scheduler else rng.choice(sorted(pool.tasks))
        g = cfg.group_size or sched.group_size(tid)
        order_id += 1
        return WorkOrder(order_id, tid, g, seed=cfg.seed * 1_000_003 + order_id,
                         payload={"task": pool.tasks[tid], "memory": pool.memory.get(tid)})

    admitted: list = []  # every admitted group of the current step, informative or not
    anchors: list[Row] = []  # this step's replay anchors (replay_anchor_rows)
    corrections: list[Row] = ckpt_state.get("corrections", []) if ckpt_state else []  # this run's, kept

    def keep(res) -> bool:
        admitted.append(res.trajectories)
        if cfg.replay_anchors and cfg.sft_coef:  # as corrections: rows the learner would not train on are not made
            anchors.extend(replay_anchor_rows(res.trajectories, res.task_id in pool.replay))
        rewards = [float(t.reward) for t in res.trajectories]
        sched.update(res.task_id, rewards, [t.outcome == "success" for t in res.trajectories])
        return not cfg.dynamic_sampling or (len(rewards) > 1 and max(rewards) > min(rewards))

    factory = EpisodeRunnerFactory.from_config(cfg)

    def score_heldout(engine) -> dict[str, float]:
        sets = pool.heldout if isinstance(pool.heldout, dict) else {"success": pool.heldout}
        scores = {f"heldout_{name}": evaluate(engine, factory, tasks, seed=cfg.seed) for name, tasks in sets.items()}
        return {**scores, "heldout_success": next(iter(scores.values()))} if scores else {}

    eval_engine = None
    start: dict[str, float] = {}
    if pool.heldout and cfg.eval_every and step == 0:  # a fresh engine serves the base policy
        eval_engine = factory.make_engine(seed=cfg.seed)
        start = score_heldout(eval_engine)
    workers = WorkerPool(factory, cfg.n_workers, out / "adapters", backend=cfg.backend)
    keep_versions = cfg.keep_adapters or cfg.eta + 3
    bar = _progress(cfg, cfg.steps, f"rl η={cfg.eta}", initial=step)
    t_start = time.perf_counter()
    try:
        while step < cfg.steps:
            t0 = time.perf_counter()
            admitted.clear()
            anchors.clear()
            groups, cstats = collect(workers, gate, version, cfg.groups_per_step, make_order,
                                     max_outstanding=cfg.n_workers + cfg.queue_size, sync=cfg.eta == 0,
                                     keep=keep, max_results=cfg.max_groups_per_step or 4 * cfg.groups_per_step)
            t1 = time.perf_counter()
            trajs = [g.trajectories for g in groups]
            rows, rstats = rows_from_groups(trajs, scale_by_std=cfg.scale_adv_by_std)
            # corrections count even from all-equal groups: that is where reward gives no signal
            fresh: list[Row] = correction_rows(admitted, learner.tokenizer) if cfg.sft_coef else []
            logged = (experience_rows(pool, corrections, cfg.experience_per_step, f"{cfg.seed}/sft/{step}")
                      if cfg.sft_coef else [])
            rehearsed = (_draw(pool.rehearsal, cfg.rehearsal_per_step, f"{cfg.seed}/rehearsal/{step}")
                         if cfg.sft_coef else [])
            sft = fresh + anchors + logged + rehearsed
            if cfg.keep_corrections:  # later steps redraw them: ~5 new ones a step are too few to learn from once
                known = {(tuple(r.prompt_ids), tuple(r.completion_ids)) for r in corrections}
                corrections += [r for r in fresh if (tuple(r.prompt_ids), tuple(r.completion_ids)) not in known]
            prefs = _draw(pool.pref_pairs, cfg.experience_per_step, f"{cfg.seed}/pref/{step}") if cfg.pref_coef else []
            lstats = learner.step(rows, sft, prefs)
            version += 1
            step += 1
            adapter_path = learner.save_adapter(out / "adapters" / f"v{version}")
            channel.publish(adapter_path, version)
            shutil.rmtree(out / "adapters" / f"v{version - keep_versions}", ignore_errors=True)
            if cfg.use_scheduler:
                sched.tick()
            lags = [version - 1 - g.version for g in groups]
            # out of time: this step is the last one (scored and checkpointed as the last)
            last = step == cfg.steps or bool(cfg.max_minutes and time.perf_counter() - t_start >= 60 * cfg.max_minutes)
            row = {"step": step, "version": version, "wall_s": time.perf_counter() - t_start,
                   "wait_s": t1 - t0, "train_s": time.perf_counter() - t1, **group_stats(admitted), **lstats,
                   "groups_trained": len(groups) - rstats["zero_var_groups"], **cstats,
                   "replay_anchor_rows": len(anchors), "rehearsal_rows": len(rehearsed),
                   "stale_rejected": cstats["groups_stale"], "staleness_mean": sum(lags) / max(len(lags), 1),
                   "staleness_hist": {str(k): lags.count(k) for k in sorted(set(lags))},
                   "scheduler": sched.counts(), "tasks": _task_states(sched)}
            if step == 1:  # the policy before any update: the held-out series' starting point
                row.update({f"{k}_start": v for k, v in start.items()})
            if pool.heldout and (step % cfg.eval_every == 0 or last):
                eval_engine = eval_engine or factory.make_engine(seed=cfg.seed)
                eval_engine.load_adapter(str(adapter_path), f"v{version}")
                row.update(score_heldout(eval_engine))
            diag.log(row)
            if step % cfg.checkpoint_every == 0 or last:
                checkpoint(corrections)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward_mean']:.2f}", zv=f"{row['zero_var_frac']:.2f}")
            if on_step is not None:
                on_step(step, row)
            if last:
                break
    finally:
        workers.close()
        if bar is not None:
            bar.close()
    final = out / "adapter"
    shutil.rmtree(final, ignore_errors=True)
    learner.save_adapter(final)
    diag.plot()
    lines = diag.diagnosis()
    (out / "diagnosis.txt").write_text("\n".join(f"- {x}" for x in lines) + "\n")
    return final


def _task_states(sched: TaskScheduler, limit: int = 200) -> dict[str, dict]:
    return {t: {"status": s.status, "success": round(s.success, 3), "replay": s.replay}
            for t, s in list(sched.tasks.items())[:limit]}


def _progress(cfg: RLConfig, total: int, desc: str, initial: int = 0):
    """A step bar (warm-up, RL steps) when `cfg.progress` asks for one."""
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", leave=False)


def read_metrics(out_dir: str | Path) -> list[dict]:
    """The metrics rows of a run folder."""
    p = Path(out_dir) / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
