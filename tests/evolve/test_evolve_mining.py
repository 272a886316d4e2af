"""Mining: what users said and did becomes deduplicated memory items with provenance, and
experience data (SFT examples, corrections, preference pairs, a task pool by learning value)."""
from __future__ import annotations

from collections import Counter

from dynamic_bench import make_stream
from dynamic_bench.schema import Feedback, Step, Trajectory
from evolve.mining import approved_tools, experience, mine_items, rule_contexts, rule_statements, task_pool


def _task(i: int):
    s = make_stream("silent", "retail", 40, seed=3)
    return [e.task for e in s.episodes if e.task.params["shown_rules"] != e.task.params["rules"]][i]


def _traj(task, steps, feedback, outcome, tenant="acme") -> Trajectory:
    t = Trajectory(task_id=task.id, tenant=tenant, outcome=outcome, reward=float(outcome == "success"),
                   steps=[Step(index=i, prompt_token_ids=[1, 2, i], completion_token_ids=[5, i], action_text=a,
                               observation=o) for i, (a, o) in enumerate(steps)],
                   metadata={"world": {"world": "driftbench/retail-v1", "task_json": task.model_dump_json()}})
    t.feedback = [Feedback(trajectory_id=t.id, step=s, kind=k, payload=p) for s, k, p in feedback]
    return t


SAID = "no. refund window is now 14 days; refunds over 150 must now be escalated"


def log():
    a, b, c = _task(0), _task(1), _task(2)
    return [
        _traj(a, [('get_order {"order_id":"O-1"}', "order O-1 ..."), ('refund {"order_id":"O-1"}', "user: no")],
              [(1, "respond", {"proposed": 'refund {"order_id":"O-1"}', "text": SAID})], "failure"),
        _traj(b, [('refund {"order_id":"O-2"}', "user edited it"), ('frobnicate {}', "error: unknown tool 'frobnicate'")],
              [(0, "respond", {"proposed": 'refund {"order_id":"O-2"}', "text": SAID}),
               (0, "edit", {"proposed": 'refund {"order_id":"O-2"}', "action": 'escalate {"order_id":"O-2"}'})],
              "failure"),
        _traj(c, [('get_order {"order_id":"O-3"}', "order ..."), ('exchange {"order_id":"O-3"}', "approved; done"),
                  ('reply {"text":"exchanged"}', "reply sent")],
              [(1, "approve", {"proposed": 'exchange {"order_id":"O-3"}'})], "success"),
    ]


def test_rule_statements_split_a_users_reason():
    assert rule_statements(SAID) == ["refund window is now 14 days", "refunds over 150 must now be escalated"]


def test_a_long_reason_becomes_items_one_recall_carries_whole():
    """Up to four statements, one item each; five (a whole retail v1 -> v2 change) pack two to an
    item, in order and unclipped, so the three items a recall shows hold all of them."""
    from dynamic_bench.streams import rule_change_notes
    from memory.feedback_notes import feedback_notes
    from runtime.graph import AgentConfig
    from runtime.scaffolds import MAX_ITEM_CHARS

    def items(text):
        fb = [Feedback(trajectory_id="t", step=1, kind="respond", payload={"proposed": "refund {}", "text": text})]
        return [n["text"] for n in feedback_notes(fb, "I want a refund for order O-1.")]

    assert items(SAID) == ["Rule: refund window is now 14 days.", "Rule: refunds over 150 must now be escalated."]
    change = rule_change_notes("retail", 1, 2)
    assert len(change) == 5
    packed = items("no. " + "; ".join(change))
    assert len(packed) <= AgentConfig().recall_k and all(len(x) <= MAX_ITEM_CHARS for x in packed)
    assert "; ".join(packed) == "; ".join(f"Rule: {c}." for c in change)


def test_items_have_provenance_and_support_and_are_deduplicated():
    specs = mine_items(log(), "cycle-x")
    texts = Counter(s["text"] for s in specs)
    assert max(texts.values()) == 1
    rule = next(s for s in specs if s["text"] == "Rule: refund window is now 14 days.")
    assert rule["payload"]["support"] == 2 and rule["cycle"] == "cycle-x" and rule["trajectory_id"]
    kinds = Counter(s["kind"] for s in specs)
    assert kinds["tool_knowledge"] == 1 and kinds["strategy"] == 1 and kinds["task_experience"] >= 3
    assert any("replace escalate" in s["text"] for s in specs)  # the edit: refund → escalate
    from memory.feedback_notes import template
    strategy = next(s for s in specs if s["kind"] == "strategy")
    assert strategy["payload"]["template"] == template(_task(2).instruction)  # recalled for that request only
    edit = next(s for s in specs if "replace escalate" in s["text"])
    assert edit["payload"]["template"] == template(_task(1).instruction)
    stale = mine_items(log(), "cycle-x", current=lambda t: False)  # no episode under the rules now in force
    assert not [s for s in stale if s["kind"] == "strategy"] and len(stale) == len(specs) - 1


