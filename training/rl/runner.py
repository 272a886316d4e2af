"""What a rollout worker runs: an engine (optionally exploring, optionally with simulated tool
latency) and `training.rollout` episodes turned into GRPO groups of `Trajectory` objects.

Simulated tool latency: `training.rollout` advances every live episode of a batch together (one
`generate` per turn, then one env step per episode), so the tool calls of a turn are modelled as
running concurrently: after each turn the batch waits max over episodes of e^N(mu, sigma) seconds
(seeded per work order). That wait is what async RL hides and synchronous RL cannot.
"""
from __future__ import annotations

import math
import random
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from dynamic_bench.schema import CORRECTION_KINDS, Task, Trajectory
from training.engines.base import Engine, Generation, SamplingParams

# DriftBench's observation after a simulated user's correction (dynamic_bench/env.py).
_CORRECTED = re.compile(r"^user (?:edited it to|took over and did) (.+?); ", re.S)


class LatencyEngine(Engine):
    """Engine wrapper: after each batched turn, wait as long as the slowest of its tool calls."""

    def __init__(self, inner: Engine, mu: float, sigma: float, seed: int = 0) -> None:
        self.inner, self.mu, self.sigma = inner, mu, sigma
        self.rng = random.Random(seed)
        self.waited = 0.0

    @property
    def policy_version(self) -> str:  # type: ignore[override]
        return self.inner.policy_version

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed * 7919 + 17)
        if hasattr(self.inner, "reseed"):
            self.inner.reseed(seed)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out = self.inner.generate(prompts, params)
        d = max(math.exp(self.rng.gauss(self.mu, self.sigma)) for _ in prompts) if prompts else 0.0
        self.waited += d
        time.sleep(d)
        return out

    def logprobs(self, prompt_ids, completion_ids, **kw) -> list[float]:
        return self.inner.logprobs(prompt_ids, completion_ids, **kw)

    def load_adapter(self, adapter_path: str | None, version: str) -> None:
        self.inner.load_adapter(adapter_path, version)

    def close(self) -> None:
        self.inner.close()


@dataclass
class EpisodeRunnerFactory:
    """Picklable recipe for a worker's runner (threads, processes and Ray actors all build one).

    `device` is used as given by every worker: thread workers share the process (and the GPU);
    process workers each open their own CUDA context; Ray actors are started without a GPU
    reservation, so Ray may hide the GPU from them (CUDA_VISIBLE_DEVICES): use threads on a GPU.
    """

    model: str
    env_id: str = "driftbench/retail-v1"
    scaffold: str = "direct"
    max_turns: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    seed: int = 0
    tool_latency_mu: float = 0.0
    tool_latency_sigma: float = 0.0
    explore_eps: float = 0.0
    explore_is: str = "policy"
    device: str = "cpu"

    @classmethod
    def from_config(cls, cfg: Any) -> "EpisodeRunnerFactory":
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__})

    def make_engine(self, seed: int = 0):
        from training.engines import make_engine

        return make_engine(f"torch:{self.model}", seed=seed, device=self.device)

    def __call__(self, worker_index: int) -> "EpisodeRunner":
        return EpisodeRunner(self, worker_index)


class EpisodeRunner:
    def __init__(self, spec: EpisodeRunnerFactory, worker_index: int = 0) -> None:
        from runtime.scaffolds import get

        self.spec = spec
        self.base = spec.make_engine(seed=spec.seed + 1000 * worker_index)
        self.tokenizer = self.base.tokenizer
        self.engine: Engine = self.base
        self.explorer = None
        if spec.explore_eps > 0:
            from training.rl.explore import ExploringEngine

            self.engine = self.explorer = ExploringEngine(self.engine, self.tokenizer, eps=spec.explore_eps, mode=spec.explore_is,
                                          completion_text=get(spec.scaffold).completion_text)
        if spec.tool_latency_mu or spec.tool_latency_sigma:
            self.engine = LatencyEngine(self.engine, spec.tool_latency_mu, spec.tool_latency_sigma)

    def load_adapter(self, path: str | None, version: int) -> None:
        self.engine.load_adapter(path, str(version))

    def run(self, order: Any) -> list[Trajectory]:
        if hasattr(self.engine, "reseed"):
            self.engine.reseed(order.seed)
        before = dict(self.explorer.stats) if self.explorer else {}
        notes = order.payload.get("memory")
        trajs = rollout_tasks(self.engine, self.tokenizer, [order.payload["task"]], order.seed, self.spec,
                              group_size=order.group_size, memory=[notes] if notes else None)
        if self.explorer:  # how many turns of this group were substituted (diagnostics)
            for t in trajs:
                t.metadata["group_explored_turns"] = self.explorer.stats["explored"] - before["explored"]
                t.metadata["group_turns"] = self.explorer.stats["turns"] - before["turns"]
        return trajs


