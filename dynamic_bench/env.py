"""The DriftBench environment: Gymnasium-style `reset(seed=, options=)` / `step(action_text)`.

Observations are text. The first observation is the user's message; each step's observation
is a tool result, an error (an unparsable or invalid action never raises), or what the
simulated user did with a proposed write. A `reply` ends the episode; `max_steps` truncates
it. `info` always carries `policy_text` and `tools` (the policy and tool specs *shown*, which
lag the rules in force after a silent shift), `task` (hidden facts inside: do not render
`task.params` to an agent), `step`, `is_write`; and at the end `verdict`.

The hot path is plain dicts: no deep copies, no pydantic validation per step.
"""
from __future__ import annotations

import random
from typing import Any

from dynamic_bench.actions import ActionError, Reply, ToolCall, action_dict, format_action, parse_action
from dynamic_bench.domains import DOMAINS, Domain, get_domain
from dynamic_bench.personas import get_persona
from dynamic_bench.schema import Task
from dynamic_bench.tasks import complete_task, make_task
from dynamic_bench.verifier import gold_replay, reply_states, verdict

BENCH_VERSION = "driftbench-1.0.0"
ENV_IDS = {f"driftbench/{name}-v1": name for name in DOMAINS}
INFO_KEYS = ("policy_text", "tools", "task", "step", "is_write")


def list_envs() -> list[str]:
    return sorted(ENV_IDS)


def make(env_id: str, **kwargs: Any) -> "DriftEnv":
    """`make("driftbench/retail-v1", max_steps=10, user_simulation=True)`."""
    if env_id not in ENV_IDS:
        raise KeyError(f"unknown env {env_id!r}; envs: {list_envs()}")
    return DriftEnv(ENV_IDS[env_id], env_id=env_id, **kwargs)


