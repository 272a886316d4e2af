"""`train_rl` end to end on DriftBench with the tiny policy: determinism, resume, Ray, async staleness."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from training.rl.trainer import RLConfig, TaskPool, read_metrics, train_rl


@pytest.fixture(scope="module")
def drift_policy(tmp_path_factory) -> str:
    """A tiny policy whose tokenizer knows DriftBench text (prompts stay short)."""
    import torch

    from dynamic_bench import generate_tasks, make
    from training.policy import build_policy

    torch.set_num_threads(2)
    env, texts = make("driftbench/retail-v1"), []
    for t in generate_tasks("retail", 30, seed=0):
        obs, info = env.reset(seed=0, options={"task": t})
        texts += [info["policy_text"], obs] + [json.dumps(x) for x in info["tools"]]
    return str(build_policy(tmp_path_factory.mktemp("drift_policy"), "tiny", texts * 3, seed=0))


@pytest.fixture(scope="module")
def deny_pool() -> TaskPool:
    """Two tasks whose right answer is a reply (explored episodes succeed now and then) and one that
    needs a write (wrong writes get edited by the simulated user: corrections for the SFT term)."""
    from dynamic_bench import generate_tasks, get_domain

    d = get_domain("retail")
    all_tasks = generate_tasks("retail", 40, seed=0)
    tasks = [t for t in all_tasks if not d.solve(t.params, t.params["rules"])[0]][:2]
    tasks += [t for t in all_tasks if d.solve(t.params, t.params["rules"])[0] and t.persona == "editor"][:1]
    assert len(tasks) == 3
    return TaskPool(tasks={t.id: t for t in tasks})


def _run(cfg: RLConfig, pool: TaskPool, **kw):
    return train_rl(cfg, pool=pool, **kw)


def _cfg(model: str, out, **kw) -> RLConfig:
    # Pure action-level exploration plus supervised corrections: a random tiny policy then gets
    # both policy-gradient signal (some explored episodes succeed) and a non-zero SFT loss.
    base = dict(model=model, out_dir=str(out), steps=4, groups_per_step=1, group_size=6, n_tasks=3,
                max_turns=3, max_new_tokens=12, explore_eps=1.0, sft_coef=0.5, n_workers=1, eta=0,
                lr=1e-3, checkpoint_every=2, progress=False, seed=7, dynamic_sampling=False,
                max_groups_per_step=1)
    base.update(kw)
    return RLConfig(**base)


def _trace(out) -> list[tuple]:
    return [(r["loss"], r.get("sft_loss"), r["reward_mean"], r["tokens"]) for r in read_metrics(out)]


def test_same_seed_gives_identical_losses_for_20_steps(drift_policy, tmp_path, deny_pool):
    a = _run(_cfg(drift_policy, tmp_path / "a", steps=20, checkpoint_every=20), deny_pool)
    _run(_cfg(drift_policy, tmp_path / "b", steps=20, checkpoint_every=20), deny_pool)
    ta, tb = _trace(tmp_path / "a"), _trace(tmp_path / "b")
    assert len(ta) == 20 and ta == tb
    assert any(x[1] for x in ta), "corrections should give a supervised loss"
    assert any(x[3] > 0 for x in ta), "some explored groups should succeed and give policy-gradient rows"
    assert len({x[3] for x in ta}) > 1
    assert (a / "adapter_model.safetensors").exists() and (tmp_path / "a" / "metrics.png").exists()
    assert (tmp_path / "a" / "diagnosis.txt").read_text().strip()
    c = _run(_cfg(drift_policy, tmp_path / "c", steps=3, checkpoint_every=20, seed=8), deny_pool)
    assert _trace(tmp_path / "c") != ta[:3]  # and the seed matters
    assert c.exists()


def test_corrections_are_kept_and_redrawn_by_later_steps(drift_policy, tmp_path, deny_pool):
    """The users' corrections of step 1 come back in step 2's supervised rows (and in the checkpoint,
    so a resumed run keeps them); with `keep_corrections=False` a step trains only on its own."""
    import torch

    kw = dict(steps=8, checkpoint_every=8, experience_per_step=4)
    _run(_cfg(drift_policy, tmp_path / "kept", **kw), deny_pool)
    _run(_cfg(drift_policy, tmp_path / "once", keep_corrections=False, **kw), deny_pool)
    kept, once = read_metrics(tmp_path / "kept"), read_metrics(tmp_path / "once")
    first = next(i for i, r in enumerate(once) if r["sft_rows"] > 0)  # the first step with corrections
    assert first < 7 and _trace(tmp_path / "kept")[:first + 1] == _trace(tmp_path / "once")[:first + 1]
    assert kept[first + 1]["sft_rows"] == once[first + 1]["sft_rows"] + min(4, once[first]["sft_rows"])
    saved = torch.load(tmp_path / "kept" / "checkpoint" / "state.pt", weights_only=False)["corrections"]
    keys = [(tuple(r.prompt_ids), tuple(r.completion_ids)) for r in saved]
    assert len(keys) == len(set(keys)) >= once[first]["sft_rows"] and all(r.sft for r in saved)


class Interrupt(Exception):
    pass


def test_interrupted_run_resumes_where_it_stopped(drift_policy, tmp_path, deny_pool):
    full = tmp_path / "full"
    _run(_cfg(drift_policy, full, steps=6), deny_pool)

    def stop_at_5(step, row):
        if step == 5:
            raise Interrupt()

    part = tmp_path / "part"
    with pytest.raises(Interrupt):
        _run(_cfg(drift_policy, part, steps=6), deny_pool, on_step=stop_at_5)
    assert len(read_metrics(part)) == 5  # step 5 was logged, but the last checkpoint is step 4
    _run(_cfg(drift_policy, part, steps=6), deny_pool)
    rows = read_metrics(part)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert _trace(part) == _trace(full)  # the resumed run continues exactly as if never stopped
    cfg = json.loads((part / "config.json").read_text())
    assert cfg["steps"] == 6


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"))])
def test_a_run_on_a_device_stops_at_its_wall_clock_budget(drift_policy, tmp_path, deny_pool, device):
    """`device` carries the learner and the rollout engines; `max_minutes` ends the run after the
    step that crosses it, which is then scored on the held-out set and checkpointed as a last step."""
    pool = dataclasses.replace(deny_pool, heldout=list(deny_pool.tasks.values())[:1])
    out = tmp_path / device
    adapter = _run(_cfg(drift_policy, out, steps=5, device=device, max_minutes=1e-6, eval_every=10), pool)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1]
    assert "heldout_success" in rows[0] and "heldout_success_start" in rows[0]
    assert adapter.exists() and (out / "checkpoint" / "COMPLETE").read_text() == "1"


@pytest.mark.ray
def test_ray_backed_run_completes(drift_policy, tmp_path, deny_pool):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    adapter = _run(_cfg(drift_policy, out, steps=1, backend="ray", n_workers=1), deny_pool)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1] and adapter.exists()
    # same seed, thread backend: the backend does not change what is learned
    _run(_cfg(drift_policy, tmp_path / "thr", steps=1, n_workers=1), deny_pool)
    assert _trace(out) == _trace(tmp_path / "thr")


@pytest.mark.slow
def test_process_backed_run_completes(drift_policy, tmp_path, deny_pool):
    out = tmp_path / "proc"
    _run(_cfg(drift_policy, out, steps=1, backend="process", n_workers=1), deny_pool)
    assert [r["step"] for r in read_metrics(out)] == [1]


def test_async_run_respects_the_staleness_bound(drift_policy, tmp_path, deny_pool):
    out = tmp_path / "async"
    _run(_cfg(drift_policy, out, steps=4, eta=1, n_workers=2, queue_size=3, checkpoint_every=10), deny_pool)
    rows = read_metrics(out)
    assert len(rows) == 4
    lags = [int(k) for r in rows for k in r["staleness_hist"]]
    assert max(lags) <= 1 and all(r["staleness_mean"] <= 1 for r in rows)
    # rollouts ran ahead of the learner: some admitted groups were one version old, or were rejected
    assert max(lags) == 1 or sum(r["stale_rejected"] for r in rows) > 0


def test_a_pool_tasks_memory_notes_are_shown_when_it_is_played(drift_policy, tmp_path, deny_pool):
    """`TaskPool.memory`: the worker shows a task's notes in its prompts as the runtime shows recalled
    memory (the cycle's RL on tasks the policy failed with memory), and only for that task."""
    from training.policy import load_tokenizer
    from training.rl.async_rl import WorkOrder
    from training.rl.runner import EpisodeRunnerFactory

    notes = ["Refund window changed: refunds are allowed up to 45 days after delivery."]
    tid, task = next(iter(deny_pool.tasks.items()))
    runner = EpisodeRunnerFactory(model=drift_policy, max_turns=2, max_new_tokens=8)(0)
    shown = runner.run(WorkOrder(1, tid, 2, seed=3, payload={"task": task, "memory": notes}))
    bare = runner.run(WorkOrder(2, tid, 2, seed=3, payload={"task": task}))
    tok = load_tokenizer(drift_policy)
    assert [t.metadata["memory"] for t in shown] == [notes, notes] and [t.metadata["memory"] for t in bare] == [[], []]
    assert all(notes[0] in tok.decode(t.steps[0].prompt_token_ids) for t in shown)
    assert not any(notes[0] in tok.decode(t.steps[0].prompt_token_ids) for t in bare)
    # through train_rl: the same seeded run trains other weights once the pool's tasks carry notes.
    # Not the loss trace: with explore_eps=1 the actions ignore the prompt, and the on-policy loss
    # value (ratio 1) does not depend on logprobs; its gradient does, through the prompt.
    from safetensors.torch import load_file

    bare_adapter = _run(_cfg(drift_policy, tmp_path / "bare", steps=2, checkpoint_every=20), deny_pool)
    with_notes = dataclasses.replace(deny_pool, memory={k: notes for k in deny_pool.tasks})
    notes_adapter = _run(_cfg(drift_policy, tmp_path / "notes", steps=2, checkpoint_every=20), with_notes)
    a, b = (load_file(str(d / "adapter_model.safetensors")) for d in (bare_adapter, notes_adapter))
    assert a.keys() == b.keys() and any(not a[k].equal(b[k]) for k in a)


def _warmup_pool(policy: str, pool: TaskPool) -> TaskPool:
    """`pool` with 5 focus rows, 3 logged rows and 2 rehearsal rows (short texts, one target each)."""
    from training.policy import load_tokenizer
    from training.rl.learner import Row

    tok = load_tokenizer(policy)
    texts = ["refund the order", "escalate to a human agent", "offer an exchange", "deny the request",
             "issue a coupon of 10", "look up the customer", "reply with the policy", "check the delivery date"]

    def row(i: int, text: str) -> Row:
        return Row(tok.encode(f"case {i}: what now?", add_special_tokens=False),
                   tok.encode(text, add_special_tokens=False), [], sft=True)

    return dataclasses.replace(pool, sft_focus=[row(i, t) for i, t in enumerate(texts[:5])],
                               sft_rows=[row(10 + i, t) for i, t in enumerate(texts[5:])],
                               rehearsal=[row(20, texts[0]), row(21, texts[3])])


def test_supervised_warmup_trains_every_logged_row_before_rl_and_is_not_redone_on_resume(
        drift_policy, tmp_path, deny_pool):
    """`sft_warmup_epochs`: seeded passes over the focus, logged and rehearsal rows, batch by batch,
    before the first RL step; its loss falls over the epochs; it is checkpointed, so a run killed
    during RL resumes exactly as the uninterrupted one and does not redo it."""
    pool = _warmup_pool(drift_policy, deny_pool)
    kw = dict(steps=3, checkpoint_every=2, sft_warmup_epochs=4, sft_warmup_batch=4, lr=3e-3)
    full = tmp_path / "full"
    _run(_cfg(drift_policy, full, **kw), pool)
    summary = json.loads((full / "warmup.json").read_text())
    assert (summary["rows"], summary["focus_rows"], summary["steps"]) == (10, 5, 4 * 3)
    losses = summary["epoch_loss"]
    assert len(losses) == 4 and all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < losses[0] - 0.1, losses

    def stop_at_3(step, row):
        if step == 3:
            raise Interrupt()

    part = tmp_path / "part"
    with pytest.raises(Interrupt):
        _run(_cfg(drift_policy, part, **kw), pool, on_step=stop_at_3)
    (part / "warmup.json").unlink()
    _run(_cfg(drift_policy, part, **kw), pool)
    assert not (part / "warmup.json").exists()  # resumed from step 2's checkpoint: no second warm-up
    assert _trace(part) == _trace(full)
    _run(_cfg(drift_policy, tmp_path / "none", steps=3, checkpoint_every=2, lr=3e-3), pool)
    assert _trace(tmp_path / "none") != _trace(full)  # the warm-up changed the policy RL started from
    assert not (tmp_path / "none" / "warmup.json").exists()
    _run(_cfg(drift_policy, tmp_path / "no-rows", steps=1, sft_warmup_epochs=4), deny_pool)
    summary = json.loads((tmp_path / "no-rows" / "warmup.json").read_text())
    assert (summary["epochs"], summary["rows"], summary["steps"]) == (0, 0, 0)  # what ran, not what was asked


def test_warmup_batches_keep_each_episode_whole_and_take_every_row_once():
    """`warmup_batches`: an episode's turns (each prompt extends the last turn's ids) stay together
    and in order, so the learner runs one sequence per episode; rows that chain to nothing are
    episodes of their own; each batch closes once it holds `batch` rows; the order is seeded."""
    from training.rl.learner import Row, episode_chains, packed_sequences
    from training.rl.trainer import warmup_batches

    rows, k = [], 0
    for ep, turns in enumerate([3, 1, 4, 2, 2, 1, 3]):
        prompt = [1000 + ep]
        for _ in range(turns):
            rows.append(Row(list(prompt), [k, k + 1], [], sft=True))
            prompt, k = prompt + [k, k + 1, 999], k + 2  # the next turn: last prompt, completion, observation
    rows.append(Row([5, 6], [7], [], sft=True))  # a lone row (a focused decision, a truncated context)

    chains = episode_chains(rows)
    batches = warmup_batches(chains, 4, "s/0")
    flat = [r for b in batches for r in b]
    assert sorted(id(r) for r in flat) == sorted(id(r) for r in rows)  # every row, once
    episodes = 8
    assert sum(len(packed_sequences(b)[0]) for b in batches) == episodes  # no episode split across batches
    assert len(packed_sequences(rows[::-1])[0]) == len(rows)  # shuffled turn by turn: one sequence each
    for b in batches[:-1]:  # closed by the episode that brought it to 4 rows
        assert len(b) >= 4 and len(b) - len(episode_chains(b)[-1]) < 4
    assert [[id(r) for r in b] for b in batches] == [[id(r) for r in b] for b in warmup_batches(chains, 4, "s/0")]
    orders = {tuple(r.completion_ids[0] for r in sum(warmup_batches(chains, 4, f"s/{e}"), [])) for e in range(5)}
    assert len(orders) > 1  # another epoch's seed, another order


def test_warmup_takes_its_own_learning_rate_and_the_rl_steps_keep_theirs(drift_policy, tmp_path, deny_pool):
    """`sft_warmup_lr`: a near-zero warm-up rate leaves the loss where it was over four epochs (at
    3e-3 it falls, test above), and the optimizer the RL steps resume with is back at `lr`."""
    out = tmp_path / "slow"
    _run(_cfg(drift_policy, out, steps=2, checkpoint_every=1, sft_warmup_epochs=4, sft_warmup_batch=4,
              sft_warmup_lr=1e-9, lr=3e-3), _warmup_pool(drift_policy, deny_pool))
    summary = json.loads((out / "warmup.json").read_text())
    losses = summary["epoch_loss"]
    # flat up to LoRA dropout's noise (~0.01 measured); at 3e-3 the same rows fall by more than 0.1
    assert summary["lr"] == 1e-9 and max(losses) - min(losses) < 0.05, losses
    state = torch.load(out / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    assert {g["lr"] for g in state["learner"]["optimizer"]["param_groups"]} == {3e-3}


def test_config_is_validated(drift_policy, tmp_path, deny_pool):
    with pytest.raises(ValueError):
        train_rl(RLConfig(out_dir=str(tmp_path)))
    with pytest.raises(ValueError):
        train_rl(dataclasses.replace(_cfg(drift_policy, tmp_path), decoupled=False, correction="tis"))


def test_focus_rows_fill_up_to_half_of_each_steps_experience_draw():
    """`experience_rows`: the focus rows (distilled decisions) take up to half of the `k` drawn,
    the logged rows and kept corrections the rest; the same seed draws the same rows."""
    from training.rl.learner import Row
    from training.rl.trainer import experience_rows

    def rows(tag: int, n: int) -> list[Row]:
        return [Row([tag], [i], [], sft=True) for i in range(n)]

    pool = TaskPool(sft_rows=rows(1, 40), sft_focus=rows(2, 10))
    corrections = rows(3, 5)
    got = experience_rows(pool, corrections, 16, "s/0")
    assert len(got) == 16 and sum(r.prompt_ids == [2] for r in got) == 8
    assert len({(tuple(r.prompt_ids), tuple(r.completion_ids)) for r in got}) == 16  # no row twice
    assert experience_rows(pool, corrections, 16, "s/0") == got
    assert experience_rows(pool, corrections, 16, "s/1") != got
    few = TaskPool(sft_rows=rows(1, 40), sft_focus=rows(2, 3))  # fewer focus rows than half: all of them
    assert sum(r.prompt_ids == [2] for r in experience_rows(few, [], 16, "s/0")) == 3
    assert len(experience_rows(few, [], 16, "s/0")) == 16
    assert experience_rows(TaskPool(), corrections, 16, "s/0") == corrections  # fewer than k: all


def test_replay_anchor_rows_come_from_replay_groups_the_policy_still_always_solves():
    """An all-success replay group gives its shortest trajectory's sampled ids as supervised rows
    (dynamic sampling would drop it: no gradient at all); a mixed or a current-rule group gives none."""
    from dynamic_bench.schema import Step, Trajectory
    from training.rl.trainer import replay_anchor_rows

    def traj(n_steps: int, outcome: str) -> Trajectory:
        steps = [Step(index=i, prompt_token_ids=[n_steps, i], completion_token_ids=[10 + i], behaviour_logprobs=[-0.1])
                 for i in range(n_steps)]
        return Trajectory(task_id="t", reward=float(outcome == "success"), outcome=outcome, steps=steps)

    solved = [traj(3, "success"), traj(2, "success"), traj(2, "success")]
    rows = replay_anchor_rows(solved, is_replay=True)
    assert [(r.prompt_ids, r.completion_ids, r.sft) for r in rows] == [([2, 0], [10], True), ([2, 1], [11], True)]
    assert replay_anchor_rows(solved, is_replay=False) == []
    assert replay_anchor_rows(solved[:2] + [traj(2, "failure")], is_replay=True) == []
    assert replay_anchor_rows([], is_replay=True) == []
