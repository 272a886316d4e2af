"""`evolve train`: cold start, consistency check, and (from training/rl/cli.py) RL.

Light at import time (typer only): torch, transformers and vLLM are imported inside commands.
Every command writes under `--out` and can be re-run after an interruption to resume.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="Train the built-in policy: cold start, RL, consistency checks.", no_args_is_help=True)


@app.command("coldstart")
def coldstart(
    out: Path = typer.Option(Path("runs/coldstart"), "--out", help="output folder (policy/, checkpoint, metrics)"),
    preset: str = typer.Option("small", help="model size preset: tiny | small"),
    seed: int = typer.Option(0, help="seed of data, model init and batches"),
    steps: Optional[int] = typer.Option(None, help="SFT steps (default: the preset's)"),
    examples: Optional[int] = typer.Option(None, help="oracle episodes to train on (default: the preset's)"),
    eval_tasks: int = typer.Option(20, help="test tasks per domain for the evaluation (0: skip it)"),
    k: int = typer.Option(8, help="samples per task for pass@k"),
    eval_max_steps: int = typer.Option(10, help="turns per evaluation episode"),
    threads: int = typer.Option(2, help="torch threads"),
    device: str = typer.Option("cpu", help="where the SFT steps run: cpu | cuda (the result is reused on any device)"),
) -> None:
    """SFT the policy on DriftBench oracle episodes (resumable), then evaluate it."""
    import torch

    from training.coldstart import ensure_coldstart

    torch.set_num_threads(threads)
    overrides = {k_: v for k_, v in (("max_steps", steps), ("n_examples", examples)) if v is not None}
    policy = ensure_coldstart(out, preset, seed, progress=True, device=device, num_threads=threads, **overrides)
    typer.echo(f"policy: {policy}")
    if eval_tasks > 0:
        from training.coldstart_eval import evaluate
        from training.engines import make_engine
        from training.policy import load_tokenizer

        engine = make_engine(f"torch:{policy}")
        metrics = evaluate(engine, load_tokenizer(policy), n_tasks=eval_tasks, k=k, n_memory=eval_tasks, seed=seed,
                           max_steps=eval_max_steps)
        (out / "eval.json").write_text(json.dumps(metrics, indent=2))
        for key in sorted(m for m in metrics if m.startswith("all/")):
            typer.echo(f"{key}: {metrics[key]:.3f}")
        typer.echo(f"metrics: {out / 'eval.json'}")


@app.command("consistency")
def consistency(
    model: Path = typer.Option(..., help="policy folder (HF)"),
    engine: str = typer.Option("torch", help="torch | vllm | openai:URL#model"),
    adapter: Optional[Path] = typer.Option(None, help="LoRA adapter folder to load on both sides"),
    out: Path = typer.Option(Path("runs/consistency"), "--out", help="output folder"),
    prompts: int = typer.Option(16, help="prompts to sample"),
    max_new_tokens: int = typer.Option(32),
    temperature: float = typer.Option(1.0),
    seed: int = typer.Option(0),
    device: str = typer.Option("cpu", help="cpu | cuda: where the rescoring (and a torch engine) runs"),
) -> None:
    """Sample with an engine, rescore the exact ids with HF (+ peft), report per-token mismatch."""
    from training.consistency import run_consistency

    spec = engine if ":" in engine else f"{engine}:{model}"
    out.mkdir(parents=True, exist_ok=True)
    rep = run_consistency(spec, model, adapter=adapter, n_prompts=prompts, max_new_tokens=max_new_tokens,
                          temperature=temperature, seed=seed, out=out / "consistency.json", device=device)
    typer.echo(f"{spec}: {rep.n_tokens} tokens, mean |Δ| {rep.mean_abs:.2e}, max |Δ| {rep.max_abs:.2e}")
    typer.echo(f"report: {out / 'consistency.json'}")


# `evolve train rl` lives in training/rl/cli.py (the RL engineer's module); it registers itself here.
from training.rl.cli import register as _register_rl  # noqa: E402  (light: typer only)

_register_rl(app)
