"""The agent as a LangGraph `StateGraph`.

    recall -> act -> (write) approval -> tool -> observe -> act -> ... -> reply -> remember -> END
                 \\-> (read) tool -> observe     \\-> (respond/ignore) act

* recall: starts the thread's DriftBench episode if needed; puts the constraints (the policy
  text, restated), short-term notes of this thread and long-term memory hits into working memory.
* act: the policy engine proposes one action through the assistant's scaffold; an unparsable
  action is fed back as an observation; turn and token budgets end the episode (aborted).
* approval: a write pauses with `interrupt()` carrying LangGraph's `HumanInterrupt` shape; the
  resume value is a `HumanResponse` (`accept`, `edit`, `response`, `ignore`) or `takeover`.
* tool: runs a DriftBench tool (a LangChain tool over the thread's env) or a user-supplied tool.
* reply / remember: the reply ends the episode; outcome, feedback and extracted facts go to
  memory and the whole trajectory (token ids, logprobs, policy version per step) to the ledger.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from dynamic_bench.actions import (ActionError, Reply, ToolCall, action_dict, format_action, parse_action,
                                   validate_call)
from dynamic_bench.schema import CORRECTION_KINDS, Feedback, Step, Trajectory, new_id
from memory.feedback_notes import applies_to, template
from runtime import agent_io
from runtime.world import World, WorldCache, WorldSpec, tool_spec_of

log = logging.getLogger("evolve.runtime")
RESPONSE_TYPES = ("accept", "edit", "response", "ignore", "takeover")


def needs_approval(kind: str, is_write: bool, mode: str) -> bool:
    """Does a proposal wait for the human? `writes`: writes only (the default); `all`: every
    proposal, even an unparsable one (supervised mode: the human's edits become corrections)."""
    if mode == "all":
        return True
    if mode == "writes":
        return kind == "tool" and is_write
    raise ValueError(f"approval mode must be 'writes' or 'all', got {mode!r}")


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]  # what clients see (LangChain messages)
    seen: int                      # messages already taken in as user turns
    trajectory_id: str
    episode: dict[str, Any]        # world spec, task id, rule version, done, outcome, verdict
    history: list[dict[str, str]]  # the episode transcript the scaffold renders
    working_memory: dict[str, Any]  # constraints, recalled items, short-term notes, plan
    short_term: list[str]          # this thread's recent outcomes (bounded)
    steps: list[dict[str, Any]]    # dynamic_bench.schema.Step dicts
    feedback: list[dict[str, Any]]  # dynamic_bench.schema.Feedback dicts
    pending: dict[str, Any] | None  # the proposed action awaiting approval / execution
    applied: list[str]             # actions applied to the world (replayed after a restart)
    turns: int
    tokens: int


@dataclass
class AgentConfig:
    """Budgets and sampling (flat, per service; `max_turns`, `seed`, `temperature` per run too)."""

    max_turns: int = 12
    max_episode_tokens: int = 4096
    max_new_tokens: int = 96
    max_context: int = 1024        # the model's context (prompt + completion)
    temperature: float = 1.0
    recall_k: int = 3
    # what the policy is shown: not user_preference items ("User U-855 usually approves ..."): they
    # describe users for people and the simulator, and their ids were copied into tool calls
    recall_kinds: tuple[str, ...] = ("task_experience", "tool_knowledge", "strategy")
    short_term_keep: int = 5
    default_scaffold: str = "direct"
    approval: str = "writes"       # writes | all (see needs_approval)


def recall_items(memory: Any, tenant: str, instruction: str, user_texts: list[str], cfg: AgentConfig) -> list:
    """What the agent recalls for a request (memory hits, best first): the items most similar to
    the instruction and the user's last two messages, keeping only those made for this kind of
    request (`applies_to`). One function, so what consolidation and memory distillation show
    the policy offline is what the served agent is shown."""
    return recall_candidates(memory, tenant, instruction, user_texts, cfg)[:cfg.recall_k]


def recall_candidates(memory: Any, tenant: str, instruction: str, user_texts: list[str], cfg: AgentConfig) -> list:
    """The hits `recall_items` takes its first `cfg.recall_k` from (up to three times as many, best
    first): what would be recalled instead once some of them are retired (evolve.consolidation)."""
    query = " ".join([instruction] + list(user_texts)[-2:])
    if not query.strip():
        return []
    hits = memory.search(tenant, query, k=3 * cfg.recall_k, kinds=list(cfg.recall_kinds))
    kind_of_request = template(instruction)
    return [h for h in hits if applies_to(h.item.payload, kind_of_request)]


