"""What the two RL benchmarks (bench_async_rl, bench_rl_shift) share: the policy they train and the
retail silent-shift task sets. A sibling module: each benchmark runs as a script, so its folder is
on sys.path and `from rl_bench_tasks import ...` finds this file."""
from __future__ import annotations

import random
from pathlib import Path


def policy_dir(model: str | None, cache: Path, seed: int) -> str:
    """The policy to train: `--model`, else a cached cold start of the tiny preset (built once)."""
    if model:
        return model
    from training.coldstart import ensure_coldstart

    return str(ensure_coldstart(cache / "coldstart-tiny", "tiny", seed, progress=False))


def silent_tasks(n: int, seed: int, split: str, new: bool) -> list:
    """Retail tasks under v2 shown as v1 (silent shift), or v1 tasks of scoped-out users whose
    right actions v2 leaves alone. Why only those: a scoped-out user sees the same policy text as
    everyone else, so on a task where v1 and v2 disagree one prompt cannot be right for both, and
    its loss measures the shift, not forgetting (the evolve gate's old-rule slice does the same)."""
    from dynamic_bench.domains import get_domain
    from dynamic_bench.tasks import make_task

    d = get_domain("retail")
    rng = random.Random(f"bench_rl_shift/{seed}/{split}/{new}")
    if new:
        return [make_task(d, rng, rule_version=2, split=split, shown=(1, d.versions[1])) for _ in range(n)]
    out: list = []
    while len(out) < n:
        t = make_task(d, rng, rule_version=1, split=split)
        if d.same_answer(t.params, d.versions[1], d.versions[2]):
            out.append(t)
    return out
