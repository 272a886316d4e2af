"""The train stage's supervised input (evolve.training_rows): the experience files as rows the
learner trains on, with and without the memory they were shown, and cold-start rehearsal."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_logged_experience_reaches_the_learner(traffic, tiny_policy, tmp_path):
    """Approved successes, corrections and preference pairs (the experience stage's files) are
    trained on: SFT rows and DPO pairs in every RL step. Built from real logged prompts, since
    the tiny policy's own traffic holds no corrections; two of them are given a recalled note."""
    import math

    from dynamic_bench import generate_tasks
    from evolve.training_rows import logged_experience
    from memory import MemoryService
    from runtime.scaffolds import MEMORY, USER, without_memory
    from training.policy import load_tokenizer
    from training.rl.trainer import RLConfig, TaskPool, read_metrics, train_rl

    mem = MemoryService(traffic["data"] / "memory")
    try:
        steps = [t.steps[0] for t in mem.trajectories().trajectories[:3]]
    finally:
        mem.close()
    tok = load_tokenizer(tiny_policy)

    def with_note(ids: list[int]) -> list[int]:  # the memory section ("none") replaced by one note
        i, j = ids.index(tok.convert_tokens_to_ids(MEMORY)) + 1, ids.index(tok.convert_tokens_to_ids(USER))
        return ids[:i] + tok.encode("- refunds over 150 go to a human", add_special_tokens=False) + ids[j:]

    prompts = [list(steps[0].prompt_token_ids)] + [with_note(list(s.prompt_token_ids)) for s in steps[1:]]
    fix = 'reply {"text":"Order O-1000: denied."}'
    rows = {"sft": [{"prompt_token_ids": p, "completion_token_ids": s.completion_token_ids}
                    for p, s in zip(prompts, steps)],
            "corrections": [{"prompt_token_ids": p, "action_text": fix} for p in prompts],
            "pairs": [{"prompt_token_ids": p, "chosen_text": fix,
                       "rejected_token_ids": s.completion_token_ids} for p, s in zip(prompts, steps)]}
    for name, rs in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    distilled = [{"prompt_token_ids": prompts[0], "completion_token_ids": [5, 6]},
                 {"prompt_token_ids": prompts[1], "completion_token_ids": [7], "anchor": True}]
    (tmp_path / "distilled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in distilled))
    sft, focus, pairs = logged_experience(tmp_path, tiny_policy, distill_memory=False)
    assert len(pairs) == 3 and not focus and [r.completion_ids for r in sft[6:]] == [[5, 6], [7]]
    sft, focus, _ = logged_experience(tmp_path, tiny_policy, distill_memory=False, distill_focus=True)
    assert len(sft) == 6 and [r.completion_ids for r in focus] == [[5, 6], [7]]  # both in TaskPool.sft_focus
    assert tok.decode(sft[3].completion_ids) == fix + "<|end|>" and pairs[0].chosen_ids == sft[3].completion_ids
    bare = [without_memory(tok, p) for p in prompts]
    assert bare[0] is None and bare[1] == list(steps[1].prompt_token_ids)
    (tmp_path / "distilled.jsonl").unlink()
    dist_sft, _, dist_pairs = logged_experience(tmp_path, tiny_policy)  # + the memory-free copies
    assert len(dist_sft) == 6 + 2 * 2 and len(dist_pairs) == 3 + 2
    assert [r.prompt_ids for r in dist_sft[6:]] == [b for b in bare + bare if b is not None]
    # corrections_with_memory=False: a correction and its pair only with the memory emptied, no second copy
    own_sft, _, own_pairs = logged_experience(tmp_path, tiny_policy, corrections_with_memory=False)
    emptied = [b or p for b, p in zip(bare, prompts)]
    assert [r.prompt_ids for r in own_sft[3:6]] == emptied and [q.prompt_ids for q in own_pairs] == emptied
    assert [r.prompt_ids for r in own_sft[:3]] == prompts  # an approved row keeps the memory it was shown
    assert [r.prompt_ids for r in own_sft[6:]] == bare[1:]  # and gets its memory-free copy
    pool = TaskPool(tasks={t.id: t for t in generate_tasks("retail", 2, seed=3, split="train")},
                    sft_rows=sft, sft_focus=focus, pref_pairs=pairs, rehearsal=sft[:3])
    cfg = RLConfig(model=str(tiny_policy), out_dir=str(tmp_path / "rl"), steps=2, groups_per_step=1, group_size=2,
                   max_turns=2, n_workers=1, sft_coef=1.0, pref_coef=1.0, experience_per_step=4,
                   rehearsal_per_step=2, progress=False)
    train_rl(cfg, pool=pool)
    m = read_metrics(tmp_path / "rl")
    assert [r["pref_pairs"] for r in m] == [3.0, 3.0] and all(r["sft_rows"] >= 4 + 2 for r in m)
    assert [r["rehearsal_rows"] for r in m] == [2, 2]
    assert m[0]["pref_loss"] == pytest.approx(math.log(2), abs=1e-3)  # step 1: adapter B = 0, policy == reference
    assert m[1]["pref_loss"] < m[0]["pref_loss"]  # the same three pairs, after one update


def test_memory_rehearsal_rows_show_a_memory_the_right_action_follows(tiny_policy):
    """`rehearsal_examples` of the memory kind: seeded oracle episodes of the cycle's domain in
    which recalled memory states a rule the shown policy does not: every row's prompt shows policy
    v1 and a memory section, and its completion is one whole action."""
    from evolve.training_rows import rehearsal_examples, rehearsal_rows
    from runtime.scaffolds import without_memory
    from training.policy import load_tokenizer

    def rows_for(seed: int) -> list:
        return rehearsal_rows(Path(tiny_policy), rehearsal_examples("retail", 6, 0, seed, None))

    rows = rows_for(0)
    assert rows == rows_for(0) != rows_for(1)
    tok = load_tokenizer(tiny_policy)
    assert len(rows) >= 6 and all(r.sft and without_memory(tok, r.prompt_ids) is not None for r in rows)
    texts = [tok.decode(r.completion_ids) for r in rows]
    assert all(t.endswith("<|end|>") and t.count("<|end|>") == 1 for t in texts)
    assert all("retail policy v1" in tok.decode(r.prompt_ids) for r in rows)


def test_old_rule_rehearsal_keeps_only_episodes_the_latest_rules_agree_with():
    """First-rule episodes without memory are rehearsed only where the latest rules prescribe the
    same actions: after a silent shift the prompt is the same, so the others would teach the old rule."""
    from dynamic_bench import get_domain
    from evolve.training_rows import rehearsal_examples

    d = get_domain("retail")
    v1, v2 = d.versions[1], d.versions[2]
    kept = rehearsal_examples("retail", 0, 60, 0, v2)
    unfiltered = rehearsal_examples("retail", 0, 60, 0, None)
    assert len(unfiltered) == 60 and {e.kind for e in unfiltered} == {"plain"}
    assert 0 < len(kept) < 60 and all(e.meta["params"]["rules"] == v1 for e in kept)
    assert all(d.same_answer(e.meta["params"], v1, v2) for e in kept)
    assert [e.meta["task_id"] for e in kept] == [e.meta["task_id"] for e in unfiltered
                                                 if d.same_answer(e.meta["params"], v1, v2)]
    assert len(rehearsal_examples("retail", 5, 60, 0, v2)) == 5 + len(kept)
