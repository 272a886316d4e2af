"""Batched multi-turn DriftBench episodes without LangGraph: engine + env + scaffold -> Trajectory.

Token in, token out: each turn's prompt ids are the previous prompt ids, plus the completion ids
exactly as sampled, plus the ids of the new observation segment. Nothing sampled is decoded and
re-encoded (the decoded text is only parsed into the action). When an episode outgrows the
context, the oldest (completion, observation) pairs are dropped from the prompt as whole id
segments (runtime/scaffolds.py `fit_turns`), still without re-tokenizing anything.

All live episodes advance together: one `engine.generate` call per turn over every unfinished
episode. `group_size=G` runs each task G times (GRPO groups); trajectories carry their group
index and task in `metadata`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from dynamic_bench import make
from dynamic_bench.actions import ActionError, action_dict, parse_action
from dynamic_bench.schema import Step, Task, Trajectory
from runtime.scaffolds import Scaffold, fit_turns, get
from training.engines.base import Engine, SamplingParams


@dataclass
class RolloutConfig:
    """Sampling and episode settings of a rollout batch."""

    scaffold: str = "direct"
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    max_context: int = 1024
    max_steps: int = 10
    user_simulation: bool = True
    seed: int = 0


class Episode:
    """One live episode: its env, its id segments, and the steps taken so far."""

    def __init__(self, task: Task, memory: Sequence[str], scaffold: Scaffold, tokenizer, cfg: RolloutConfig,
                 env_seed: int, group_index: int) -> None:
        self.task, self.memory, self.sc, self.tok, self.cfg = task, list(memory), scaffold, tokenizer, cfg
        self.group_index = group_index
        self.env = make(f"driftbench/{task.domain}-v1", max_steps=cfg.max_steps)
        obs, info = self.env.reset(seed=env_seed, options={"task": task, "user_simulation": cfg.user_simulation})
        self.tools = {t["name"]: t for t in info["tools"]}
        self.head = scaffold.encode(tokenizer, scaffold.header_text(info["policy_text"], info["tools"], memory),
                                    first=True)
        self.segs: list[list[int]] = [scaffold.encode(tokenizer, scaffold.user_text(_user_message(obs, task)))]
        self.steps: list[Step] = []
        self.valid: list[bool] = []
        self.plans: list[str | None] = []
        self.done = False
        self.info = info
        self.truncated_context = 0

    def prompt(self) -> list[int]:
        budget = self.cfg.max_context - self.cfg.max_new_tokens
        keep = fit_turns(len(self.head), [len(s) for s in self.segs], budget)
        self.truncated_context = max(self.truncated_context, keep - 1)
        return self.head + [t for s in self.segs[:1] + self.segs[keep:] for t in s]

    def advance(self, prompt_ids: list[int], gen, stop_ids: Sequence[int], latency: float) -> None:
        text = self.tok.decode(gen.token_ids, skip_special_tokens=True)
        action_text, plan = self.sc.parse_completion(text)
        parsed = parse_action(action_text, _specs(self.tools))
        obs, reward, term, trunc, info = self.env.step(action_text)
        self.steps.append(Step(index=len(self.steps), prompt_token_ids=prompt_ids,
                               completion_token_ids=list(gen.token_ids), behaviour_logprobs=list(gen.logprobs),
                               policy_version=gen.policy_version, action_text=action_text,
                               action=action_dict(parsed), observation=obs, latency_s=latency))
        self.valid.append(not isinstance(parsed, ActionError))
        self.plans.append(plan)
        self.info = info
        if term or trunc:
            self.done = True
            return
        unfinished = not gen.token_ids or gen.token_ids[-1] not in stop_ids
        self.segs.append(list(gen.token_ids))
        self.segs.append(self.sc.encode(self.tok, self.sc.obs_text(obs, after_unfinished=unfinished)))

    def trajectory(self, policy_version: str) -> Trajectory:
        v = self.info.get("verdict", {})
        success = bool(v.get("success", False))
        return Trajectory(
            task_id=self.task.id, scaffold=self.sc.name, rule_version=self.task.rule_version,
            policy_version=self.steps[0].policy_version if self.steps else policy_version, steps=self.steps,
            reward=float(v.get("reward", 0.0)), reward_breakdown=dict(v.get("breakdown", {})),
            outcome="success" if success else "failure", ended_at=time.time(),
            metadata={"group_index": self.group_index, "domain": self.task.domain, "memory": self.memory,
                      "valid_actions": self.valid, "plans": self.plans,
                      "violations": list(v.get("violations", [])), "n_stale": int(v.get("n_stale", 0)),
                      "context_truncated_turns": self.truncated_context, "split": self.task.split})


def _user_message(obs: str, task: Task) -> str:
    return obs[len("user: "):] if obs.startswith("user: ") else (obs or task.instruction)


def _specs(tools: dict[str, dict]):
    from dynamic_bench.actions import ToolSpec

    return {n: ToolSpec(n, n, tuple(t["args"].items()), t["is_write"], t.get("description", ""),
                        tuple((k, tuple(v)) for k, v in t.get("enums", {}).items())) for n, t in tools.items()}


def rollout(engine: Engine, tokenizer, tasks: Sequence[Task], cfg: RolloutConfig | None = None,
            memory: Sequence[Sequence[str]] | None = None, group_size: int = 1,
            stop_ids: Sequence[int] | None = None) -> list[Trajectory]:
    """Run every task `group_size` times, batched per turn; trajectories in task-major order.

    `memory[i]` are the memory items shown for `tasks[i]` (retrieved notes). Seeds: episode `j`
    resets its env with `cfg.seed * 100_003 + j`, and turn `t` samples with seed `cfg.seed * 7919 + t`
    (the engine adds the prompt's index), so the same seed gives the same trajectories.
    """
    from training.policy import stop_token_ids

    cfg = cfg or RolloutConfig()
    sc = get(cfg.scaffold)
    stops = tuple(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer)
    eps = [Episode(t, (memory[i] if memory else ()), sc, tokenizer, cfg, cfg.seed * 100_003 + i * group_size + g, g)
           for i, t in enumerate(tasks) for g in range(group_size)]
    turn = 0
    while True:
        live = [e for e in eps if not e.done]
        if not live:
            break
        prompts = [e.prompt() for e in live]
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                                stop_token_ids=stops, seed=cfg.seed * 7919 + turn * 1009)
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        latency = (time.perf_counter() - t0) / max(1, len(live))
        for e, p, g in zip(live, prompts, gens):
            e.advance(p, g, stops, latency)
        turn += 1
    return [e.trajectory(engine.policy_version) for e in eps]


def group_by_task(trajs: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories of the same task (a GRPO group), in order."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(t.task_id, []).append(t)
    return out


def episode_tokens(traj: Trajectory) -> dict[str, Any]:
    """The last prompt + completion of a trajectory as one id list with a completion mask.

    When no context truncation happened, every step's prompt is a prefix of this list, so one
    forward pass scores every completion token of the episode (what an RL learner can use).
    """
    if not traj.steps:
        return {"ids": [], "mask": []}
    last = traj.steps[-1]
    ids = list(last.prompt_token_ids) + list(last.completion_token_ids)
    mask = [0] * len(ids)
    for s in traj.steps:
        start = len(s.prompt_token_ids)
        if ids[:start] != list(s.prompt_token_ids):
            raise ValueError("context truncation broke the prefix property; score steps one by one")
        for j in range(start, start + len(s.completion_token_ids)):
            mask[j] = 1
    return {"ids": ids, "mask": mask}
