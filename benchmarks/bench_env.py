"""DriftBench environment speed: oracle-agent env steps per second on one core.

The environment must never be the bottleneck of training (target: >= 5,000 steps/s on one
core). Measured side by side in one run: each domain with simulated users (personas answer
writes) and in the runtime's mode (no user simulation), plus how fast streams are generated.

    .venv/bin/python benchmarks/bench_env.py --out bench-out/bench_env.json [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tqdm import tqdm

from dynamic_bench import BENCH_VERSION, DOMAINS, OracleAgent, make, make_stream, run_episode

TARGET = 5000


def pin_one_core() -> int | None:
    """Pin this process to one core, so the figure is per core; None where not supported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def oracle_speed(domain: str, n_episodes: int, user_simulation: bool, seed: int = 0) -> dict[str, float]:
    """Steps/s of reset + agent + step over `n_episodes` oracle episodes of a mixed stream.

    Both wall-clock and CPU-time rates: on a shared machine the wall clock counts time other
    processes held the core, so the per-core figure is steps per CPU second of this process."""
    stream = make_stream("mixed", domain, n_episodes, seed)  # generated before the clock starts
    env, agent = make(f"driftbench/{domain}-v1"), OracleAgent(seed=seed)
    steps = ok = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for ep in stream.episodes:
        r = run_episode(env, agent, ep.task, seed=ep.seed, user_simulation=user_simulation)
        steps += r["n_steps"]
        ok += r["success"]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert ok == n_episodes, "the oracle must solve every episode"
    return {"steps_per_s": steps / cpu, "wall_steps_per_s": steps / dt, "episodes_per_s": n_episodes / cpu,
            "steps_per_episode": steps / n_episodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="fewer episodes (about 10 seconds)")
    ap.add_argument("--episodes", type=int, default=None)
    args = ap.parse_args()
    n = args.episodes or (2000 if args.quick else 20000)
    cpu = pin_one_core()
    res: dict[str, object] = {"bench_version": BENCH_VERSION, "episodes_per_run": n, "pinned_cpu": cpu,
                              "target_steps_per_s": TARGET}
    for domain in tqdm(sorted(DOMAINS), desc="domains"):
        sim = oracle_speed(domain, n, user_simulation=True)
        raw = oracle_speed(domain, n, user_simulation=False)
        res[f"oracle_steps_per_s_{domain}"] = round(sim["steps_per_s"])  # per CPU second on one core
        res[f"oracle_wall_steps_per_s_{domain}"] = round(sim["wall_steps_per_s"])
        res[f"oracle_episodes_per_s_{domain}"] = round(sim["episodes_per_s"])
        res[f"steps_per_episode_{domain}"] = round(sim["steps_per_episode"], 2)
        res[f"runtime_mode_steps_per_s_{domain}"] = round(raw["steps_per_s"])
        res[f"user_sim_vs_runtime_mode_ratio_{domain}"] = round(sim["steps_per_s"] / raw["steps_per_s"], 3)
        c0 = time.process_time()
        make_stream("mixed", domain, n, 1)
        res[f"stream_episodes_generated_per_s_{domain}"] = round(n / (time.process_time() - c0))
    res["oracle_steps_per_s"] = min(res[f"oracle_steps_per_s_{d}"] for d in DOMAINS)  # type: ignore[type-var]
    res["meets_target"] = res["oracle_steps_per_s"] >= TARGET  # type: ignore[operator]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
