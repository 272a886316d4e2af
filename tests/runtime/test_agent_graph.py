"""The agent graph in process (real LangGraph, SQLite/Postgres checkpointers, torch engine, memory).

Unparsable output is an observation; budgets end the episode; a world is rebuilt by replay when
a thread moves to a fresh process; a user-supplied LangChain tool runs like a DriftBench tool;
the Postgres checkpointer keeps a paused thread across connections.
"""
from __future__ import annotations

import sqlite3

import pytest
from langchain_core.tools import tool
from langgraph.types import Command

from runtime.world import WorldCache, WorldConfigError, WorldSpec

pytestmark = pytest.mark.slow


@tool
def lookup_policy(topic: str) -> str:
    """Look up the written policy on a topic."""
    return f"policy on {topic}: refunds within 30 days"


lookup_policy.metadata = {"is_write": False}


@pytest.fixture(scope="module")
def engine_runner(tiny_policy):
    from runtime.engine_runner import EngineRunner
    from training.engines import make_engine

    runner = EngineRunner(make_engine(f"torch:{tiny_policy}"))
    yield runner
    runner.close()


def _graph(runner, checkpointer, memory=None, worlds=None, **cfg):
    from runtime.graph import AgentConfig, AgentDeps, build_graph

    deps = AgentDeps(runner=runner, tokenizer=runner.engine.tokenizer, memory=memory, worlds=worlds or WorldCache(),
                     tools=[lookup_policy], cfg=AgentConfig(**{"max_new_tokens": 24, "max_turns": 6, **cfg}))
    return deps, build_graph(deps, checkpointer=checkpointer)


def _config(tid, **c):
    return {"configurable": {"thread_id": tid, "tenant": "t1", "world": "driftbench/retail-v1", **c}}


def _paused(graph, name, seed=0):
    """A thread waiting for approval (supervised mode: every proposal waits for the human)."""
    cfg = _config(name, task_seed=seed, approval="all")
    graph.invoke({"messages": []}, cfg)
    assert graph.get_state(cfg).interrupts
    return cfg


def test_approval_modes():
    from runtime.graph import needs_approval

    assert needs_approval("tool", True, "writes") and not needs_approval("tool", False, "writes")
    assert not needs_approval("reply", False, "writes") and not needs_approval("invalid", False, "writes")
    assert all(needs_approval(k, w, "all") for k in ("tool", "reply", "invalid") for w in (True, False))
    with pytest.raises(ValueError):
        needs_approval("tool", True, "sometimes")


def test_world_spec_validation():
    assert WorldSpec.from_config({}) is None
    assert WorldSpec.from_config({"world": "driftbench/retail-v1", "task_seed": 3}).task_seed == 3
    for bad in ({"world": "driftbench/none-v1"}, {"world": "driftbench/retail-v1", "task_seed": "3"},
                {"world": "driftbench/retail-v1", "task": {"id": 1}}, {"world": "driftbench/retail-v1", "split": "x"}):
        with pytest.raises(WorldConfigError):
            WorldSpec.from_config(bad)


def test_unparsable_output_is_an_observation_and_budget_aborts(engine_runner, tmp_path):
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = SqliteSaver(sqlite3.connect(tmp_path / "cp.sqlite", check_same_thread=False))
    _, graph = _graph(engine_runner, saver, max_turns=3)
    cfg = _config("garbled", task_seed=1, temperature=5.0, seed=3)  # near-uniform sampling: not an action
    graph.invoke({"messages": [{"role": "user", "content": "refund my order please"}]}, cfg)
    values = graph.get_state(cfg).values
    steps = values["steps"]
    assert 1 <= len(steps) <= 3
    bad = [s for s in steps if s["action"] is None]
    assert bad, "temperature 5 should give at least one unparsable action"
    for s in bad:
        assert s["observation"].startswith("error"), s
    assert any(m.name == "observation" and m.content.startswith("error") for m in values["messages"])
    ep = values["episode"]
    if not any(s["action"] and s["action"]["name"] == "reply" for s in steps):
        assert ep["outcome"] == "aborted"  # the turn budget ended it
    assert ep["done"] and ep["verdict"] is not None and ep["verdict"]["success"] is False


