"""Shared fixtures of the training tests: a tiny policy folder and a LoRA adapter, built once."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _engine_texts() -> list[str]:
    """Tool-call-like text: enough for a tokenizer whose merges cover the engine test prompts."""
    tools = ["get_order", "refund_order", "cancel_order", "update_address", "escalate", "reply"]
    return [f'<|user|>order O-{1000 + i} {tools[i % 6]} {{"order_id":"O-{1000 + i}","days":{i % 40}}}<|end|>'
            for i in range(400)]


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> str:
    """A `tiny` preset policy (random weights) as a standard HF folder."""
    import torch

    from training.policy import build_policy

    torch.set_num_threads(2)
    return str(build_policy(tmp_path_factory.mktemp("tiny_policy"), "tiny", _engine_texts(), seed=0))


@pytest.fixture(scope="session")
def tiny_adapter(tiny_policy, tmp_path_factory) -> str:
    """A random (non-zero) LoRA adapter on the tiny policy, so outputs visibly change with it."""
    from training.policy import save_random_adapter

    return str(save_random_adapter(tiny_policy, tmp_path_factory.mktemp("tiny_adapter"), seed=1, scale=4.0))


@pytest.fixture(scope="session")
def bench_policy(tmp_path_factory) -> str:
    """A `tiny` policy whose tokenizer is trained on DriftBench text (random weights)."""
    from training.policy import build_policy
    from training.sft_data import corpus_texts

    return str(build_policy(tmp_path_factory.mktemp("bench_policy"), "tiny", corpus_texts(120, seed=1), seed=0))
