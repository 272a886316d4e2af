"""The agent's world: a DriftBench episode whose tools are LangChain tools, plus user tools.

Which world and task a thread plays comes from its metadata or the run's config (configurable):

    {"world": "driftbench/retail-v1", "task_seed": 3}                 # a task drawn by seed
    {"world": "driftbench/retail-v1", "task_seed": 3, "rule_version": 2}
    {"world": "driftbench/retail-v1", "task": {...a dynamic_bench Task as JSON...}}

An env object cannot live in a checkpoint, so the graph state keeps the list of actions applied
to the world and `WorldCache` rebuilds the env by reset + replay when a thread moves to another
process (a restart) or its cached copy is stale: DriftBench envs are deterministic given a seed.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import Field, create_model

import dynamic_bench
from dynamic_bench.actions import ToolCall, ToolSpec, format_action
from dynamic_bench.schema import Task

WORLD_KEYS = ("world", "task", "task_seed", "rule_version", "split", "persona", "max_steps")


class WorldConfigError(ValueError):
    """The thread's or run's world settings are unusable (reported to the client as 4xx/an error)."""


@dataclass(frozen=True)
class WorldSpec:
    world: str
    task_json: str | None = None
    task_seed: int | None = None
    rule_version: int = 1
    split: str = "train"
    persona: str | None = None
    max_steps: int = 10

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "WorldSpec | None":
        """Read and validate world settings; None when no world is configured."""
        world = cfg.get("world")
        if world in (None, ""):
            return None
        if not isinstance(world, str) or world not in dynamic_bench.list_envs():
            raise WorldConfigError(f"unknown world {world!r}; worlds: {dynamic_bench.list_envs()}")
        task = cfg.get("task")
        task_json = None
        if task is not None:
            try:
                task_json = Task.model_validate(task).model_dump_json()
            except Exception as e:
                raise WorldConfigError(f"'task' is not a valid DriftBench Task: {e}") from e
        ints = {k: cfg.get(k) for k in ("task_seed", "rule_version", "max_steps") if cfg.get(k) is not None}
        for k, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise WorldConfigError(f"{k!r} must be a non-negative integer, got {v!r}")
        split = cfg.get("split", "train")
        if split not in ("train", "test"):
            raise WorldConfigError(f"'split' must be train or test, got {split!r}")
        persona = cfg.get("persona")
        if persona is not None and not isinstance(persona, str):
            raise WorldConfigError("'persona' must be a string")
        return cls(world=world, task_json=task_json, task_seed=ints.get("task_seed"),
                   rule_version=ints.get("rule_version", 1), split=split, persona=persona,
                   max_steps=ints.get("max_steps", 10))


class World:
    """One DriftBench episode (user_simulation off: the runtime's human approves writes)."""

    def __init__(self, spec: WorldSpec):
        self.spec = spec
        self.env = dynamic_bench.make(spec.world, user_simulation=False, max_steps=spec.max_steps)
        options: dict[str, Any] = {"user_simulation": False}
        if spec.task_json is not None:
            options["task"] = Task.model_validate_json(spec.task_json)
        else:
            options.update(rule_version=spec.rule_version, split=spec.split, persona=spec.persona)
        try:
            self.first_observation, self.info = self.env.reset(seed=spec.task_seed, options=options)
        except (KeyError, ValueError, TypeError) as e:
            raise WorldConfigError(f"cannot start {spec.world}: {e}") from e
        self.task: Task = self.info["task"]
        self.applied: list[str] = []
        self.done = False
        self.verdict: dict[str, Any] | None = None

    @property
    def policy_text(self) -> str:
        return self.info["policy_text"]

    def tool_specs(self) -> dict[str, ToolSpec]:
        """The tools as shown to the agent (after a silent drift they lag the tools in force)."""
        out = {}
        for t in self.info["tools"]:
            out[t["name"]] = ToolSpec(name=t["name"], op=t["name"], args=tuple(t["args"].items()),
                                      is_write=t["is_write"], description=t.get("description", ""),
                                      enums=tuple((k, tuple(v)) for k, v in t.get("enums", {}).items()))
        return out

    def is_write(self, action_text: str) -> bool:
        return bool(self.env.judge_action(action_text)["is_write"])

    def judge(self, action_text: str) -> dict[str, Any]:
        return self.env.judge_action(action_text)

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one action; returns (observation, reward, episode over, info)."""
        obs, reward, terminated, truncated, info = self.env.step(action_text)
        self.applied.append(action_text)
        if terminated or truncated:
            self.done, self.verdict = True, info.get("verdict")
        return obs, reward, terminated or truncated, info

    def langchain_tools(self) -> list[BaseTool]:
        """The domain's tools as LangChain tools; each call steps this episode's env."""
        return [_as_langchain_tool(spec, self) for spec in self.tool_specs().values()]


def _as_langchain_tool(spec: ToolSpec, world: World) -> BaseTool:
    types = {"str": str, "int": int}
    fields = {a: (types[t], Field(...)) for a, t in spec.args}
    schema = create_model(f"{spec.name}_args", **fields)

    def call(**kwargs: Any) -> str:
        return world.step(format_action(ToolCall(spec.name, kwargs)))[0]

    return StructuredTool.from_function(call, name=spec.name, description=spec.description or spec.name,
                                        args_schema=schema, metadata={"is_write": spec.is_write})


def tool_spec_of(tool: BaseTool) -> ToolSpec:
    """A user-supplied LangChain tool as a ToolSpec (for prompts and argument checks)."""
    props = (tool.args or {})
    args = tuple((k, "int" if v.get("type") == "integer" else "str") for k, v in props.items())
    return ToolSpec(name=tool.name, op=tool.name, args=args,
                    is_write=bool((tool.metadata or {}).get("is_write", False)),
                    description=(tool.description or "")[:200])


class WorldCache:
    """Live worlds by thread id; a miss or a stale copy is rebuilt by reset + replay."""

    def __init__(self, capacity: int = 1024, factory: Callable[[WorldSpec], World] = World):
        self.capacity = capacity
        self.factory = factory
        self._worlds: OrderedDict[str, World] = OrderedDict()
        self._lock = threading.Lock()
        self.rebuilds = 0

    def get(self, key: str, spec: WorldSpec, applied: list[str]) -> World:
        with self._lock:
            w = self._worlds.get(key)
            if w is not None and w.spec == spec and w.applied == applied:
                self._worlds.move_to_end(key)
                return w
        w = self.factory(spec)
        for a in applied:
            w.step(a)
        self.rebuilds += 1
        with self._lock:
            self._worlds[key] = w
            self._worlds.move_to_end(key)
            while len(self._worlds) > self.capacity:
                self._worlds.popitem(last=False)
        return w

    def drop(self, key: str) -> None:
        with self._lock:
            self._worlds.pop(key, None)
