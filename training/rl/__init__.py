"""Async RL with LoRA: GRPO-family loss with off-policy corrections, actor/learner with staleness
bound, sample scheduler, action-level exploration, diagnostics.

Public API (imported lazily so that `evolve --help` stays fast):
  train_rl(cfg: RLConfig, pool: TaskPool | None = None, on_step=None) -> Path   (trainer.py)
  RLConfig, TaskPool, read_metrics                                              (trainer.py)
  TaskScheduler(cfg: SchedulerConfig).learning_value(task_id) / .sample(n, rng)  (scheduler.py)
  policy_loss, group_advantages, is_weights                                     (loss.py)
  ExploringEngine                                                               (explore.py)
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "train_rl": "trainer", "RLConfig": "trainer", "TaskPool": "trainer", "read_metrics": "trainer",
    "TaskScheduler": "scheduler", "SchedulerConfig": "scheduler",
    "policy_loss": "loss", "group_advantages": "loss", "is_weights": "loss",
    "ExploringEngine": "explore",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"training.rl.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'training.rl' has no attribute {name!r}")