def test_a_request_that_succeeded_by_two_paths_gives_no_strategy():
    """Two paths that both succeeded for one kind of request mean the facts chose between them:
    either as a strategy would mislead (the served agent denied refunds it should have escalated
    when recalled "get_customer then get_order then reply succeeded"). One path, however often, stays."""
    task = _task(2)
    exchanged = [('get_order {"order_id":"O-3"}', "order ..."), ('exchange {"order_id":"O-3"}', "done"),
                 ('reply {"text":"exchanged"}', "reply sent")]
    declined = [('get_order {"order_id":"O-3"}', "order ..."), ('reply {"text":"outside the window"}', "reply sent")]

    def strategies(paths):
        specs = mine_items([_traj(task, p, [], "success") for p in paths], "cycle-x")
        return [s for s in specs if s["kind"] == "strategy"]

    one = strategies([exchanged, exchanged])
    assert len(one) == 1 and one[0]["payload"]["support"] == 2
    assert strategies([exchanged, declined]) == []
    other_tenant = mine_items([_traj(task, exchanged, [], "success"),
                               _traj(task, declined, [], "success", tenant="globex")], "cycle-x")
    assert len([s for s in other_tenant if s["kind"] == "strategy"]) == 2  # each tenant saw one path


def test_mining_the_same_window_twice_adds_no_item(tmp_path):
    from memory import MemoryService

    mem = MemoryService(tmp_path / "memory")
    try:
        specs = mine_items(log(), "cycle-x")
        first = {it.id for it in mem.add_many(specs)}
        again = {it.id for it in mem.add_many(mine_items(log(), "cycle-x"))}
        assert again == first and len(mem.items("acme")) == len(first)
        for it in mem.items("acme"):
            assert it.provenance and all(p.trajectory_id for p in it.provenance)
            prov = [(p.trajectory_id, p.step, p.evidence) for p in it.provenance]
            assert len(prov) == len(set(prov))
    finally:
        mem.close()


def test_experience_data_and_task_pool():
    trajs = log()
    exp = experience(trajs)
    assert [r["action_text"] for r in exp["corrections"]] == ['escalate {"order_id":"O-2"}']
    assert exp["pairs"][0]["chosen_text"] == 'escalate {"order_id":"O-2"}'
    assert {r["trajectory_id"] for r in exp["sft"]} == {trajs[2].id}  # only the approved success
    pool = task_pool(trajs, max_tasks=10, seed=0)
    assert len(pool) == 3 and pool[0]["learning_value"] >= pool[-1]["learning_value"]
    ctx = rule_contexts(trajs)
    assert ctx and ctx[-1]["rules"] != ctx[-1]["shown_rules"]  # the silent context is recorded as such


def test_a_takeover_doing_what_the_agent_proposed_is_a_correction_but_no_preference_pair():
    """Chosen and rejected alike give DPO a margin of exactly 0 and no gradient (the demo's seed-2
    cycle drew 3 such pairs every step: loss ln 2, accuracy 0); the user's action still teaches."""
    same = 'refund {"order_id":"O-4"}'
    t = _traj(_task(3), [(same, "done")], [(0, "takeover", {"proposed": same, "action": same + " "})], "success")
    trajs = log()
    exp = experience(trajs + [t])
    assert [r["action_text"] for r in exp["corrections"]] == ['escalate {"order_id":"O-2"}', same + " "]
    assert exp["pairs"] == experience(trajs)["pairs"] and exp["pairs"]  # the takeover added none
    assert all(p["chosen_text"].strip() != p["rejected_text"].strip() for p in exp["pairs"])


def test_experience_does_not_depend_on_the_order_users_logged_in():
    """Concurrent users interleave the log differently each run; the training data must not move."""
    import random

    trajs = log() + log()  # a second copy of each episode under new trajectory ids
    for i, t in enumerate(trajs):
        t.steps[0].prompt_token_ids = [1, 2, 0, i]  # distinct contents for the same task
    exp, pool = experience(trajs), task_pool(trajs, max_tasks=10, seed=0)
    for seed in range(3):
        shuffled = random.Random(seed).sample(trajs, len(trajs))
        assert shuffled != trajs
        assert experience(shuffled) == exp
        assert task_pool(shuffled, max_tasks=10, seed=0) == pool


