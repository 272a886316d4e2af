"""Cold-start SFT data: DriftBench oracle episodes rendered by the scaffolds, with diversity.

Each example is a list of text segments (the same segments a rollout produces) with a flag
saying which ones are training targets (completions). Kinds of episodes:

- `plain`: first-rule tasks, no memory (the default behaviour).
- `distractor`: first-rule tasks with memory items that change nothing (notes of the other
  domain, or restating the rules in force): the model must not follow every note blindly.
- `memory`: a silent shift (the policy shown is version 1), a retrieved memory item states what
  changed (`rule_change_notes`), and the oracle acts under the rules in force, so the right action
  follows the memory. Half the shifts go to the domain's named later versions (the changes a stream
  brings), half to densely drawn values (PROTOTYPE-FINDINGS 3: unseen values are only followed if
  the value space is covered densely; held-out dense values are measured separately).
- `announced`: dense rule values shown in the policy itself, no memory (read the numbers).

Across kinds: both scaffolds, the oracle's seeded alternative action orders, both observation
styles (simulated user on/off), and failures followed by corrections (a malformed or wrong call,
its error observation, then the right action; the failed completion is not a target).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from dynamic_bench import OracleAgent, get_domain, make
from dynamic_bench.domains import DOMAINS
from dynamic_bench.streams import rule_change_notes
from dynamic_bench.tasks import make_task
from runtime.scaffolds import get, pack_notes

DECISION = 2  # loss-mask value of a decision completion; other completions are 1, context 0
KIND_WEIGHTS = {"plain": 0.40, "distractor": 0.10, "memory": 0.38, "announced": 0.12}
NAMED_SHIFT_SHARE = 0.5  # share of `memory` examples whose shift is to a named later version


@dataclass
class Example:
    """One SFT episode: segments `(text, is_target)`, plus what it is for bookkeeping."""

    segments: list[tuple[str, bool]]
    domain: str
    kind: str
    scaffold: str
    corrected: bool = False
    meta: dict = field(default_factory=dict)
    decisions: tuple[int, ...] = ()  # target segments that act on the rules (not a read): see DECISION


def memory_notes(domain: str, rules: dict, rng: random.Random) -> list[str]:
    """What retrieved memory would say about `rules` vs version 1 (shuffled, maybe a distractor), in
    the phrasings the runtime's memory holds: bare statements, mined rules (`Rule: ...`, evolve/
    mining.py) or rejection reasons as written online (`The user said: no. a; b`, runtime/agent_io.py).
    Packed into at most `MAX_MEMORY_ITEMS` items of at most `MAX_ITEM_CHARS`: a prompt shows no more,
    and an example whose rule is cut off would teach acting on rules nobody stated."""
    notes = rule_change_notes(domain, 1, rules)
    if rng.random() < 0.25:
        notes.append(rng.choice(distractor_notes(domain)))
    rng.shuffle(notes)
    style = rng.random()
    if style < 0.25:
        notes = [f"Rule: {n}." for n in notes]
    return pack_notes(notes, prefix="The user said: no. " if 0.25 <= style < 0.5 else "")


def distractor_notes(domain: str) -> list[str]:
    """Notes that change nothing for a first-rule task of `domain`: the other domain's changes,
    or statements of version 1's own values."""
    others = [d for d in DOMAINS if d != domain]
    out = [n for o in others for v in sorted(get_domain(o).versions)[1:] for n in rule_change_notes(o, 1, v)]
    d = get_domain(domain)
    v1 = d.versions[1]
    out += [note(v1).replace(" now ", " ") for _, note in d.change_notes]
    return out or ["no changes recorded"]


def bad_action(action: str, rng: random.Random) -> str:
    """A plausible wrong call for a correction example: malformed JSON, a misspelt tool, a wrong id."""
    name, _, args = action.partition(" ")
    choice = rng.randrange(3)
    if choice == 0 and len(args) > 2:
        return f"{name} {args[:-1]}"
    if choice == 1:
        return f"{name}s {args}"
    digits = [i for i, c in enumerate(args) if c.isdigit()]
    if not digits or name == "reply":
        return f"{name} {args[:-1]}"
    i = rng.choice(digits)
    return f"{name} {args[:i]}{(int(args[i]) + 1) % 10}{args[i + 1:]}"


def plan_line(remaining: list[str], needed_reads: set[str]) -> str:
    """The plan an agent can know now: the reads still needed, then `decide`, until the facts are
    in; after that, the remaining actions by name (the decision made)."""
    names = [a.split(" ", 1)[0] for a in remaining]
    if any(a in needed_reads for a in remaining):
        reads = [a.split(" ", 1)[0] for a in remaining if a in needed_reads]
        return " > ".join(reads + ["decide", "reply"])
    return " > ".join(names) or "reply"


def make_task_for(domain: str, kind: str, rng: random.Random, split: str = "train"):
    """(task, memory notes) of one example kind."""
    d = get_domain(domain)
    if kind in ("plain", "distractor"):
        task = make_task(d, rng, rule_version=1, split=split)
        notes = [rng.choice(distractor_notes(domain))] if kind == "distractor" else []
        return task, notes
    later = d.changed_versions()
    named = kind == "memory" and later and rng.random() < NAMED_SHIFT_SHARE
    rules = d.rules_for(rng.choice(later)) if named else d.random_rules(rng)
    if kind == "memory":
        task = make_task(d, rng, rule_version=rules, split=split, shown=(1, d.versions[1]))
        return task, memory_notes(domain, rules, rng)
    return make_task(d, rng, rule_version=rules, split=split), []