class DriftEnv:
    """One domain's episodes. Options of `reset`: `task` (a Task), or `rule_version`, `split`,
    `persona`, `shown_version` (the policy shown; default: the one in force) to draw one; `user_simulation` (default: the constructor's) decides whether a
    persona answers proposed writes (True) or every stepped write is executed as is (False,
    the runtime's mode: it asks its human first and steps only approved or edited actions)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, domain: str | Domain, *, env_id: str | None = None, max_steps: int = 10,
                 user_simulation: bool = True) -> None:
        self.domain = get_domain(domain)
        self.env_id = env_id or f"driftbench/{self.domain.name}-v1"
        self.max_steps = max_steps
        self.user_simulation = user_simulation
        self._rng = random.Random()
        self._done = True
        self._writes = self.domain.all_write_names()

    # --- episode start ---------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        options = options or {}
        if seed is not None:
            self._rng = random.Random(seed)
        task = options.get("task")
        if task is None:
            sv = options.get("shown_version")
            task = make_task(self.domain, self._rng, rule_version=options.get("rule_version", 1),
                             split=options.get("split", "train"), persona=options.get("persona"),
                             shown=None if sv is None else (sv, self.domain.rules_for(sv)))
        elif not isinstance(task, Task):
            raise TypeError(f"options['task'] must be a dynamic_bench.schema.Task, got {type(task).__name__}")
        task = complete_task(task)
        d, p = self.domain, task.params
        if task.domain != d.name:
            raise ValueError(f"task of domain {task.domain!r} given to a {d.name!r} env")
        self.task, self._p, self._rules = task, p, p["rules"]
        self._sim = bool(options.get("user_simulation", self.user_simulation))
        self._persona = get_persona(task.persona)
        self._tools = d.tools(self._rules)
        self._deprecated = d.tool_sets[self._rules["tools"]].deprecated
        self._state = d.initial_state(p)
        self._remaining, self._outcome, self._gold_key = gold_replay(d, p, self._rules)
        self._gold_reply = format_action(Reply(d.reply_text(p, self._outcome)))
        self._prior = set()
        for _, rules in p["prior_rules"]:
            calls, _ = d.solve(p, rules)
            self._prior.update(format_action(c) for c in calls)
        shown = p["shown_rules"]
        self._info = {"policy_text": d.policy_text(shown, p["shown_version"] or None),
                      "tools": d.tool_dicts(shown),
                      "task": task, "env_id": self.env_id, "bench_version": BENCH_VERSION}
        self._proposals: list[dict[str, Any]] = []
        self._t = self._invalid = 0
        self._done = False
        obs = f"user: {task.instruction}"
        return obs, {**self._info, "step": 0, "is_write": False}

    @property
    def policy_text(self) -> str:
        return self._info["policy_text"]

    # --- judging ---------------------------------------------------------------------
    def judge_action(self, action_text: str) -> dict[str, Any]:
        """Is this action a write, right under the rules in force, stale? And what is right."""
        if not hasattr(self, "task"):
            raise RuntimeError("judge_action before reset: there is no episode to judge against")
        act = parse_action(action_text, self._tools)
        return self._judge(act, action_text)

    def _judge(self, act: ToolCall | Reply | ActionError, text: str) -> dict[str, Any]:
        correct_write = self._remaining[0] if self._remaining else None
        j: dict[str, Any] = {"action_text": text, "valid": not isinstance(act, ActionError), "tool": None,
                             "is_write": False, "correct": False, "stale": False, "violations": [],
                             "correct_write": correct_write, "correct_action": correct_write or self._gold_reply}
        if isinstance(act, Reply):
            j["tool"] = "reply"
            j["correct"] = not self._remaining and reply_states(self.domain, act.text, self._outcome)
            return j
        if isinstance(act, ActionError):
            call = parse_action(text)  # a write under an earlier version's tools (renamed, deprecated, new arg)?
            if isinstance(call, ToolCall) and call.name in self._writes and format_action(call) in self._prior:
                j.update(tool=call.name, is_write=True, stale=True, violations=["tool_drift"])
            return j  # otherwise just malformed: an error observation, not a rule violation
        canon = format_action(act)
        j["tool"] = act.name
        if not self._tools[act.name].is_write:
            j["correct"] = True
            return j
        violations = self.domain.violations(self._state, self._p, act, self._rules)
        correct = canon in self._remaining and not violations
        if not correct and not violations:
            violations = ["not_prescribed"]
        j.update(is_write=True, correct=correct, violations=violations,
                 stale=not correct and canon in self._prior)
        return j

    # --- a step ----------------------------------------------------------------------
    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            return "error: the episode is over; call reset", 0.0, True, False, {**self._info, "step": self._t,
                                                                                 "is_write": False}
        self._t += 1
        act = parse_action(action_text, self._tools)
        info: dict[str, Any] = {**self._info, "step": self._t, "is_write": False, "action": action_dict(act)}
        if isinstance(act, Reply):
            return self._finish(f"reply sent: {act.text}", act.text, info, truncated=False)
        if isinstance(act, ActionError):
            self._invalid += 1
            obs = act.message
            call = parse_action(action_text)
            if isinstance(call, ToolCall) and call.name in self._deprecated:
                obs = f"error: {call.name} is deprecated; use {self._deprecated[call.name]}"
            info["error"] = obs
            j = self._judge(act, action_text)
            if j["is_write"]:
                info.update(is_write=True, judgement=j)
                self._proposals.append(j)
            return self._after(obs, info)
        spec = self._tools[act.name]
        if not spec.is_write:
            return self._after(self.domain.execute(self._state, self._p, spec, act, self._rules), info)
        j = self._judge(act, action_text)
        self._proposals.append(j)
        info.update(is_write=True, judgement=j)
        if not self._sim:
            return self._after(self._execute(act), info)
        decision = self._persona.decide(j, self._rng)
        info["feedback"] = {"kind": decision.kind, "action": decision.action_text}
        if decision.kind == "approve":
            obs = "approved; " + self._execute(act)
        elif decision.kind == "reject":
            obs = "user rejected it; nothing changed"
        else:
            done = parse_action(decision.action_text, self._tools)
            verb = "edited it to" if decision.kind == "edit" else "took over and did"
            obs = f"user {verb} {decision.action_text}; " + self._execute(done)
        return self._after(obs, info)

    def _execute(self, call: ToolCall) -> str:
        canon = format_action(call)
        if canon in self._remaining:
            self._remaining.remove(canon)
        return self.domain.execute(self._state, self._p, self._tools[call.name], call, self._rules)

    def _after(self, obs: str, info: dict) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._t >= self.max_steps:
            return self._finish(obs, None, info, truncated=True)
        return obs, 0.0, False, False, info

    def _finish(self, obs: str, reply: str | None, info: dict, truncated: bool):
        self._done = True
        v = verdict(self.domain, self._state, self._gold_key, self._outcome, reply, self._proposals,
                    self._t, self._invalid)
        info["verdict"] = v
        return obs, v["reward"], not truncated, truncated, info

    def close(self) -> None:
        self._done = True