def recalled_notes(memory: Any, requests: list[tuple[str, Any]], cfg: AgentConfig | None = None) -> list[list[str]]:
    """For each (tenant, task), the memory texts the served agent would be shown at the task's
    opening request (`recall_items`): what offline evaluation shows a policy as its memory."""
    cfg = cfg or AgentConfig()
    return [[h.item.text for h in recall_items(memory, tenant, t.instruction, [t.instruction], cfg)]
            for tenant, t in requests]


@dataclass
class AgentDeps:
    runner: Any                    # runtime.engine_runner.EngineRunner
    tokenizer: Any
    memory: Any = None             # memory.MemoryService (None: no long-term memory)
    worlds: WorldCache = field(default_factory=WorldCache)
    tools: list[BaseTool] = field(default_factory=list)  # user-supplied LangChain tools
    cfg: AgentConfig = field(default_factory=AgentConfig)
    on_turn: Callable[[float, int], None] | None = None  # metrics: (seconds, completion tokens)


def build_graph(deps: AgentDeps, checkpointer: Any = None, store: Any = None):
    """Compile the agent graph (checkpointer: thread memory; store: long-term memory)."""
    user_tools = {t.name: t for t in deps.tools}
    user_specs = {t.name: tool_spec_of(t) for t in deps.tools}

    def conf(config: RunnableConfig) -> dict[str, Any]:
        return config.get("configurable", {}) if config else {}

    def world_of(state: AgentState, config: RunnableConfig) -> World | None:
        spec = WorldSpec(**state["episode"]["world"]) if state.get("episode", {}).get("world") else None
        if spec is None:
            return None
        return deps.worlds.get(conf(config)["thread_id"], spec, list(state.get("applied", [])))

    # -- recall ---------------------------------------------------------------------------
    def recall(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        c = conf(config)
        upd: dict[str, Any] = {}
        ep = state.get("episode")
        msgs = state.get("messages", [])
        new_episode = not ep or ep.get("done")
        if new_episode:  # a new episode (first run, or after the last one ended)
            spec = WorldSpec.from_config(c)
            world = deps.worlds.get(c["thread_id"], spec, []) if spec else None
            ep = {"world": spec.__dict__ if spec else None, "done": False,
                  "task_id": world.task.id if world else f"chat-{c['thread_id']}",
                  "rule_version": world.task.rule_version if world else 0,
                  "instruction": world.task.instruction if world else "",
                  "scaffold": c.get("scaffold") or deps.cfg.default_scaffold,
                  "policy_version_at_start": deps.runner.policy_version}
            upd.update(episode=ep, trajectory_id=new_id("traj"), history=[], steps=[], feedback=[],
                       applied=[], turns=0, tokens=0, pending=None)
            new_user = [m for m in msgs[state.get("seen", 0):] if isinstance(m, HumanMessage)]
            if world and not new_user:  # no message given: the task's own user speaks
                text = world.first_observation.removeprefix("user: ")
                upd["messages"] = [HumanMessage(content=text)]
                new_user = upd["messages"]
            history: list[dict[str, str]] = []
        else:
            new_user = [m for m in msgs[state.get("seen", 0):] if isinstance(m, HumanMessage)]
            history = list(state.get("history", []))
        history += [{"role": "user", "text": str(m.content)} for m in new_user]
        upd["history"] = history
        upd["seen"] = len(msgs) + len(upd.get("messages", []))
        world = world_of({**state, **upd}, config)
        recalled = []
        if deps.memory is not None:
            try:
                hits = recall_items(deps.memory, c["tenant"], ep.get("instruction", ""),
                                    [h["text"] for h in history if h["role"] == "user"], deps.cfg)
                recalled = [{"id": h.item.id, "text": h.item.text, "kind": h.item.kind,
                             "score": round(float(h.score), 4)} for h in hits]
            except Exception as e:  # memory trouble degrades recall, it does not fail the turn
                log.warning("memory recall failed: %s", e)
        upd["working_memory"] = {
            "constraints": world.policy_text if world else "",
            "recalled": recalled,
            "short_term": list(state.get("short_term", []))[-deps.cfg.short_term_keep:],
            "plan": None if new_episode else (state.get("working_memory") or {}).get("plan"),
        }
        return upd

    # -- act ------------------------------------------------------------------------------
    def act(state: AgentState, config: RunnableConfig) -> Command[Literal["approval", "tool", "reply", "act"]]:
        c = conf(config)
        max_turns = int(c.get("max_turns") or deps.cfg.max_turns)
        turns, tokens = state.get("turns", 0), state.get("tokens", 0)
        if turns >= max_turns or tokens >= deps.cfg.max_episode_tokens:
            why = "turn" if turns >= max_turns else "token"
            return Command(goto="reply", update={"pending": {
                "kind": "reply", "text": f"I could not finish this request within my {why} budget.",
                "by": "budget", "step": None}})
        world = world_of(state, config)
        specs = {**(world.tool_specs() if world else {}), **user_specs}
        wm = state.get("working_memory", {})
        scaffold = state["episode"]["scaffold"]
        t0 = time.perf_counter()
        try:
            out = agent_io.propose(deps, scaffold, wm, specs, state.get("history", []), c, len(state.get("steps", [])))
        except agent_io.ContextFull as e:
            return Command(goto="reply", update={"pending": {
                "kind": "reply", "text": "I could not finish this request: the conversation is too long.",
                "by": "budget", "step": None, "error": str(e)}})
        latency = time.perf_counter() - t0
        if deps.on_turn:
            deps.on_turn(latency, len(out.completion_ids))
        steps = list(state.get("steps", []))
        idx = len(steps)
        parsed = parse_action(out.action_text)
        if isinstance(parsed, ToolCall) and parsed.name in user_specs:
            parsed = validate_call(parsed, user_specs, out.action_text)
        elif isinstance(parsed, ToolCall) and world is None:
            parsed = ActionError(f"error: unknown tool {parsed.name!r}; tools: "
                                 f"{', '.join(sorted(user_specs)) or 'none'}, reply", out.action_text)
        step = Step(index=idx, prompt_token_ids=out.prompt_ids, completion_token_ids=out.completion_ids,
                    behaviour_logprobs=out.logprobs, policy_version=out.policy_version,
                    action_text=out.action_text, action=action_dict(parsed), latency_s=latency)
        upd: dict[str, Any] = {"turns": turns + 1, "tokens": tokens + len(out.completion_ids),
                               "steps": steps + [step.model_dump()],
                               "history": list(state.get("history", [])) + [
                                   {"role": "assistant", "text": out.completion_text}]}
        if out.plan is not None:
            upd["working_memory"] = {**wm, "plan": out.plan}
        mode = c.get("approval") or deps.cfg.approval
        if isinstance(parsed, ActionError):
            pending = {"kind": "invalid", "text": out.action_text, "name": "invalid_action",
                       "args": {"text": out.action_text[:500]}, "error": parsed.message, "is_write": False}
            upd["messages"] = [AIMessage(content=out.action_text, additional_kwargs={"step": idx, "invalid": True})]
        elif isinstance(parsed, Reply):
            pending = {"kind": "reply", "text": format_action(parsed), "reply": parsed.text, "name": "reply",
                       "args": {"text": parsed.text}, "is_write": False}
        else:
            is_write = (user_specs[parsed.name].is_write if parsed.name in user_specs
                        else world.is_write(format_action(parsed)))
            pending = {"kind": "tool", "text": format_action(parsed), "name": parsed.name, "args": parsed.args,
                       "is_write": is_write, "call_id": f"call-{idx}"}
            upd["messages"] = [AIMessage(content="", additional_kwargs={"step": idx}, tool_calls=[
                {"name": parsed.name, "args": parsed.args, "id": f"call-{idx}"}])]
        upd["pending"] = {**pending, "by": "agent", "step": idx}
        if needs_approval(pending["kind"], pending["is_write"], mode):
            return Command(goto="approval", update=upd)
        if pending["kind"] == "invalid":  # malformed output is an observation, not a crash
            seen = _observed({**state, **upd}, pending["error"])
            return Command(goto="act", update={**upd, **seen, "messages": upd["messages"] + seen["messages"]})
        return Command(goto="reply" if pending["kind"] == "reply" else "tool", update=upd)

    def _observed(state: dict[str, Any], obs: str) -> dict[str, Any]:
        """Feed `obs` back to the agent for the pending step (the world is unchanged); clear pending."""
        p = state["pending"]
        msg = (ToolMessage(content=obs, tool_call_id=p["call_id"]) if p.get("call_id")
               else HumanMessage(content=obs, name="observation"))
        return {"pending": None, "steps": _set_obs(state, p["step"], obs), "messages": [msg],
                "history": list(state.get("history", [])) + [{"role": "obs", "text": obs}]}

    # -- approval -------------------------------------------------------------------------
    def approval(state: AgentState, config: RunnableConfig) -> Command[Literal["tool", "reply", "act", "approval"]]:
        p = dict(state["pending"])
        what = {"tool": "a write action" if p["is_write"] else "an action", "reply": "a reply",
                "invalid": "an unparsable action"}[p["kind"]]
        request = {"action_request": {"action": p["name"], "args": p["args"]},
                   "config": {"allow_accept": True, "allow_edit": True, "allow_respond": True,
                              "allow_ignore": True},
                   "description": f"The agent proposes {what}: {p['text']}",
                   "trajectory_id": state["trajectory_id"], "step": p["step"],
                   "error": p.pop("approval_error", None)}
        answer = interrupt(request)
        resp = answer[0] if isinstance(answer, list) and answer else answer
        kind = resp.get("type") if isinstance(resp, dict) else None
        args = resp.get("args") if isinstance(resp, dict) else None
        fb_kind = {"accept": "approve", "edit": "edit", "response": "respond", "ignore": "reject",
                   "takeover": "takeover"}.get(kind or "")
        if fb_kind is None:
            return _ask_again(p, f"unrecognised response {str(resp)[:200]!r}; expected "
                                 f"{{'type': one of {RESPONSE_TYPES}, 'args': ...}}")
        fb = Feedback(trajectory_id=state["trajectory_id"], step=p["step"], kind=fb_kind, source="user",
                      payload={"proposed": p["text"]})
        feedback = list(state.get("feedback", [])) + [fb.model_dump()]
        if kind in ("response", "ignore") or (kind == "accept" and p["kind"] == "invalid"):
            if kind == "response":
                fb.payload["text"] = "" if args is None else str(args)
                feedback[-1] = fb.model_dump()
                obs = f"user: {fb.payload['text']}"
            else:
                obs = p["error"] if kind == "accept" else "user rejected it; nothing changed"
            return Command(goto="act", update={**_observed(state, obs), "feedback": feedback})
        if kind in CORRECTION_KINDS:
            if not isinstance(args, dict) or not isinstance(args.get("action"), str) \
                    or not isinstance(args.get("args", {}), dict):
                return _ask_again(p, f"{kind} needs args {{'action': tool name or 'reply', 'args': {{...}}}}")
            act_ = parse_action(format_action(ToolCall(args["action"], dict(args.get("args") or {}))))
            if isinstance(act_, ActionError):
                return _ask_again(p, f"{kind}: {act_.message}")
            by = "user_edit" if kind == "edit" else "user_takeover"
            fb.payload["action"] = format_action(act_)
            feedback[-1] = fb.model_dump()
            if isinstance(act_, Reply):
                p.update(kind="reply", text=format_action(act_), reply=act_.text, by=by)
                return Command(goto="reply", update={"pending": p, "feedback": feedback})
            p.update(kind="tool", text=format_action(act_), name=act_.name, args=act_.args, by=by)
        else:
            p["by"] = "approved"
        return Command(goto="reply" if p["kind"] == "reply" else "tool",
                       update={"pending": p, "feedback": feedback})

    def _ask_again(p: dict, error: str) -> Command:
        return Command(goto="approval", update={"pending": {**p, "approval_error": error}})

    def _set_obs(state: AgentState, idx: int | None, obs: str) -> list[dict[str, Any]]:
        steps = list(state.get("steps", []))
        if idx is not None and idx < len(steps):
            steps[idx] = {**steps[idx], "observation": obs}
        return steps

    # -- tool / observe -------------------------------------------------------------------
    def tool(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        p = state["pending"]
        applied = list(state.get("applied", []))
        over = False
        if p["name"] in user_tools:
            try:
                obs = str(user_tools[p["name"]].invoke(p["args"]))
            except Exception as e:  # a failing user tool is an observation for the agent
                obs = f"error: {p['name']} failed: {type(e).__name__}: {e}"
        else:
            world = world_of(state, config)
            shown = world.tool_specs()
            call = ToolCall(p["name"], p["args"])
            if p["name"] in shown and isinstance(validate_call(call, shown), ToolCall):
                lc_tool = next(t for t in world.langchain_tools() if t.name == p["name"])
                obs = str(lc_tool.invoke(p["args"]))  # the DriftBench tool as a LangChain tool
            else:  # not a shown tool or bad arguments (drift, hidden tool): the env words the error
                obs = world.step(p["text"])[0]
            over = world.done
            applied.append(p["text"])
        return {"pending": {**p, "observation": obs, "world_over": over}, "applied": applied}

    def observe(state: AgentState) -> Command[Literal["act", "remember"]]:
        p = state["pending"]
        prefix = {"approved": "approved; ", "user_edit": f"user edited it to {p['text']}; ",
                  "user_takeover": f"user took over and did {p['text']}; "}.get(p["by"], "")
        upd: dict[str, Any] = _observed(state, prefix + p["observation"])
        if p.get("world_over"):  # the world ended the episode (its step limit)
            upd["episode"] = {**state["episode"], "ended_by": "world"}
            return Command(goto="remember", update=upd)
        return Command(goto="act", update=upd)

    # -- reply ----------------------------------------------------------------------------
    def reply(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        p = state["pending"]
        text = p.get("reply") or p["text"]
        ep = dict(state["episode"])
        world = world_of(state, config)
        applied = list(state.get("applied", []))
        action = p["text"] if p["by"] != "budget" else format_action(Reply(text))
        if world is not None and not world.done:
            _, _, _, _ = world.step(action)
            applied.append(action)
        if p["by"] == "budget":
            ep["aborted"] = True
        history = list(state.get("history", []))
        if p["by"] != "agent" and p["by"] != "approved":  # not the agent's own words: note what was sent
            history.append({"role": "obs", "text": f"user sent the reply instead: {text}"})
        obs = "reply sent" if p["by"] in ("agent", "approved", "budget") else f"user sent the reply instead: {text}"
        return {"pending": None, "episode": ep, "applied": applied, "steps": _set_obs(state, p.get("step"), obs),
                "history": history, "messages": [AIMessage(content=text, additional_kwargs={"step": p.get("step")})]}

    # -- remember -------------------------------------------------------------------------
    def remember(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        c = conf(config)
        ep = dict(state["episode"])
        world = world_of(state, config)
        verdict = world.verdict if world is not None else None
        steps = [Step.model_validate(s) for s in state.get("steps", [])]
        if ep.get("aborted"):
            outcome = "aborted"
        elif verdict is not None:
            outcome = "success" if verdict.get("success") else "failure"
        else:
            outcome = "success"
        traj = Trajectory(
            id=state["trajectory_id"], task_id=ep["task_id"], tenant=c["tenant"], scaffold=ep["scaffold"],
            policy_version=steps[-1].policy_version if steps else deps.runner.policy_version,
            rule_version=ep["rule_version"], steps=steps,
            reward=float(verdict.get("reward", 0.0)) if verdict else 0.0,
            reward_breakdown={k: float(v) for k, v in (verdict or {}).get("breakdown", {}).items()
                              if isinstance(v, (int, float))},
            outcome=outcome, feedback=[Feedback.model_validate(f) for f in state.get("feedback", [])],
            ended_at=time.time(),
            metadata={"thread_id": c["thread_id"], "run_id": c.get("run_id"), "assistant_id": c.get("assistant_id"),
                      "world": ep["world"], "verdict": verdict, "judged": verdict is not None,
                      "policy_versions": sorted({s.policy_version for s in steps}),
                      "recalled": [r["id"] for r in state.get("working_memory", {}).get("recalled", [])]})
        if deps.memory is not None:
            agent_io.remember(deps.memory, traj, state.get("working_memory", {}), ep)
        ep.update(done=True, outcome=outcome, verdict=verdict)
        note = f"{ep.get('instruction') or ep['task_id']} -> {outcome}"
        return {"episode": ep, "short_term": (list(state.get("short_term", [])) + [note])[-deps.cfg.short_term_keep:]}

    g = StateGraph(AgentState)
    g.add_node("recall", recall)
    g.add_node("act", act)
    g.add_node("approval", approval)
    g.add_node("tool", tool)
    g.add_node("observe", observe)
    g.add_node("reply", reply)
    g.add_node("remember", remember)
    g.add_edge(START, "recall")
    g.add_edge("recall", "act")
    g.add_edge("tool", "observe")
    g.add_edge("reply", "remember")
    g.add_edge("remember", END)
    return g.compile(checkpointer=checkpointer, store=store, name="agent")
