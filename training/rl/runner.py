"""What a rollout worker runs: an engine (optionally exploring), DriftBench envs with simulated
tool latency, and episodes turned into `Trajectory` objects (token ids, behaviour logprobs,
policy version, reward, the simulated user's corrections as `Feedback`).

Episodes are rolled out by `training.rollout` (owned by the engines engineer) when it provides
`rollout_episodes`; until then `_local_rollout` below does the same job (batched, multi-turn,
token in / token out) so the RL half can be built and tested.
"""
from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from dynamic_bench.schema import Feedback, Step, Task, Trajectory

CORRECTION_KINDS = ("edit", "takeover")


class LatencyEnv:
    """Env wrapper: every `step` waits a lognormal tool latency e^N(mu, sigma) seconds (seeded)."""

    def __init__(self, env: Any, mu: float, sigma: float, seed: int = 0) -> None:
        self.env, self.mu, self.sigma = env, mu, sigma
        self.rng = random.Random(seed)
        self.waited = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = random.Random(seed * 7919 + 17)
        return self.env.reset(seed=seed, options=options)

    def step(self, action_text: str):
        if self.mu or self.sigma:
            d = math.exp(self.rng.gauss(self.mu, self.sigma))
            self.waited += d
            time.sleep(d)
        return self.env.step(action_text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


@dataclass
class EpisodeRunnerFactory:
    """Picklable recipe for a worker's runner (threads, processes and Ray actors all build one)."""

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

    @classmethod
    def from_config(cls, cfg: Any) -> "EpisodeRunnerFactory":
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__})

    def make_engine(self, seed: int = 0):
        from training.engines import make_engine

        return make_engine(f"torch:{self.model}", seed=seed)

    def __call__(self, worker_index: int) -> "EpisodeRunner":
        return EpisodeRunner(self, worker_index)


class EpisodeRunner:
    def __init__(self, spec: EpisodeRunnerFactory, worker_index: int = 0) -> None:
        from training.policy import stop_token_ids

        self.spec = spec
        self.base = spec.make_engine(seed=spec.seed + 1000 * worker_index)
        self.tokenizer = self.base.tokenizer
        self.engine = self.base
        if spec.explore_eps > 0:
            from training.rl.explore import ExploringEngine

            self.engine = ExploringEngine(self.base, self.tokenizer, eps=spec.explore_eps, mode=spec.explore_is,
                                          end_ids=stop_token_ids(self.tokenizer))

    def load_adapter(self, path: str | None, version: int) -> None:
        self.engine.load_adapter(path, str(version))

    def run(self, order: Any) -> list[Trajectory]:
        task = order.payload["task"]
        if hasattr(self.engine, "reseed"):
            self.engine.reseed(order.seed)
        return rollout_tasks(self.engine, self.tokenizer, [task] * order.group_size, order.seed, self.spec)


def rollout_tasks(engine: Any, tokenizer: Any, tasks: Sequence[Task], seed: int, spec: EpisodeRunnerFactory,
                  temperature: float | None = None) -> list[Trajectory]:
    """Roll out one episode per task (a group: the same task repeated), batched across episodes."""
    try:
        from training.rollout import rollout_episodes  # the engines engineer's rollout, when it lands
    except ImportError:
        rollout_episodes = None
    envs = [_make_env(spec, seed + i) for i in range(len(tasks))]
    temp = spec.temperature if temperature is None else temperature
    if rollout_episodes is not None:
        return rollout_episodes(engine, tokenizer, envs, list(tasks), scaffold=spec.scaffold,
                                max_turns=spec.max_turns, max_new_tokens=spec.max_new_tokens,
                                temperature=temp, seed=seed)
    return _local_rollout(engine, tokenizer, envs, tasks, seed, spec, temp)


def _make_env(spec: EpisodeRunnerFactory, seed: int) -> Any:
    import dynamic_bench

    env = dynamic_bench.make(spec.env_id, max_steps=spec.max_turns, user_simulation=True)
    if spec.tool_latency_mu or spec.tool_latency_sigma:
        env = LatencyEnv(env, spec.tool_latency_mu, spec.tool_latency_sigma, seed)
    return env


def _render(tokenizer: Any, info: dict, history: list[tuple[str, str]]) -> list[int]:
    """Prompt ids for the next turn (the `direct` layout of the policy's turn tokens)."""
    from training.policy import ASSISTANT, BOS, OBS, SYSTEM, TOOLS, USER

    tools = "\n".join(_signature(t) for t in info["tools"])
    parts = [BOS, SYSTEM, info["policy_text"], TOOLS, tools]
    for role, text in history:
        parts += [USER if role == "user" else (ASSISTANT if role == "assistant" else OBS), text]
    parts.append(ASSISTANT)
    return tokenizer.encode("".join(parts), add_special_tokens=False)


