"""`evolve train rl`: the RL command, mounted on the `train` sub-app by `register(app)`.

Light at import time (typer only): torch, peft and Ray are imported inside the command.
Every `RLConfig` field is an option (`--eta 2`, `--backend ray`, `--correction icepop`, ...).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer


def rl(
    model: str = typer.Option(..., help="policy folder to train (the cold-start model)"),
    out: Path = typer.Option(Path("runs/rl"), "--out", help="output folder (adapter, checkpoints, metrics)"),
    config: Optional[Path] = typer.Option(None, help="JSON file of RLConfig fields (options below override it)"),
    steps: Optional[int] = typer.Option(None, help="learner steps"),
    eta: Optional[int] = typer.Option(None, help="staleness bound η (0 = synchronous)"),
    backend: Optional[str] = typer.Option(None, help="rollout workers: thread | process | ray"),
    n_workers: Optional[int] = typer.Option(None, help="rollout workers"),
    env_id: Optional[str] = typer.Option(None, help="e.g. driftbench/retail-v1"),
    rule_version: Optional[int] = typer.Option(None, help="rule version of the RL tasks"),
    n_tasks: Optional[int] = typer.Option(None, help="tasks in the RL pool"),
    group_size: Optional[int] = typer.Option(None, help="samples per task (0: adaptive)"),
    groups_per_step: Optional[int] = typer.Option(None, help="informative groups per learner step"),
    correction: Optional[str] = typer.Option(None, help="none | tis | mis_token | mis_seq | icepop"),
    explore_eps: Optional[float] = typer.Option(None, help="action-level exploration rate"),
    sft_coef: Optional[float] = typer.Option(None, help="weight of supervised corrections from feedback"),
    kl_coef: Optional[float] = typer.Option(None, help="KL to the base model"),
    lr: Optional[float] = typer.Option(None, help="learning rate"),
    ppo_epochs: Optional[int] = typer.Option(None, help="optimizer steps per batch (proximal policy frozen)"),
    seed: Optional[int] = typer.Option(None, help="seed"),
    device: Optional[str] = typer.Option(None, help="cpu | cuda: where the learner and the rollout engines run"),
    resume: bool = typer.Option(True, help="continue from out/checkpoint when there is one"),
) -> None:
    """Async GRPO-family RL with LoRA on DriftBench tasks; resumable; writes metrics and a diagnosis."""
    from training.rl.trainer import RLConfig, train_rl

    fields = {f.name for f in dataclasses.fields(RLConfig)}
    values: dict = {}
    if config is not None:
        values = json.loads(config.read_text())
        unknown = set(values) - fields
        if unknown:
            raise typer.BadParameter(f"unknown RLConfig fields in {config}: {sorted(unknown)}")
    given = dict(model=model, out_dir=str(out), steps=steps, eta=eta, backend=backend, n_workers=n_workers,
                 env_id=env_id, rule_version=rule_version, n_tasks=n_tasks, group_size=group_size,
                 groups_per_step=groups_per_step, correction=correction, explore_eps=explore_eps,
                 sft_coef=sft_coef, kl_coef=kl_coef, lr=lr, ppo_epochs=ppo_epochs, seed=seed, device=device,
                 resume=resume)
    values.update({k: v for k, v in given.items() if v is not None})
    cfg = RLConfig(**values)
    try:
        cfg.validate()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    adapter = train_rl(cfg)
    typer.echo(f"adapter: {adapter}")
    typer.echo(f"metrics: {Path(cfg.out_dir) / 'metrics.jsonl'}  plot: {Path(cfg.out_dir) / 'metrics.png'}")
    typer.echo((Path(cfg.out_dir) / "diagnosis.txt").read_text())


def register(app: typer.Typer) -> None:
    """Add `rl` to the `train` sub-app (called from training/cli.py)."""
    app.command("rl")(rl)
