"""RL after a silent rule shift (customer service), from the cold-start policy, without memory.

The retail rules move from v1 to v2 silently: the agent is still shown the v1 policy text, only
rewards and the simulated users' corrections reveal the change. Some users are scoped out of the
shift and keep v1. Two RL runs side by side in one process, both with action-level exploration and
corrections as supervised signal (PROTOTYPE-FINDINGS 4): without replay, and with a replay share of
v1 tasks (PROTOTYPE-FINDINGS 5). Reported: greedy success on held-out new-rule tasks over learner
steps and wall-clock, steps (and seconds) to reach 90%, and forgetting = success on held-out
old-rule (scoped-out) tasks whose answer v2 did not change, before RL minus after. Target: new-rule
success >= 90% within 30 minutes with <= 3 points forgetting; the figures say what this machine reaches.

    .venv/bin/python benchmarks/bench_rl_shift.py --out bench-out/bench_rl_shift.json [--quick] [--model DIR]
        [--device cuda] [--minutes M]

`--device` is where the learner and the rollout engines run (recorded with the GPU's name);
`--minutes` caps the learner steps' wall-clock, shared evenly by the arms (each arm stops after the
step that crosses its share, then scores its held-out sets once more), so a run fits a time budget.

Figures mean something with `--model runs/bench_cold_start/small/policy` (the demo's policy): the
default tiny cold start (20 SFT steps, built in seconds for the smoke test) solves no task, so its
arms train on all-equal groups and report 0 (measured: 18 steps, held-out success 0.0).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from rl_bench_tasks import policy_dir, silent_tasks
from tqdm import tqdm

TARGET_SUCCESS = 0.9
TARGET_FORGET_PTS = 3.0
TARGET_MINUTES = 30.0


def run(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(2)
    from dynamic_bench.tasks import old_rules_fail  # what the shift changes: acting on v1 is wrong
    from training.rl.trainer import RLConfig, TaskPool, read_metrics, train_rl

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_rl_shift_"))
    model = policy_dir(args.model, Path(args.cache), args.seed)
    new_train = silent_tasks(args.tasks, args.seed, "train", new=True)
    old_train = silent_tasks(args.tasks, args.seed, "train", new=False)
    heldout = {"new": silent_tasks(args.heldout, args.seed, "test", new=True),
               "old": silent_tasks(args.heldout, args.seed, "test", new=False)}
    base = RLConfig(model=model, steps=args.steps, groups_per_step=args.groups, group_size=args.group_size,
                    n_workers=args.workers, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                    explore_eps=args.explore_eps, sft_coef=args.sft_coef, kl_coef=args.kl_coef, lr=args.lr,
                    ppo_epochs=args.ppo_epochs,
                    experience_per_step=args.experience,
                    eval_every=args.eval_every, eta=args.eta, seed=args.seed, checkpoint_every=10**6,
                    progress=False, resume=False, device=args.device)
    gpu = {"gpu": torch.cuda.get_device_name(torch.device(args.device))} if args.device.startswith("cuda") else {}
    res: dict = {"model": model, "steps": args.steps, "quick": bool(args.quick), "cpu_count": os.cpu_count(),
                 "device": args.device, "minutes": args.minutes,
                 "new_rule_affected_share": sum(map(old_rules_fail, heldout["new"])) / max(len(heldout["new"]), 1),
                 **gpu}
    curves = {}
    arms = {a: s for a, s in {"no_replay": 0.0, "replay": args.replay_share}.items() if a in args.arms.split(",")}
    if not arms:
        raise SystemExit(f"--arms {args.arms!r}: choose from no_replay, replay")
    for arm, share in tqdm(arms.items(), desc="arms"):
        pool = TaskPool(tasks={t.id: t for t in new_train}, heldout=heldout)
        if share:
            pool.tasks.update({t.id: t for t in old_train})
            pool.replay = {t.id for t in old_train}
        cfg = RLConfig(**{**base.__dict__, "out_dir": str(work / arm), "replay_share": share,
                          "max_minutes": args.minutes / len(arms)})
        train_rl(cfg, pool=pool)
        rows = read_metrics(work / arm)
        # the run scores the policy before its first update (same engine seed in every arm)
        before = {k: rows[0][f"heldout_{k}_start"] for k in heldout}
        res["new_success_before"], res["old_success_before"] = before["new"], before["old"]
        pts = [(0, 0.0, before["new"], before["old"])] + [
            (r["step"], r["wall_s"], r["heldout_new"], r["heldout_old"]) for r in rows if "heldout_new" in r]
        curves[arm] = pts
        hit = next((p for p in pts if p[2] >= TARGET_SUCCESS), None)
        final = pts[-1]
        res[f"{arm}_new_success_final"] = final[2]
        res[f"{arm}_old_success_final"] = final[3]
        res[f"{arm}_forgetting_pts"] = 100 * (before["old"] - final[3])
        res[f"{arm}_steps_to_90"] = hit[0] if hit else None
        res[f"{arm}_seconds_to_90"] = hit[1] if hit else None
        res[f"{arm}_wall_s"] = rows[-1]["wall_s"] if rows else 0.0
        res[f"{arm}_steps_done"] = rows[-1]["step"] if rows else 0
        res[f"{arm}_train_reward_final"] = rows[-1]["reward_mean"] if rows else 0.0
        res[f"{arm}_sft_rows"] = sum(r.get("sft_rows", 0) for r in rows)
        res[f"{arm}_zero_var_frac"] = sum(r["zero_var_frac"] for r in rows) / max(len(rows), 1)
        res[f"{arm}_diagnosis"] = (work / arm / "diagnosis.txt").read_text().strip()
        res[f"{arm}_meets_target"] = bool(hit and hit[1] <= 60 * TARGET_MINUTES
                                          and res[f"{arm}_forgetting_pts"] <= TARGET_FORGET_PTS)
    res["meets_target"] = any(res[f"{a}_meets_target"] for a in arms)
    curves_file = Path(args.out).with_suffix(".curves.json")
    curves_file.parent.mkdir(parents=True, exist_ok=True)
    curves_file.write_text(json.dumps({a: [dict(zip(("step", "wall_s", "new", "old"), p)) for p in v]
                                       for a, v in curves.items()}, indent=1))
    res["curves_file"] = str(curves_file)
    res["plot"] = str(plot(curves, Path(args.out).with_suffix(".png")))
    return res


def plot(curves: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for arm, pts in curves.items():
        axes[0].plot([p[0] for p in pts], [p[2] for p in pts], marker=".", label=f"{arm}: new rules")
        axes[0].plot([p[0] for p in pts], [p[3] for p in pts], ls="--", marker=".", label=f"{arm}: old rules")
        axes[1].plot([p[1] for p in pts], [p[2] for p in pts], marker=".", label=f"{arm}: new rules")
    axes[0].axhline(TARGET_SUCCESS, color="grey", lw=0.8)
    axes[1].axhline(TARGET_SUCCESS, color="grey", lw=0.8)
    axes[0].set_xlabel("learner step")
    axes[1].set_xlabel("wall-clock (s)")
    axes[0].set_ylabel("held-out greedy success")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.suptitle("RL after a silent retail rule shift (no memory)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="about a minute: a few steps, small eval sets")
    ap.add_argument("--model", default=os.environ.get("EVOLVE_POLICY"), help="policy folder (default: tiny cold start)")
    ap.add_argument("--cache", default="runs/bench")
    ap.add_argument("--work", default=None)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--eta", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=256, help="new-rule training tasks (and as many replay tasks)")
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--explore-eps", type=float, default=0.05)
    ap.add_argument("--sft-coef", type=float, default=1.0)
    ap.add_argument("--experience", type=int, default=32, help="kept corrections redrawn into each step")
    ap.add_argument("--kl-coef", type=float, default=0.05)
    ap.add_argument("--replay-share", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--ppo-epochs", type=int, default=4, help="optimizer steps per batch (proximal policy frozen)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="no_replay,replay", help="which arms to run (comma-separated)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where the learner and the rollout engines run")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="wall-clock cap on the learner steps of all arms together (0: --steps only)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.groups, args.group_size, args.tasks, args.heldout = 1, 1, 2, 2, 2
        args.eval_every, args.max_turns, args.max_new_tokens, args.workers = 1, 2, 12, 1
    res = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    for k in sorted(res):
        if not k.endswith("diagnosis"):
            print(f"{k}: {res[k]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
