"""The environment checker every DriftBench domain must pass (Gymnasium's `check_env` in spirit).

It checks the API shape, determinism by seed, that malformed actions become error
observations, truncation, judging, and that the oracle solves every rule version.
"""
from __future__ import annotations

from typing import Any

from dynamic_bench.agents import OracleAgent, run_episode
from dynamic_bench.env import INFO_KEYS, DriftEnv
from dynamic_bench.tasks import generate_tasks

MALFORMED = ["", "   ", "{not json", 'get_x {"a":1}', "reply", 'reply {"text": 3}', 'reply {"txt":"x"}',
             "x" * 5000, "refund [1,2]", 'reply {"text":"a"} trailing', "\x00\x01", "12 {}"]


class EnvCheckError(AssertionError):
    pass


def _check_info(info: Any, where: str, problems: list[str]) -> None:
    if not isinstance(info, dict):
        problems.append(f"{where}: info is {type(info).__name__}, not dict")
        return
    missing = [k for k in INFO_KEYS if k not in info]
    if missing:
        problems.append(f"{where}: info lacks {missing}")
    if not isinstance(info.get("policy_text"), str) or not info.get("policy_text"):
        problems.append(f"{where}: policy_text is not a non-empty str")
    tools = info.get("tools")
    if not isinstance(tools, list) or not all({"name", "args", "is_write"} <= set(t) for t in tools):
        problems.append(f"{where}: tools is not a list of specs")


def check_env(env: DriftEnv, n_episodes: int = 3, seed: int = 0) -> None:
    """Raise EnvCheckError listing every problem found; return None if the env passes."""
    problems: list[str] = []
    d = env.domain
    obs, info = env.reset(seed=seed)
    if not isinstance(obs, str) or not obs:
        problems.append("reset: observation is not a non-empty str")
    _check_info(info, "reset", problems)
    obs2, info2 = env.reset(seed=seed)
    if (obs2, info2["task"].id) != (obs, info["task"].id):
        problems.append("reset: the same seed gave a different task")
    if len({env.reset(seed=seed + s)[1]["task"].id for s in range(1, 6)}) < 2:
        problems.append("reset: different seeds gave the same task")
    env.reset(seed=seed)
    for bad in MALFORMED + [None, 7]:  # type: ignore[list-item]
        try:
            out = env.step(bad)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - the check is that nothing raises
            problems.append(f"step({str(bad)[:20]!r}) raised {type(e).__name__}: {e}")
            continue
        if len(out) != 5:
            problems.append("step: did not return (obs, reward, terminated, truncated, info)")
            break
        o, r, term, trunc, inf = out
        if not (isinstance(o, str) and o.startswith("error")) or term or r != 0.0:
            problems.append(f"step({str(bad)[:20]!r}): expected an error observation, got {o[:60]!r}")
        if not isinstance(r, float) or not isinstance(term, bool) or not isinstance(trunc, bool):
            problems.append("step: reward/terminated/truncated have wrong types")
        _check_info(inf, "step", problems)
        if trunc:
            if "verdict" not in inf:
                problems.append("step: truncated without a verdict")
            env.reset(seed=seed)
    env.reset(seed=seed)
    done, t = False, 0
    read = next(s for s in info["tools"] if not s["is_write"])
    while not done and t < env.max_steps + 1:
        _, _, term, trunc, inf = env.step(f'{read["name"]} {{"{next(iter(read["args"]))}":"Z-0"}}')
        done, t = term or trunc, t + 1
    if not (done and trunc and t == env.max_steps and "verdict" in inf and not inf["verdict"]["success"]):
        problems.append(f"truncation: expected truncated=True with a failed verdict after {env.max_steps} steps")
    try:
        env.step('reply {"text":"x"}')
    except Exception as e:  # noqa: BLE001
        problems.append(f"step after the end raised {type(e).__name__}")
    texts = {d.policy_text(v) for v in d.versions}
    if len(texts) != len(d.versions):
        problems.append("policy_text: two rule versions render the same text")
    for v in sorted(d.versions):
        for i, task in enumerate(generate_tasks(d, n_episodes, seed, rule_version=v)):
            res = run_episode(env, _JudgedOracle(env, problems, seed + i), task, seed=seed + i)
            if not res["success"]:
                problems.append(f"oracle failed version {v} task {task.id}: {res['actions']} -> {res['observations']}")
    if problems:
        raise EnvCheckError(f"{env.env_id}: " + "; ".join(problems))


class _JudgedOracle(OracleAgent):
    """The oracle, asking the env to judge each action before taking it."""

    def __init__(self, env: DriftEnv, problems: list[str], seed: int) -> None:
        super().__init__(seed=seed)
        self.env, self.problems = env, problems

    def act(self, obs: str, info: dict[str, Any]) -> str:
        a = super().act(obs, info)
        j = self.env.judge_action(a)
        if not j["correct"] or j["stale"] or j["violations"]:
            self.problems.append(f"judge_action: the oracle's {a!r} was judged {j}")
        return a
