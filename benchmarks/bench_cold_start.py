"""Cold-start quality of the built-in policy, per domain and scaffold.

Figures (flat JSON keys): `{scaffold}/{domain}/pass@1` (sampled, T=1), `pass@1_greedy`, `pass@8`,
`valid_action_rate`, `coverage`, `distinct_successful_strategies`, `memory_success` (named later
rule versions, shown policy v1, a correct memory item), `memory_success_affected` (only tasks
whose right actions changed), `memory_heldout_success` (fresh dense rule values), the means under
`{scaffold}/all/...`, the worst domain under `{scaffold}/min/...`, the training cost, the cold
start's first and last quality checks on train-split tasks (`train_quality_first/...`,
`train_quality_last/...`), and whether each issue target is met in every domain (on the worst
one, not the mean): pass@1 >= 0.90 on first-rule test tasks, valid actions >= 0.99,
memory-following success >= 0.80.

    .venv/bin/python benchmarks/bench_cold_start.py --out cold_start.json [--quick] [--policy DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="tiny preset, a few steps and tasks (~1 minute)")
    ap.add_argument("--policy", help="evaluate this policy folder instead of building the cold start")
    ap.add_argument("--run-dir", default="runs/bench_cold_start", help="where the cold start is built/reused")
    ap.add_argument("--preset", default=None)
    ap.add_argument("--tasks", type=int, default=None, help="test tasks per domain")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    from training.coldstart import DONE, ensure_coldstart
    from training.coldstart_eval import evaluate
    from training.engines import make_engine
    from training.policy import load_tokenizer

    torch.set_num_threads(args.threads)
    quick = args.quick
    preset = args.preset or ("tiny" if quick else "small")
    n_tasks = args.tasks or (2 if quick else 50)
    k = 2 if quick else args.k
    res: dict = {"quick": quick, "preset": preset, "n_tasks_per_domain": n_tasks, "k": k}
    t0 = time.time()
    if args.policy:
        policy = Path(args.policy)
    else:
        run_dir = Path(args.run_dir) / preset
        extra = dict(max_steps=6, n_examples=60, n_corpus=60) if quick else {}
        policy = ensure_coldstart(run_dir, preset, args.seed, progress=True, num_threads=args.threads, **extra)
        done = json.loads((run_dir / DONE).read_text())
        log = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text().splitlines()]
        res.update(train_steps=done["steps"], train_examples=done["n_examples"], final_loss=done["final_loss"],
                   train_wall_s=log[-1]["elapsed_s"] if log else 0.0, train_cpu_s=log[-1].get("cpu_s", 0.0) if log else 0.0)
    res["build_or_load_s"] = round(time.time() - t0, 1)
    meta_file = policy / "evolve_policy.json"  # the cold start's own quality checks (train split), flat
    checks = json.loads(meta_file.read_text()).get("quality_checks", []) if meta_file.exists() else []
    for which, check in (("first", checks[:1]), ("last", checks[-1:])):
        res.update({f"train_quality_{which}/{key}": v for c in check for key, v in c.items()})
    engine = make_engine(f"torch:{policy}")
    tok = load_tokenizer(policy)
    t1 = time.time()
    for scaffold in ("direct", "plan_act"):
        m = evaluate(engine, tok, n_tasks=n_tasks, k=k, n_memory=n_tasks, seed=args.seed + 1000, scaffold=scaffold,
                     max_steps=3 if quick else 10, max_new_tokens=16 if quick else 48)
        res.update({f"{scaffold}/{key}": v for key, v in m.items()})
    res["eval_s"] = round(time.time() - t1, 1)
    best = max(("direct", "plan_act"), key=lambda s: res[f"{s}/all/pass@1"])
    res["best_scaffold"] = best
    res["target_pass@1_first_rule_met"] = res[f"{best}/min/pass@1"] >= 0.90
    res["target_valid_actions_met"] = res[f"{best}/min/valid_action_rate"] >= 0.99
    res["target_memory_following_met"] = res[f"{best}/min/memory_success"] >= 0.80
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True))
    for key in sorted(k_ for k_ in res if "/all/" in k_ or "/min/" in k_ or k_.startswith("target") or k_.startswith("train")):
        print(f"{key}: {res[key]}")


if __name__ == "__main__":
    main()