def oracle_example(domain: str, kind: str, scaffold: str, rng: random.Random, correct_p: float = 0.15,
                   max_steps: int = 10) -> Example | None:
    """Run the seeded oracle on one task and render it; None if the episode did not succeed."""
    sc = get(scaffold)
    task, notes = make_task_for(domain, kind, rng)
    env = make(f"driftbench/{domain}-v1", max_steps=max_steps)
    obs, info = env.reset(seed=rng.randrange(1 << 30),
                          options={"task": task, "user_simulation": rng.random() < 0.5})
    agent = OracleAgent(seed=rng.randrange(1 << 30))
    agent.reset(obs, info)
    user = obs[len("user: "):] if obs.startswith("user: ") else obs
    segs: list[tuple[str, bool]] = [(sc.header_text(info["policy_text"], info["tools"], notes), False),
                                    (sc.user_text(user), False)]
    fix_at = rng.randrange(len(agent.plan)) if rng.random() < correct_p else -1
    from dynamic_bench.actions import format_action

    needed_calls, optional_calls = get_domain(domain).reads(task.params, task.params["rules"])
    needed = {format_action(c) for c in needed_calls}
    reads = needed | {format_action(c) for c in optional_calls}
    decisions: list[int] = []
    done, t = False, 0
    while not done:
        plan = plan_line(agent.plan, needed)
        if t == fix_at:
            bad = bad_action(agent.plan[0], rng)
            obs, _, term, trunc, info = env.step(bad)
            if term or trunc or not obs.startswith("error"):
                return None  # the wrong call did something: not a clean correction example
            segs += [(sc.completion_text(bad, plan), False), (sc.obs_text(obs), False)]
            fix_at = -1
            continue
        action = agent.act(obs, info)
        obs, _, term, trunc, info = env.step(action)
        done = term or trunc
        if action not in reads:
            decisions.append(len(segs))
        segs.append((sc.completion_text(action, plan), True))
        if not done:
            segs.append((sc.obs_text(obs), False))
        t += 1
    if not info["verdict"]["success"]:
        return None
    return Example(segs, domain, kind, scaffold, corrected=any(not tgt and i > 1 and i % 2 == 0
                                                              for i, (_, tgt) in enumerate(segs)),
                   meta={"task_id": task.id, "memory": notes, "params": task.params}, decisions=tuple(decisions))


def generate_examples(n: int, seed: int, domains: tuple[str, ...] = tuple(DOMAINS),
                      kind_weights: dict[str, float] | None = None, correct_p: float = 0.15) -> list[Example]:
    """`n` successful oracle examples spread over domains, kinds and scaffolds (seeded)."""
    rng = random.Random(f"coldstart/{seed}")
    weights = kind_weights or KIND_WEIGHTS
    kinds, w = list(weights), list(weights.values())
    out: list[Example] = []
    while len(out) < n:
        i = len(out)
        ex = oracle_example(domains[i % len(domains)], rng.choices(kinds, w)[0],
                            ("direct", "plan_act")[(i // len(domains)) % 2], rng, correct_p)
        if ex is not None:
            out.append(ex)
    return out


def corpus_texts(n: int = 1500, seed: int = 0) -> list[str]:
    """DriftBench text for training the tokenizer: rendered episodes (policy texts, tool
    signatures of every tool set, observations, actions, memory notes) of both scaffolds."""
    texts = ["".join(s for s, _ in ex.segments) for ex in generate_examples(n, seed=10_000 + seed, correct_p=0.3)]
    for name in DOMAINS:
        d = get_domain(name)
        for ts in d.tool_sets.values():
            texts.append("\n".join(s.signature() for s in ts.specs.values()))
        for v in d.versions:
            texts.append(d.policy_text(v))
    return texts


def _encoded_segments(ex: Example, tokenizer) -> list[list[int]]:
    sc = get(ex.scaffold)
    return [sc.encode(tokenizer, text, first=(j == 0)) for j, (text, _) in enumerate(ex.segments)]


def example_steps(ex: Example, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of each target segment, the prompt being every segment before
    it: the rows a rollout of the same episode gives, encoded as `encode_example` encodes them."""
    out: list[tuple[list[int], list[int]]] = []
    ids: list[int] = []
    for seg, (_, target) in zip(_encoded_segments(ex, tokenizer), ex.segments):
        if target:
            out.append((list(ids), seg))
        ids += seg
    return out


def encode_example(ex: Example, tokenizer) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of an example, segment by segment exactly as a rollout encodes it. The mask
    is 0 on context, 1 on completions, `DECISION` on completions that act on the rules (the
    coldstart loss weights those up: the reads and ids are easy, the decision is what fails)."""
    ids: list[int] = []
    mask: list[int] = []
    for j, (seg, (_, target)) in enumerate(zip(_encoded_segments(ex, tokenizer), ex.segments)):
        ids += seg
        mask += [DECISION if j in ex.decisions else int(target)] * len(seg)
    return ids, mask