def test_experience_learns_only_what_is_still_right_after_a_silent_shift():
    """Logged v1 behaviour is training data after a silent shift to v2 only where v2 wants the same
    answer (the prompts are identical); after an announced shift, or under the latest rules, always."""
    import random

    from dynamic_bench import generate_tasks, get_domain
    from dynamic_bench.tasks import make_task
    from evolve.stages import still_right

    d = get_domain("retail")
    v1, v2 = d.versions[1], d.versions[2]
    silent = {"rules": v2, "shown_rules": v1}
    announced = {"rules": v2, "shown_rules": v2}
    old = generate_tasks("retail", 60, seed=4, split="train", rule_version=1)
    kept = [still_right(t, silent) for t in old]
    assert kept == [d.same_answer(t.params, v1, v2) for t in old] and 0 < sum(kept) < len(kept)
    assert all(still_right(t, announced) for t in old) and all(still_right(t, None) for t in old)
    rng = random.Random(0)
    assert all(still_right(make_task(d, rng, rule_version=2, shown=(1, v1)), silent) for _ in range(20))


def test_online_notes_are_the_mined_items_without_ids(tmp_path):
    """The runtime's notes after an episode (`runtime.agent_io.remember`) and the cycle's mining
    write the same masked text, so memory holds one item per rule."""
    from memory import MemoryService
    from runtime.agent_io import remember

    trajs = log()
    svc = MemoryService(tmp_path / "mem")
    try:
        for t in trajs:
            remember(svc, t, {}, {"instruction": _task(trajs.index(t)).instruction})
        online = {it.text for it in svc.items("acme")}
        assert online and not any(c in text for text in online for c in ("O-1", "O-2", "U-"))
        assert "Rule: refund window is now 14 days." in online
        assert any("users replace escalate instead" in x for x in online)
        mined = {s["text"] for s in mine_items(trajs, "cycle-x") if s["kind"] == "task_experience"}
        assert online <= mined
        svc.add_many([s for s in mine_items(trajs, "cycle-x")])
        merged = [it for it in svc.items("acme") if it.text == "Rule: refund window is now 14 days."]
        assert len(merged) == 1 and merged[0].provenance[0].source == "user"  # the user's own words
        inferred = next(it for it in svc.items("acme") if "users replace escalate" in it.text)
        assert inferred.provenance[0].source == "agent"  # a generalisation: outcomes may invalidate it
    finally:
        svc.close()


def _escalations():
    """One kind of refund request: an escalation a user edited to a refund, and one a user approved."""
    task = _task(0)
    edited = _traj(task, [('escalate {"order_id":"O-1"}', "user edited it"), ('reply {"text":"refunded"}', "sent")],
                   [(0, "edit", {"proposed": 'escalate {"order_id":"O-1"}', "action": 'refund {"order_id":"O-1"}'})],
                   "success")
    approved = _traj(task, [('get_order {"order_id":"O-1"}', "order ..."), ('escalate {"order_id":"O-1"}', "done"),
                            ('reply {"text":"escalated"}', "sent")],
                     [(1, "approve", {"proposed": 'escalate {"order_id":"O-1"}'})], "success")
    return edited, approved


def test_approved_tools_name_what_an_uncorrected_success_called():
    edited, approved = _escalations()
    got = approved_tools([edited, approved])
    assert {tool for _, _, tool in got} == {"get_order", "escalate", "reply"}  # not the edited episode's
    assert {tenant for tenant, _, _ in got} == {"acme"} and len({tpl for _, tpl, _ in got}) == 1
    assert approved_tools([edited]) == set()


def test_the_mine_stage_retracts_a_correction_the_window_contradicts(tmp_path):
    """"When you would escalate ..., users replace refund instead" is wrong as stated when an
    escalation was approved for the same kind of request: the item (also written online, same text)
    is retracted with its reason; without the approval, or with the option off, it stays live."""
    import json

    from evolve import stages
    from evolve.cycle import CycleConfig, CycleContext, CycleState
    from memory import MemoryService

    def mined(trajs, retract: bool, name: str):
        data = tmp_path / name
        mem = MemoryService(data / "memory")
        for t in trajs:
            mem.record_trajectory(t)
        cdir = data / "cycles" / "cycle-0001"
        cdir.mkdir(parents=True)
        ctx = CycleContext(CycleConfig(data_dir=str(data), retract_contradicted=retract),
                           CycleState(cycle_id="cycle-0001", started_at=0.0), cdir)
        ctx.cache["memory"] = mem
        out = stages.mine(ctx)
        notes = {it.text: it for it in mem.items("acme", statuses=("candidate", "validated", "retracted"))
                 if "when you would escalate" in it.text}
        mem.close()
        assert json.loads((cdir / "window.json").read_text())["trajectory_ids"]
        return out, notes

    edited, approved = _escalations()
    out, notes = mined([edited, approved], True, "both")
    assert out["retracted"] == 1 and len(notes) == 1
    (note,) = notes.values()
    assert note.status == "retracted" and "escalate was also approved" in note.status_reason
    for trajs, retract, name in (([edited], True, "edit-only"), ([edited, approved], False, "off")):
        out, notes = mined(trajs, retract, name)
        assert out["retracted"] == 0 and [n.status for n in notes.values()] == ["candidate"]
