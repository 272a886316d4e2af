"""The environment: checker on every domain, observations/info, malformed actions, judging, modes."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamic_bench import (BENCH_VERSION, OracleAgent, generate_tasks, get_domain, list_envs, make, make_stream,
                           run_episode)
from dynamic_bench.env_checker import EnvCheckError, check_env


@pytest.mark.parametrize("env_id", list_envs())
def test_env_checker_passes_every_domain(env_id):
    check_env(make(env_id), n_episodes=4)


def test_env_ids_cover_both_domains_and_unknown_id_is_refused():
    assert list_envs() == ["driftbench/retail-v1", "driftbench/telecom-v1"]
    with pytest.raises(KeyError, match="unknown env"):
        make("driftbench/nope-v1")


def test_checker_catches_a_broken_env():
    class Broken(type(make("driftbench/retail-v1"))):
        def step(self, action_text):
            if not isinstance(action_text, str):
                raise TypeError("boom")
            return super().step(action_text)

    with pytest.raises(EnvCheckError, match="raised TypeError"):
        check_env(Broken("retail"))


@pytest.mark.parametrize("env_id", list_envs())
def test_malformed_actions_are_error_observations(env_id):
    env = make(env_id)
    env.reset(seed=1)
    for bad in ['{"a":', 'teleport {"x":1}', "issue_credit {}", 'get_outages {"account_id": 7}', "z" * 10_000]:
        obs, reward, term, trunc, info = env.step(bad)
        assert obs.startswith("error") and reward == 0.0 and not term and info["error"] == obs
    assert "unknown tool 'teleport'" in env.step('teleport {"x":1}')[0]


def test_observations_and_info_carry_the_contract():
    env = make("driftbench/retail-v1")
    obs, info = env.reset(seed=0, options={"rule_version": 2})
    assert obs.startswith("user: ") and info["task"].instruction in obs
    assert "within 20 days" in info["policy_text"] and info["bench_version"] == BENCH_VERSION
    assert {t["name"] for t in info["tools"]} >= {"get_order", "refund", "reply"} - {"reply"}
    task = info["task"]
    obs, r, term, trunc, info = env.step(f'get_order {{"order_id":"{task.params["order_id"]}"}}')
    order = task.params["db"]["orders"][task.params["order_id"]]
    assert f"days={order['days']}" in obs and f"amount={order['amount']}" in obs and not info["is_write"]


def test_deprecated_and_renamed_tools_answer_with_the_new_name():
    env = make("driftbench/telecom-v1")
    obs, info = env.reset(seed=0, options={"rule_version": 3})
    line = info["task"].params["line_id"]
    assert env.step(f'suspend_line {{"line_id":"{line}"}}')[0] == "error: suspend_line is deprecated; use set_line_status"
    assert "lookup_account" in env.step('get_account {"account_id":"A-1"}')[0]


def test_judge_action_under_rules_in_force():
    d = get_domain("retail")
    # a non-gold refund of 21-30 days: refundable under v1 (30 days), not under v2 (20 days)
    task = next(t for t in generate_tasks("retail", 400, 0, rule_version=2)
                if t.params["kind"] == "refund" and t.params["db"]["customer"]["tier"] == "standard"
                and t.params["db"]["orders"][t.params["order_id"]]["status"] == "delivered"
                and 20 < t.params["db"]["orders"][t.params["order_id"]]["days"] <= 30
                and t.params["db"]["orders"][t.params["order_id"]]["amount"] <= 150)
    env = make("driftbench/retail-v1")
    env.reset(seed=0, options={"task": task})
    refund = f'refund {{"order_id":"{task.params["order_id"]}"}}'
    j = env.judge_action(refund)
    assert j["is_write"] and not j["correct"] and j["stale"] and "refund_window" in j["violations"]
    assert j["correct_write"] is None and j["correct_action"].startswith("reply") and "denied" in j["correct_action"]
    assert env.judge_action(f'get_order {{"order_id":"{task.params["order_id"]}"}}') == {**env.judge_action(
        f'get_order {{"order_id":"{task.params["order_id"]}"}}'), "is_write": False, "correct": True}
    # the same facts under v1: the refund is right and not stale
    env.reset(seed=0, options={"task": task.model_copy(update={"rule_version": 1, "params": {
        **task.params, "rules": d.versions[1], "prior_rules": [], "shown_rules": d.versions[1]}})})
    j = env.judge_action(refund)
    assert j["correct"] and not j["stale"] and not j["violations"]


def test_runtime_mode_executes_what_is_stepped():
    """user_simulation=False: no persona; a wrong write is executed and fails the episode."""
    task = next(t for t in generate_tasks("retail", 200, 3, rule_version=1, persona="careful")
                if t.params["kind"] == "refund" and
                t.params["db"]["orders"][t.params["order_id"]]["status"] == "delivered")
    env = make("driftbench/retail-v1")
    env.reset(seed=0, options={"task": task, "user_simulation": False})
    obs, *_, info = env.step(f'exchange {{"order_id":"{task.params["order_id"]}"}}')
    assert obs.startswith("ok: exchanged") and "feedback" not in info and info["is_write"]
    *_, info = env.step('reply {"text":"exchanged"}')
    assert not info["verdict"]["success"] and "as_requested" in info["verdict"]["violations"]


def test_careful_user_rejects_or_fixes_a_wrong_write():
    tasks = [t for t in generate_tasks("retail", 300, 4, rule_version=1, persona="careful")
             if t.params["kind"] == "refund" and
             t.params["db"]["orders"][t.params["order_id"]]["status"] == "delivered"][:20]
    kinds = set()
    env = make("driftbench/retail-v1")
    for i, t in enumerate(tasks):
        env.reset(seed=i, options={"task": t})
        obs, *_, info = env.step(f'exchange {{"order_id":"{t.params["order_id"]}"}}')
        kinds.add(info["feedback"]["kind"])
        assert info["feedback"]["kind"] in ("reject", "edit")
        assert obs.startswith("user rejected") or obs.startswith("user edited it to")
    assert kinds == {"reject", "edit"}


@pytest.mark.parametrize("env_id", list_envs())
def test_verdict_breaks_reward_down(env_id):
    env = make(env_id)
    task = generate_tasks(env.domain, 1, 9, rule_version=1)[0]
    res = run_episode(env, OracleAgent(seed=0), task, seed=0)
    assert res["success"] and res["breakdown"] == {"state": 1.0, "reply": 1.0, "rules": 1.0, "format": 1.0}
    env.reset(seed=0, options={"task": task})
    env.step("nonsense!")
    *_, info = env.step('reply {"text":"refunded and denied and credited"}')
    v = info["verdict"]
    assert not v["success"] and v["reward"] == 0.0 and v["breakdown"]["reply"] == 0.0
    assert v["breakdown"]["format"] == 0.5


def test_a_task_survives_a_json_round_trip():
    """The runtime ships tasks as JSON: the env must behave the same on the decoded task."""
    from dynamic_bench.schema import Task

    stream = make_stream("mixed", "telecom", 40, 0)
    env = make("driftbench/telecom-v1")
    for ep in stream.episodes[::5]:
        again = Task.model_validate_json(ep.task.model_dump_json())
        a = run_episode(env, OracleAgent(seed=1), ep.task, seed=ep.seed)
        b = run_episode(env, OracleAgent(seed=1), again, seed=ep.seed)
        assert a == b and a["success"]
        assert again.gold_checks["outcome"] in env.domain.outcomes
        tools = env.domain.tools(again.params["rules"])
        did = [x for x in a["actions"] if x.split(" ", 1)[0] in tools and tools[x.split(" ", 1)[0]].is_write]
        assert again.gold_checks["writes"] == did


@pytest.mark.parametrize("env_id", list_envs())
def test_a_malformed_write_is_an_error_not_a_violation(env_id):
    """A broken call to a write tool costs format, not the episode; the agent can still succeed."""
    env = make(env_id)
    for i, task in enumerate(generate_tasks(env.domain, 10, 2, rule_version=3)):
        obs, info = env.reset(seed=i, options={"task": task})
        write = next(t["name"] for t in info["tools"] if t["is_write"])
        obs, r, term, trunc, info = env.step(f"{write} {{}}")
        assert obs.startswith("error: missing required argument") and not info["is_write"]
        agent = OracleAgent(seed=i)
        agent.reset(obs, info)
        while not (term or trunc):
            obs, r, term, trunc, info = env.step(agent.act(obs, info))
        assert info["verdict"]["success"] and info["verdict"]["breakdown"]["format"] < 1.0


def test_reset_can_draw_a_silently_shifted_task():
    env = make("driftbench/retail-v1")
    _, info = env.reset(seed=0, options={"rule_version": 2, "shown_version": 1})
    assert info["task"].rule_version == 2 and "within 30 days" in info["policy_text"]
    assert info["task"].params["prior_rules"] == [[1, get_domain("retail").versions[1]]]


_ALL_TOOLS = sorted({n for d in ("retail", "telecom") for ts in get_domain(d).tool_sets.values() for n in ts.specs})


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(list_envs()), st.lists(st.one_of(
    st.text(max_size=60),
    st.builds(lambda n, a: f"{n} {json.dumps(a)}", st.sampled_from(_ALL_TOOLS + ["reply"]),
              st.dictionaries(st.sampled_from(["order_id", "user_id", "account_id", "line_id", "amount", "reason",
                                               "status", "text", "x"]),
                              st.one_of(st.integers(-5, 500), st.text(max_size=8), st.none(), st.booleans()),
                              max_size=4))), min_size=1, max_size=12))
def test_no_action_sequence_makes_the_env_raise(env_id, actions):
    env = make(env_id, max_steps=8)
    env.reset(seed=0)
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        assert isinstance(obs, str) and r in (0.0, 1.0)
        if term or trunc:
            assert set(info["verdict"]["breakdown"]) == {"state", "reply", "rules", "format"}
            break
