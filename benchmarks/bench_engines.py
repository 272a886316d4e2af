"""Engine speed and fidelity, torch and vLLM side by side on the same policy and prompts.

Figures (flat JSON keys), for each engine E in {torch, vllm}: `E/tokens_per_s@B` for batch
sizes B (1, 8, 32, 64), `E/logprob_mismatch_mean` and `_max` (per token, engine vs HF trainer
on identical float32 weights; `_adapter` variants with a LoRA adapter loaded),
`E/hot_swap_pause_ms` (median extra latency of the first request after switching to another
adapter version, including the switch itself; target <= 50 ms), `E/hot_swap_load_ms`, and the
ratio `vllm_over_torch_tokens_per_s@B`. Prompts are real DriftBench prompts (policy, tools,
user request) of the `small` preset's tokenizer; completions are forced to full length.

    .venv/bin/python benchmarks/bench_engines.py --out engines.json [--quick] [--with-vllm] [--device cuda]

`--quick` measures the torch engine only (batch 1 and 8) unless `--with-vllm` is given: vLLM
takes 20-60 s just to start. `--device` is where the torch engine and the HF rescoring run
(recorded as `device`, with `gpu` naming the CUDA device); vLLM picks its own.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def prompts_for(tok, n: int) -> list[list[int]]:
    from dynamic_bench import generate_tasks, make
    from runtime.scaffolds import Context, get

    out = []
    tasks = generate_tasks("retail", (n + 1) // 2, seed=7) + generate_tasks("telecom", n // 2, seed=7)
    for t in tasks[:n]:
        obs, info = make(f"driftbench/{t.domain}-v1").reset(options={"task": t})
        ctx = Context(policy_text=info["policy_text"], tools=info["tools"], history=[("user", obs[6:])])
        out.append(get("direct").encode_prompt(tok, ctx))
    return out


def measure(engine, name: str, prompts, batches, new_tokens: int, model_dir: Path, adapters, res: dict,
            device: str = "cpu") -> None:
    from training.consistency import compare
    from training.engines import SamplingParams
    from training.policy import load_model

    sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)
    engine.load_adapter(None, "base")
    engine.generate(prompts[:2], sp)  # warm up
    for b in batches:
        batch = (prompts * (b // len(prompts) + 1))[:b]
        t = time.perf_counter()
        gens = engine.generate(batch, sp)
        dt = time.perf_counter() - t
        res[f"{name}/tokens_per_s@{b}"] = round(sum(len(g.token_ids) for g in gens) / dt, 1)
    gens = engine.generate(prompts[:8], sp)
    rep = compare(load_model(model_dir).to(device), prompts[:8], gens)
    res[f"{name}/logprob_mismatch_mean"], res[f"{name}/logprob_mismatch_max"] = rep.mean_abs, rep.max_abs
    engine.load_adapter(str(adapters[0]), "v1")
    gens = engine.generate(prompts[:8], sp)
    rep = compare(load_model(model_dir, adapter=adapters[0]).to(device), prompts[:8], gens)
    res[f"{name}/logprob_mismatch_mean_adapter"] = rep.mean_abs
    res[f"{name}/logprob_mismatch_max_adapter"] = rep.max_abs
    one = SamplingParams(max_new_tokens=1, temperature=0.0)
    pauses, loads = [], []
    for i in range(6):  # alternate between two adapters under fresh version names (a real version bump)
        engine.load_adapter(str(adapters[i % 2]), f"swap{i}")
        engine.generate(prompts[:1], one)  # the new version is live
        warm = min(_timed(lambda: engine.generate(prompts[:1], one)) for _ in range(3))
        t = time.perf_counter()
        engine.load_adapter(str(adapters[(i + 1) % 2]), f"swap{i}b")
        loads.append((time.perf_counter() - t) * 1000)
        first = _timed(lambda: engine.generate(prompts[:1], one))
        pauses.append(loads[-1] + max(0.0, first - warm) * 1000)
    res[f"{name}/hot_swap_pause_ms"] = round(statistics.median(pauses), 2)
    res[f"{name}/hot_swap_load_ms"] = round(statistics.median(loads), 2)
    engine.load_adapter(None, "base")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--with-vllm", action="store_true", help="include vLLM in --quick")
    ap.add_argument("--model", help="policy folder (default: a fresh `small` preset policy)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where the torch engine and the rescoring run")
    args = ap.parse_args()

    import importlib.util
    import tempfile

    import torch

    from training.engines import make_engine
    from training.policy import build_policy, load_tokenizer, save_random_adapter
    from training.sft_data import corpus_texts

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_engines_"))
    model = Path(args.model) if args.model else build_policy(work / "policy", "small", corpus_texts(300), seed=0)
    adapters = [save_random_adapter(model, work / f"adapter{i}", seed=i) for i in range(2)]
    tok = load_tokenizer(model)
    prompts = prompts_for(tok, 16)
    batches = (1, 8) if args.quick else (1, 8, 32, 64)
    new_tokens = 16 if args.quick else 32
    res: dict = {"quick": args.quick, "model": str(model), "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
                 "new_tokens": new_tokens, "device": args.device}
    if args.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    eng = make_engine(f"torch:{model}", device=args.device)
    measure(eng, "torch", prompts, batches, new_tokens, model, adapters, res, args.device)
    eng.close()
    want_vllm = (not args.quick) or args.with_vllm
    if want_vllm and importlib.util.find_spec("vllm") is not None:
        t = time.perf_counter()
        eng = make_engine(f"vllm:{model}", max_model_len=1024)
        res["vllm/start_s"] = round(time.perf_counter() - t, 1)
        try:
            measure(eng, "vllm", prompts, batches, new_tokens, model, adapters, res, args.device)
        finally:
            eng.close()
        for b in batches:
            res[f"vllm_over_torch_tokens_per_s@{b}"] = round(res[f"vllm/tokens_per_s@{b}"] / res[f"torch/tokens_per_s@{b}"], 3)
    elif want_vllm:
        res["vllm/skipped"] = "vllm is not importable"
    for name in ("torch", "vllm"):
        if f"{name}/hot_swap_pause_ms" in res:
            res[f"{name}/target_hot_swap_le_50ms_met"] = res[f"{name}/hot_swap_pause_ms"] <= 50.0
            res[f"{name}/target_mismatch_met"] = (res[f"{name}/logprob_mismatch_max"] < 1e-4
                                                  and res[f"{name}/logprob_mismatch_mean"] < 1e-5)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True))
    for key, v in sorted(res.items()):
        print(f"{key}: {v}")


if __name__ == "__main__":
    main()