def test_fresh_process_rebuilds_world_by_replay_and_user_tool_runs(engine_runner, tmp_path):
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(tmp_path / "cp.sqlite", check_same_thread=False)
    _, graph = _graph(engine_runner, SqliteSaver(conn))
    cfg = _paused(graph, "replay")
    order = graph.get_state(cfg).values["episode"]["instruction"].split("order ")[1].split(",")[0].split(" ")[0]
    graph.invoke(Command(resume={"type": "edit", "args": {"action": "get_order", "args": {"order_id": order}}}), cfg)
    graph.invoke(Command(resume={"type": "takeover", "args": {"action": "refund", "args": {"order_id": order}}}), cfg)
    before = graph.get_state(cfg).values
    assert len(before["applied"]) == 2, "the edited read and the taken-over write are applied to the world"

    worlds = WorldCache()  # as if the server had restarted: no live env for this thread
    deps2, graph2 = _graph(engine_runner, SqliteSaver(conn), worlds=worlds)
    assert graph2.get_state(cfg).interrupts
    # take the next step over with the user's own LangChain tool (the world is rebuilt by replay)
    graph2.invoke(Command(resume={"type": "takeover", "args": {"action": "lookup_policy",
                                                               "args": {"topic": "refunds"}}}), cfg)
    values = graph2.get_state(cfg).values
    assert values["history"][-2]["text"].startswith(
        'user took over and did lookup_policy {"topic":"refunds"}; policy on refunds')
    assert values["feedback"][-1]["kind"] == "takeover"
    assert worlds.rebuilds == 1
    world = worlds.get(cfg["configurable"]["thread_id"], WorldSpec(**values["episode"]["world"]),
                       list(values["applied"]))
    assert world.applied == values["applied"] == before["applied"] and not world.done


@pytest.mark.postgres
def test_postgres_checkpointer_keeps_a_paused_thread(engine_runner, pg_url):
    from runtime.service import _make_checkpointer

    saver, close = _make_checkpointer(pg_url, None)
    _, graph = _graph(engine_runner, saver)
    cfg = _paused(graph, "pg")
    paused = graph.get_state(cfg)
    close()

    saver2, close2 = _make_checkpointer(pg_url, None)  # a new connection, a new graph
    try:
        _, graph2 = _graph(engine_runner, saver2)
        again = graph2.get_state(cfg)
        assert again.values["steps"] == paused.values["steps"] and again.next == ("approval",)
        graph2.invoke(Command(resume={"type": "ignore", "args": None}), cfg)
        after = graph2.get_state(cfg).values
        assert after["feedback"][0]["kind"] == "reject"
        assert after["history"][-2]["text"] == "user rejected it; nothing changed" and after["applied"] == []
    finally:
        close2()


def test_recall_shows_the_policy_rules_not_descriptions_of_users(engine_runner, tmp_path):
    """Working memory holds task experience; a user_preference item, however similar to the
    request, stays out of the prompt (its user ids were copied into tool calls)."""
    from langgraph.checkpoint.memory import InMemorySaver

    from memory import KINDS, MemoryService

    mem = MemoryService(tmp_path / "mem")
    try:
        _, graph = _graph(engine_runner, InMemorySaver(), memory=mem)
        cfg = _paused(graph, "recall")
        request = graph.get_state(cfg).values["episode"]["instruction"]
        mem.add("t1", f"Rule: for '{request}' deny it.", kind="task_experience")
        mem.add("t1", f"User U-999 usually approves '{request}'.", kind="user_preference")
        cfg2 = _paused(graph, "recall-2")  # the same task: the same request
        recalled = graph.get_state(cfg2).values["working_memory"]["recalled"]
        assert [r["kind"] for r in recalled] == ["task_experience"]
        _, every_kind = _graph(engine_runner, InMemorySaver(), memory=mem, recall_kinds=KINDS)
        shown = every_kind.get_state(_paused(every_kind, "recall-3"))
        assert {r["kind"] for r in shown.values["working_memory"]["recalled"]} == {"task_experience", "user_preference"}
    finally:
        mem.close()


def test_recall_skips_items_made_for_another_kind_of_request(engine_runner, tmp_path):
    """A strategy or correction note mined from one request template is not shown for another,
    however similar: a refund request once recalled an exchange strategy and followed it."""
    from langgraph.checkpoint.memory import InMemorySaver

    from memory import MemoryService
    from memory.feedback_notes import template

    mem = MemoryService(tmp_path / "mem")
    try:
        _, graph = _graph(engine_runner, InMemorySaver(), memory=mem)
        cfg = _paused(graph, "recall")
        request = graph.get_state(cfg).values["episode"]["instruction"]
        other = request.replace("exchange", "refund") if "exchange" in request else request + " Refund it."
        assert template(other) != template(request)
        mine = mem.add("t1", f"Strategy: for a request like '{template(request)}', get_order then reply succeeded.",
                       kind="strategy", payload={"template": template(request)})
        theirs = mem.add("t1", f"Strategy: for a request like '{template(other)}', get_customer then get_order "
                               "then refund then escalate then reply succeeded.",
                         kind="strategy", payload={"template": template(other)})
        rule = mem.add("t1", f"Rule: for '{request}' deny it.", kind="task_experience")
        assert len({mine.id, theirs.id, rule.id}) == 3
        assert theirs.id in {h.item.id for h in mem.search("t1", request, k=3)}  # similar enough to be recalled
        recalled = {r["id"] for r in graph.get_state(_paused(graph, "recall-2")).values["working_memory"]["recalled"]}
        assert mine.id in recalled and rule.id in recalled and theirs.id not in recalled
    finally:
        mem.close()
