"""Judging a cold-start policy by more than accuracy (used by `evolve train coldstart` and the bench).

Per domain: pass@1 (greedy and sampled), pass@k (k samples per task), format-valid action rate,
action-space coverage (share of the tools and `reply` used validly at least once), the number of
distinct successful strategies (distinct tool-name sequences among successes), and success when
a retrieved memory item correctly states a changed rule (named later versions, shown policy v1:
a silent shift) overall, on the tasks where the change alters the right actions, and on held-out
dense rule values.
"""
from __future__ import annotations

import random
from typing import Sequence

from dynamic_bench import generate_tasks, get_domain
from dynamic_bench.streams import rule_change_notes
from dynamic_bench.tasks import make_task, old_rules_fail
from runtime.scaffolds import pack_notes
from training.rollout import RolloutConfig, rollout


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    p = 1.0
    for i in range(n - c + 1, n + 1):
        p *= 1.0 - k / i
    return 1.0 - p


def memory_tasks(domain: str, n: int, seed: int, dense: bool = False, split: str = "test"):
    """(tasks, notes, affected flags): changed-rule tasks of `split` shown v1, with a correct memory
    item. The benchmark uses the test split; the cold start's quality check uses train-split tasks."""
    d = get_domain(domain)
    rng = random.Random(f"memeval/{domain}/{seed}/{dense}" + ("" if split == "test" else f"/{split}"))
    later = d.changed_versions()
    tasks, notes, affected = [], [], []
    for i in range(n):
        version = d.random_rules(rng) if dense else later[i % len(later)]
        rules = d.rules_for(version)
        t = make_task(d, rng, rule_version=version, split=split, shown=(1, d.versions[1]))
        tasks.append(t)
        notes.append(pack_notes(rule_change_notes(domain, 1, rules)))  # all of it fits the prompt
        affected.append(old_rules_fail(t, older=[d.versions[1]]))  # vs the policy it is shown
    return tasks, notes, affected


def memory_following(engine, tokenizer, domain: str, n: int, seed: int, dense: bool = False, split: str = "test",
                     rollout_cfg: RolloutConfig | None = None) -> dict[str, float]:
    """Greedy success on `memory_tasks`: overall, on the tasks the change affects, valid-action rate."""
    cfg = rollout_cfg or RolloutConfig(temperature=0.0, seed=seed)
    mt, notes, aff = memory_tasks(domain, n, seed, dense=dense, split=split)
    m = rollout(engine, tokenizer, mt, cfg, memory=notes)
    ok = [t.outcome == "success" for t in m]
    hit = [o for o, a in zip(ok, aff) if a]
    valid, total, _ = _valid_and_tools(m)
    return {"success": sum(ok) / len(ok), "success_affected": sum(hit) / len(hit) if hit else float("nan"),
            "valid_action_rate": valid / max(1, total)}


def _valid_and_tools(trajs) -> tuple[int, int, set[str]]:
    valid = total = 0
    used: set[str] = set()
    for t in trajs:
        for ok, s in zip(t.metadata["valid_actions"], t.steps):
            total += 1
            valid += int(ok)
            if ok and s.action:
                used.add(s.action["name"])
    return valid, total, used


def evaluate(engine, tokenizer, domains: Sequence[str] = ("retail", "telecom"), n_tasks: int = 20, k: int = 8,
             n_memory: int = 20, seed: int = 0, scaffold: str = "direct", temperature: float = 1.0,
             max_new_tokens: int = 48, max_steps: int = 10) -> dict:
    """Flat metrics dict `{domain}/{metric}`, plus the mean over domains (`all/{metric}`) and the
    worst domain (`min/{metric}`)."""
    out: dict[str, float] = {}
    greedy = RolloutConfig(scaffold=scaffold, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed,
                           max_steps=max_steps)
    sampled = RolloutConfig(scaffold=scaffold, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                            max_steps=max_steps)
    for dom in domains:
        tasks = generate_tasks(dom, n_tasks, seed=seed, split="test", rule_version=1)
        g = rollout(engine, tokenizer, tasks, greedy)
        s = rollout(engine, tokenizer, tasks, sampled, group_size=k)
        out[f"{dom}/pass@1_greedy"] = sum(t.outcome == "success" for t in g) / len(g)
        per_task = [s[i * k:(i + 1) * k] for i in range(len(tasks))]
        cs = [sum(t.outcome == "success" for t in grp) for grp in per_task]
        out[f"{dom}/pass@1"] = sum(pass_at_k(k, c, 1) for c in cs) / len(cs)
        out[f"{dom}/pass@{k}"] = sum(pass_at_k(k, c, k) for c in cs) / len(cs)
        valid, total, used = _valid_and_tools(g + s)
        out[f"{dom}/valid_action_rate"] = valid / max(1, total)
        space = set(get_domain(dom).tools(get_domain(dom).versions[1])) | {"reply"}
        out[f"{dom}/coverage"] = len(used & space) / len(space)
        strategies = {tuple(st.action["name"] if st.action else "?" for st in t.steps) for t in s
                      if t.outcome == "success"}
        out[f"{dom}/distinct_successful_strategies"] = float(len(strategies))
        if n_memory:
            for dense in (False, True):
                tag = "memory_heldout" if dense else "memory"
                for key, value in memory_following(engine, tokenizer, dom, n_memory, seed, dense, "test",
                                                   greedy).items():
                    out[f"{dom}/{tag}_{key}"] = value
    metrics = sorted({key.split("/", 1)[1] for key in out})
    for name in metrics:
        vals = [out[f"{d}/{name}"] for d in domains if f"{d}/{name}" in out and out[f"{d}/{name}"] == out[f"{d}/{name}"]]
        if vals:
            out[f"all/{name}"] = sum(vals) / len(vals)
            out[f"min/{name}"] = min(vals)  # the worst domain: a target met on the mean can hide one
    return out
