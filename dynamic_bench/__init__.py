"""DriftBench: tool-using domains whose rules are code and change over an episode stream.

Public API (see TEAM.md's contract):
- `dynamic_bench.actions`: `parse_action(text, tools=None)`, `format_action(action)`,
  `ToolCall`, `Reply`, `ActionError`, `ToolSpec`.
- `make(env_id, **kw)`, `list_envs()`, `DriftEnv` (`reset(seed=, options=)`, `step(text)`,
  `judge_action(text)`), `BENCH_VERSION`.
- `generate_tasks(domain, n, seed, split, rule_version)`, `random_rule_tasks(...)`.
- `make_stream(preset, domain, n_episodes, seed)`, `PRESETS`, `rule_change_notes(domain, old_v, new_v)`.
- Agents: `OracleAgent(seed=)`, `StaleAgent`, `RandomAgent(seed=)`, `run_episode`, `run_stream`,
  `repeat_tasks` (input of pass^k), `evaluate_versions` (success per rule version, held-out).
- Metrics: `dynamic_bench.metrics`.

Actions (one per turn, one line): `NAME {json-args}`, e.g. `get_order {"order_id":"O-1042"}`;
a reply, which ends the episode, is `reply {"text":"Order O-1042: refunded."}`.
Observations are text: the first is the user's message (`user: I want a refund for order
O-1042, it is damaged. My id is U-17.`), then tool results (`order O-1042: user=U-17 item=lamp
amount=57 days=23 status=delivered`), errors (`error: unknown tool 'get_account'; tools: ...`)
or what the simulated user did with a write (`approved; ok: refunded O-1042`,
`user rejected it; nothing changed`, `user edited it to <action>; ok: ...`).
Envs: `driftbench/retail-v1`, `driftbench/telecom-v1` (telecom carries the tool drift).

Deviations from the contract: none in names. `parse_action` takes an optional second argument
(the tool specs in force) to also check tool names, arguments and types; without it only
the syntax is checked.
"""
from dynamic_bench.actions import ActionError, Reply, ToolCall, ToolSpec, format_action, parse_action
from dynamic_bench.domains import DOMAINS, get_domain
from dynamic_bench.env import BENCH_VERSION, DriftEnv, list_envs, make
from dynamic_bench.personas import PERSONAS, Persona, get_persona
from dynamic_bench.tasks import generate_tasks, random_rule_tasks
from dynamic_bench.streams import PRESETS, Episode, Stream, load_schedule, make_stream, rule_change_notes
from dynamic_bench.agents import (AGENTS, Agent, OracleAgent, RandomAgent, StaleAgent, evaluate_versions, repeat_tasks,
                                  run_episode, run_stream)

__all__ = ["AGENTS", "Agent", "Episode", "OracleAgent", "PRESETS", "RandomAgent", "StaleAgent", "Stream",
           "evaluate_versions", "load_schedule", "make_stream", "repeat_tasks", "rule_change_notes", "run_episode", "run_stream",
           "ActionError", "BENCH_VERSION", "DOMAINS", "DriftEnv", "PERSONAS", "Persona", "Reply", "ToolCall",
           "ToolSpec", "format_action", "generate_tasks", "get_domain", "get_persona", "list_envs", "make",
           "parse_action", "random_rule_tasks"]