def rollout_tasks(engine: Engine, tokenizer: Any, tasks: Sequence[Task], seed: int, spec: EpisodeRunnerFactory,
                  group_size: int = 1, temperature: float | None = None,
                  memory: Sequence[Sequence[str]] | None = None) -> list[Trajectory]:
    """`training.rollout.rollout` with the run's settings: each task `group_size` times, batched;
    `memory[i]`, if given, the notes shown for `tasks[i]`."""
    from training.rollout import RolloutConfig, rollout

    cfg = RolloutConfig(scaffold=spec.scaffold, max_new_tokens=spec.max_new_tokens,
                        temperature=spec.temperature if temperature is None else temperature,
                        max_steps=spec.max_turns, seed=seed)
    return rollout(engine, tokenizer, list(tasks), cfg, memory=memory, group_size=group_size)


def correction_rows(groups: Sequence[Sequence[Trajectory]], tokenizer: Any) -> list:
    """Supervised rows from the user's corrections: the prompt of the corrected turn → the right action.

    An edit or a takeover carries the action the user wanted (DriftBench personas know the rules in
    force); it is tokenized as a target (not sampled, so there are no behaviour logprobs to keep).
    """
    from training.rl.learner import Row

    rows, seen = [], set()
    for group in groups:
        for t in group:
            for step_index, action in corrections(t):
                prompt = t.steps[step_index].prompt_token_ids
                key = (tuple(prompt), action)
                if key in seen:
                    continue
                seen.add(key)
                target = action_target_ids(tokenizer, action)
                rows.append(Row(list(prompt), target, [0.0] * len(target), sft=True))
    return rows


def action_target_ids(tokenizer: Any, action: str) -> list[int]:
    """The ids a model should write for `action` (the direct scaffold's completion: action, turn end)."""
    from training.policy import stop_token_ids

    return list(tokenizer.encode(action.strip(), add_special_tokens=False)) + list(stop_token_ids(tokenizer)[:1])


def corrections(traj: Trajectory) -> list[tuple[int, str]]:
    """(step index, the action the user wanted) for each edit or takeover in a trajectory.

    Read from `traj.feedback` when the recorder filled it, else from DriftBench's observation
    text after a simulated correction (`user edited it to ACTION; ...`).
    """
    out = []
    for fb in traj.feedback:
        action = (fb.payload or {}).get("action")
        if fb.kind in CORRECTION_KINDS and action and fb.step is not None and fb.step < len(traj.steps):
            out.append((fb.step, str(action)))
    if out:
        return out
    for s in traj.steps:
        m = _CORRECTED.match(s.observation or "")
        if m:
            out.append((s.index, m.group(1).strip()))
    return out


def evaluate(engine: Any, spec: EpisodeRunnerFactory, tasks: Sequence[Task], seed: int = 0,
             batch: int = 32) -> float:
    """Greedy success rate on `tasks` (no exploration, no simulated latency)."""
    quiet = EpisodeRunnerFactory(**{**asdict(spec), "tool_latency_mu": 0.0, "tool_latency_sigma": 0.0})
    tok = getattr(engine, "tokenizer", None)
    wins = 0
    for s in range(0, len(tasks), batch):
        trajs = rollout_tasks(engine, tok, tasks[s:s + batch], seed + s, quiet, temperature=0.0)
        wins += sum(t.outcome == "success" for t in trajs)
    return wins / max(len(tasks), 1)
