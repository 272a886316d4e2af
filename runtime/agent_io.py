"""The graph's two side doors: the policy (scaffold -> token ids -> engine -> action text) and
memory (trajectory, outcomes of recalled items, notes of what the human's answers said).

Token in, token out: the prompt ids rendered here are the ids sampled from and recorded in the
Step, and the completion ids are the engine's own; text is decoded only to parse the action.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dynamic_bench.actions import ToolSpec
from dynamic_bench.schema import Trajectory
from memory.feedback_notes import feedback_notes
from runtime import scaffolds
from training.engines.base import SamplingParams
from training.policy import stop_token_ids

log = logging.getLogger("evolve.runtime")


class ContextFull(Exception):
    """The episode no longer fits the model's context: the episode ends (aborted)."""


@dataclass
class Proposal:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_version: str
    action_text: str
    plan: str | None = None
    completion_text: str = ""  # the whole completion as sampled (plan line included), for the transcript


def _sampling(deps: Any, c: dict[str, Any], step_index: int) -> SamplingParams:
    seed = c.get("seed")
    temp = c.get("temperature")
    return SamplingParams(max_new_tokens=deps.cfg.max_new_tokens,
                          temperature=float(deps.cfg.temperature if temp is None else temp),
                          stop_token_ids=stop_token_ids(deps.tokenizer),
                          seed=None if seed is None else int(seed) * 1000 + step_index)


def propose(deps: Any, scaffold: str, wm: dict[str, Any], specs: dict[str, ToolSpec],
            history: list[dict[str, str]], c: dict[str, Any], step_index: int) -> Proposal:
    """Render the scaffold's prompt, sample one completion, decode the action text."""
    ctx = scaffolds.Context(policy_text=wm.get("constraints", ""), tools=list(specs.values()),
                            memory=[r["text"] for r in wm.get("recalled", [])] + list(wm.get("short_term", [])),
                            history=[(h["role"], h["text"]) for h in history], plan=wm.get("plan"))
    sc = scaffolds.get(scaffold)
    budget = deps.cfg.max_context - deps.cfg.max_new_tokens
    prompt_ids = sc.encode_prompt(deps.tokenizer, ctx, max_tokens=budget)  # oldest turns dropped to fit
    if len(prompt_ids) > budget:
        raise ContextFull(f"prompt of {len(prompt_ids)} tokens does not fit {budget}")
    try:
        gen = deps.runner.generate(prompt_ids, _sampling(deps, c, step_index))
    except ValueError as e:  # the engine refuses a prompt that does not fit its context
        raise ContextFull(str(e)) from e
    text = deps.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    action_text, plan = sc.parse_completion(text)
    return Proposal(prompt_ids=list(prompt_ids), completion_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                    policy_version=gen.policy_version, action_text=action_text, plan=plan,
                    completion_text=text.rstrip() + scaffolds.END)


def remember(memory: Any, traj: Trajectory, wm: dict[str, Any], ep: dict[str, Any]) -> None:
    """Write the episode to memory: the trajectory (with its feedback), outcomes, extracted facts."""
    memory.record_trajectory(traj)
    judged = traj.metadata.get("judged", False)
    if judged:  # credit or blame the long-term items that were in working memory
        for r in wm.get("recalled", []):
            try:
                memory.record_outcome(r["id"], traj.outcome == "success", traj.id, tenant=traj.tenant,
                                      evidence=f"{traj.task_id}: {traj.outcome}")
            except Exception as e:  # an item retracted meanwhile: nothing to credit
                log.info("outcome for %s not recorded: %s", r["id"], e)
    notes = feedback_notes(traj.feedback, ep.get("instruction", ""))  # the cycle's mining writes the same text
    if notes:
        memory.add_many([dict(tenant=traj.tenant, trajectory_id=traj.id, **n) for n in notes])