def _signature(t: dict) -> str:
    enums = t.get("enums", {})
    args = ", ".join(f"{a}:{'|'.join(enums[a]) if a in enums else typ}" for a, typ in t["args"].items())
    return f"{t['name']}({args})"


def _local_rollout(engine, tokenizer, envs, tasks, seed, spec, temperature) -> list[Trajectory]:
    from training.engines.base import SamplingParams
    from training.policy import stop_token_ids

    n = len(tasks)
    trajs, infos, hist = [], [], []
    for i, (env, task) in enumerate(zip(envs, tasks)):
        obs, info = env.reset(seed=seed + i, options={"task": task})
        infos.append(info)
        hist.append([("user", obs.removeprefix("user: "))])
        trajs.append(Trajectory(task_id=task.id, scaffold=spec.scaffold, rule_version=task.rule_version,
                                policy_version=str(engine.policy_version), metadata={"explored_turns": 0}))
    active = list(range(n))
    stops = stop_token_ids(tokenizer)
    pool = ThreadPoolExecutor(max_workers=n) if (spec.tool_latency_mu or spec.tool_latency_sigma) else None
    try:
        for turn in range(spec.max_turns):
            if not active:
                break
            prompts = [_render(tokenizer, infos[i], hist[i]) for i in active]
            params = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=temperature,
                                    stop_token_ids=stops, seed=seed * 1009 + turn * 131)
            t0 = time.perf_counter()
            gens = engine.generate(prompts, params)
            texts = [tokenizer.decode(g.token_ids, skip_special_tokens=True).strip() for g in gens]
            steps = [envs[i].step for i in active]
            results = list(pool.map(lambda f, t: f(t), steps, texts)) if pool else [f(t) for f, t in zip(steps, texts)]
            dt = time.perf_counter() - t0
            still = []
            for i, prompt, g, text, (obs, reward, term, trunc, info) in zip(active, prompts, gens, texts, results):
                tr = trajs[i]
                tr.steps.append(Step(index=turn, prompt_token_ids=prompt, completion_token_ids=g.token_ids,
                                     behaviour_logprobs=g.logprobs, policy_version=str(g.policy_version),
                                     action_text=text, action=info.get("action"), observation=obs, latency_s=dt))
                if g.extra.get("explore", {}).get("substituted"):
                    tr.metadata["explored_turns"] += 1
                fb = info.get("feedback")
                if fb:
                    tr.feedback.append(Feedback(trajectory_id=tr.id, step=turn, kind=fb["kind"], source="simulator",
                                                payload={"action": fb.get("action")}))
                hist[i] += [("assistant", text), ("obs", obs)]
                if term or trunc:
                    v = info.get("verdict", {})
                    tr.reward = float(reward)
                    tr.reward_breakdown = dict(v.get("breakdown", {}))
                    tr.outcome = "success" if v.get("success") else "failure"
                    tr.ended_at = time.time()
                    tr.metadata["stale_violations"] = v.get("n_stale", 0)
                else:
                    still.append(i)
            active = still
    finally:
        if pool:
            pool.shutdown()
    for i in active:  # ran out of turns without the env ending the episode
        trajs[i].outcome, trajs[i].reward = "failure", 0.0
    return trajs


def correction_rows(groups: Sequence[Sequence[Trajectory]], tokenizer: Any) -> list:
    """Supervised rows from the user's corrections: the prompt of the corrected turn → the right action.

    An edit or a takeover carries the action the user wanted (DriftBench personas know the rules in
    force); it is tokenized as a target (not sampled, so there are no behaviour logprobs to keep).
    """
    from training.policy import stop_token_ids
    from training.rl.learner import Row

    end = list(stop_token_ids(tokenizer)[:1])
    rows, seen = [], set()
    for group in groups:
        for t in group:
            for fb in t.feedback:
                action = (fb.payload or {}).get("action")
                if fb.kind not in CORRECTION_KINDS or not action or fb.step is None or fb.step >= len(t.steps):
                    continue
                prompt = t.steps[fb.step].prompt_token_ids
                key = (tuple(prompt), action)
                if key in seen:
                    continue
                seen.add(key)
                target = list(tokenizer.encode(action, add_special_tokens=False)) + end
                rows.append(Row(list(prompt), target, [0.0] * len(target), sft=True))
    return rows


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
