"""Agent service under load: 1, 8 and 32 concurrent simulated users on loopback.

Each simulated user is an official `langgraph-sdk` client: it opens a thread on a DriftBench
task, sends its request (`runs.wait`) and approves every write the agent proposes (resuming
with `command={"resume": {"type": "accept"}}`) until the episode ends. One agent turn is one
request/response cycle as the user sees it (a run that ends in a reply or an approval request).

Figures (flat JSON keys): per level `u{N}_turn_p50_s`, `u{N}_turn_p99_s`, `u{N}_turns_per_s`,
`u{N}_policy_calls_per_s`, `u{N}_errors` (must be 0); and measured side by side in this run
(interleaved, medians), `overhead_ratio`: a one-policy-call service turn / a bare `engine.generate`
of the same kind of prompt in this process (the runtime's own overhead: HTTP, graph, checkpoints,
memory recall and writes, the trajectory ledger).

    .venv/bin/python benchmarks/bench_service.py --out bench-out/bench_service.json [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from evolve.service_proc import Service

TOKEN = "bench-token-0001"


async def user(client, seed: int, episodes: int, lat: list[float], calls: list[int], errors: list[str]) -> None:
    """One simulated user: `episodes` tasks, approving every write."""
    for ep in range(episodes):
        try:
            t = await client.threads.create(metadata={"world": "driftbench/retail-v1", "task_seed": seed * 100 + ep})
            tid, n_steps = t["thread_id"], 0
            kwargs: dict = {"input": {"messages": []}}
            for _ in range(20):
                t0 = time.perf_counter()
                out = await client.runs.wait(tid, "agent", **kwargs)
                lat.append(time.perf_counter() - t0)
                if "__error__" in out:
                    errors.append(str(out["__error__"]))
                    break
                steps = len(out.get("steps", []))
                calls.append(steps - n_steps)
                n_steps = steps
                if "__interrupt__" not in out:
                    break
                kwargs = {"command": {"resume": {"type": "accept", "args": None}}}
        except Exception as e:  # every failure is counted, none is hidden
            errors.append(f"{type(e).__name__}: {e}")


async def level(url: str, n_users: int, episodes: int) -> dict[str, float]:
    from langgraph_sdk import get_client

    clients = [get_client(url=url, api_key=TOKEN, timeout=600) for _ in range(n_users)]
    lat: list[float] = []
    calls: list[int] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(user(c, 1000 * n_users + i, episodes, lat, calls, errors) for i, c in enumerate(clients)))
    wall = time.perf_counter() - t0
    for c in clients:
        await c.aclose()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")  # noqa: E731
    return {"turn_p50_s": q(0.50), "turn_p99_s": q(0.99), "turns": len(lat), "turns_per_s": len(lat) / wall,
            "policy_calls": sum(calls), "policy_calls_per_s": sum(calls) / wall,
            "s_per_policy_call": sum(lat) / max(1, sum(calls)), "errors": len(errors), "wall_s": wall,
            "error_samples": errors[:3]}


class BareEngine:
    """The same engine in this process, called directly on a first-turn prompt of a task."""

    def __init__(self, policy: str, max_new_tokens: int, threads: int):
        import torch

        import dynamic_bench
        from runtime import scaffolds
        from training.engines import SamplingParams, make_engine
        from training.policy import stop_token_ids

        torch.set_num_threads(threads)  # as the server's engine (its /healthz says how many)
        self.eng = make_engine(policy)
        self.env = dynamic_bench.make("driftbench/retail-v1", user_simulation=False)
        self.sc, self.Context = scaffolds.get("direct"), scaffolds.Context
        self.params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids(self.eng.tokenizer))

    def call(self, seed: int) -> float:
        obs, info = self.env.reset(seed=seed)
        ctx = self.Context(policy_text=info["policy_text"], tools=info["tools"],
                           history=[("user", obs.removeprefix("user: "))])
        ids = self.sc.encode_prompt(self.eng.tokenizer, ctx)
        t0 = time.perf_counter()
        self.eng.generate([ids], self.params)
        return time.perf_counter() - t0


async def overhead(url: str, bare: BareEngine, n: int) -> dict[str, float]:
    """Interleaved, so both see the same machine load: a one-policy-call service turn (thread,
    recall, act, reply, memory and ledger writes, checkpoints, HTTP) vs a bare engine call."""
    from langgraph_sdk import get_client

    c = get_client(url=url, api_key=TOKEN, timeout=600)
    svc, raw = [], []
    for i in range(n + 1):
        t = await c.threads.create(metadata={"world": "driftbench/retail-v1", "task_seed": 90_000 + i})
        t0 = time.perf_counter()
        out = await c.runs.wait(t["thread_id"], "agent", input={"messages": []},
                                config={"configurable": {"max_turns": 1}})
        dt = time.perf_counter() - t0
        b = bare.call(90_000 + i)
        if i and "__error__" not in out:  # the first pair warms both paths up
            svc.append(dt)
            raw.append(b)
    await c.aclose()
    s_med, b_med = statistics.median(svc), statistics.median(raw)
    return {"service_turn_1call_s": s_med, "bare_engine_call_s": b_med, "overhead_ratio": s_med / b_med}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="one short episode per user (about a minute)")
    ap.add_argument("--engine", default=None, help="torch:DIR etc. (default: the tiny cold-start policy)")
    ap.add_argument("--work-dir", default="runs/bench_service")
    ap.add_argument("--users", default="1,8,32")
    args = ap.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    engine = args.engine
    if engine is None:
        from training.coldstart import ensure_coldstart

        engine = "torch:" + str(ensure_coldstart(work / "policy-tiny", "tiny", seed=0, progress=False))
    max_turns, max_new = (2, 24) if args.quick else (6, 48)
    episodes = 1 if args.quick else 3
    levels = [int(x) for x in args.users.split(",")]
    data = work / f"data-{int(time.time())}"
    svc = Service(data, engine, f"{TOKEN}=bench", "--max-turns", str(max_turns), "--max-new-tokens", str(max_new))
    url = svc.start().url
    out: dict = {"quick": args.quick, "engine": engine, "max_turns": max_turns, "max_new_tokens": max_new,
                 "episodes_per_user": episodes, "cpus": os.cpu_count()}
    try:
        asyncio.run(level(url, 1, 1))  # warm-up (first-call costs are not load)
        for n in tqdm(levels, desc="users"):
            r = asyncio.run(level(url, n, episodes))
            out.update({f"u{n}_{k}": v for k, v in r.items()})
        threads = httpx.get(url + "/healthz").json()["torch_threads"]
        out.update(asyncio.run(overhead(url, BareEngine(engine, max_new, threads), 4 if args.quick else 12)))
        out["errors"] = sum(out.get(f"u{n}_errors", 0) for n in levels)
        out["metrics_excerpt"] = [ln for ln in httpx.get(url + "/metrics").text.splitlines()
                                  if ln.startswith(("evolve_agent_turn_seconds_sum", "evolve_agent_turn_seconds_count",
                                                    "evolve_runs_total"))]
    finally:
        svc.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}, indent=2))
    if out["errors"]:
        sys.exit(f"{out['errors']} errors under load")


if __name__ == "__main__":
    main()
