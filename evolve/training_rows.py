"""The train stage's supervised input: the experience stage's files as rows, and rehearsal.

Kept apart from `evolve.stages` (which decides *when* each stage runs) because these decide *what*
a candidate is trained on besides its own rollouts: the users' approved steps and corrections,
the memory-free copies that turn memory into weights, and the cold-start episodes it rehearses.
"""
from __future__ import annotations

from pathlib import Path

from evolve.report import read_jsonl


def logged_experience(exp_dir: Path, policy: Path, distill_memory: bool = True, distill_focus: bool = False,
                      corrections_with_memory: bool = True) -> tuple[list, list, list]:
    """The experience stage's files as training input: SFT rows (approved successes, with their
    sampled ids; corrections, the user's action as the target; the memory-distilled rows, unless
    `distill_focus` puts them in the second list, `TaskPool.sft_focus`) and DPO preference pairs. With
    `distill_memory`, every row whose prompt showed retrieved memory is also given once with the
    memory section emptied (same target): what memory taught becomes weights (`without_memory`).
    Without `corrections_with_memory`, a user's correction (and its preference pair) is given only
    with the memory section emptied (`CycleConfig.corrections_with_memory`)."""
    from runtime.scaffolds import without_memory
    from training.policy import load_tokenizer
    from training.rl.learner import PrefPair, Row
    from training.rl.runner import action_target_ids

    tok = load_tokenizer(policy)
    sft = [Row(r["prompt_token_ids"], r["completion_token_ids"], [], sft=True)
           for r in read_jsonl(exp_dir / "sft.jsonl")]

    def corrected(prompt: list[int]) -> list[int]:
        return prompt if corrections_with_memory else (without_memory(tok, prompt) or prompt)

    sft += [Row(corrected(r["prompt_token_ids"]), action_target_ids(tok, r["action_text"]), [], sft=True)
            for r in read_jsonl(exp_dir / "corrections.jsonl")]
    distilled = [Row(r["prompt_token_ids"], r["completion_token_ids"], [], sft=True)  # memory emptied, but for
                 for r in read_jsonl(exp_dir / "distilled.jsonl")]                  # memory anchors (evolve.distill)
    if not distill_focus:
        sft, distilled = sft + distilled, []
    pairs = [PrefPair(r["prompt_token_ids"] if "chosen_token_ids" in r else corrected(r["prompt_token_ids"]),
                      r.get("chosen_token_ids") or action_target_ids(tok, r["chosen_text"]), r["rejected_token_ids"])
             for r in read_jsonl(exp_dir / "pairs.jsonl")]  # chosen ids: approved vs rejected, not a correction
    if distill_memory:
        bare = [(without_memory(tok, r.prompt_ids), r) for r in sft]
        sft += [Row(p, r.completion_ids, [], sft=True) for p, r in bare if p is not None]
        bare_pairs = [(without_memory(tok, q.prompt_ids), q) for q in pairs]
        pairs += [PrefPair(p, q.chosen_ids, q.rejected_ids) for p, q in bare_pairs if p is not None]
    return sft, distilled, pairs


def rehearsal_examples(domain: str, n_memory: int, n_old_rules: int, seed: int, latest_rules: dict | None) -> list:
    """Seeded cold-start oracle episodes (training.sft_data) a candidate rehearses while it learns
    the new rules (`TaskPool.rehearsal`): `n_memory` of the `memory` kind (a recalled memory item
    states a rule the shown policy does not, and the right action follows it) and, of `n_old_rules`
    first-rule episodes without memory (`plain`), those whose right actions `latest_rules` keep
    (`same_answer`: the others would teach the old rule on the new rules' prompt after a silent shift).

    Why: the rows a cycle learns from are the new rules, with or without the memory that states
    them. Rehearsing the memory kind cut old-rule forgetting by 3.0 points on build D's seed-1 demo
    (6.5 -> 3.5, and 3.5 -> 0.5 before one-path strategies); the first-rule episodes the shift left
    right are what the gate's old-rule slice asks (see CycleConfig.rehearsal_old_rule_examples)."""
    from dynamic_bench import get_domain
    from training.sft_data import generate_examples

    d = get_domain(domain)
    out = generate_examples(n_memory, seed=30_000 + seed, domains=(domain,), kind_weights={"memory": 1.0}) if n_memory else []
    plain = generate_examples(n_old_rules, seed=40_000 + seed, domains=(domain,),
                              kind_weights={"plain": 1.0}) if n_old_rules else []
    return out + [ex for ex in plain if latest_rules is None
                  or d.same_answer(ex.meta["params"], ex.meta["params"]["rules"], latest_rules)]


def rehearsal_rows(policy: Path, examples: list) -> list:
    """Each example's steps as supervised rows (`example_steps`: what a rollout of it would give)."""
    from training.policy import load_tokenizer
    from training.rl.learner import Row
    from training.sft_data import example_steps

    tok = load_tokenizer(policy)
    return [Row(p, c, [], sft=True) for ex in examples for p, c in example_steps(ex, tok)]
