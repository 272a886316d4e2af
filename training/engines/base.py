"""The engine interface every policy backend implements: token ids in, token ids and logprobs out.

`TorchEngine` (in process), `VLLMEngine` and the OpenAI-compatible client all implement it, and
one conformance suite (tests/training/test_engine_conformance.py) runs against each.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    """One sampled completion: ids exactly as sampled, the behaviour logprob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    policy_version: str
    extra: dict = field(default_factory=dict)


class Engine(ABC):
    """Samples completions and scores token ids under the currently loaded policy version."""

    policy_version: str = "base"

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt (prompt token ids in, completion ids + logprobs out)."""

    @abstractmethod
    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                 temperature: float = 1.0) -> list[float]:
        """Log-probability of each completion token given the prompt, under the loaded weights.

        Convention of every engine: sampled-token logprobs come from `log_softmax(logits / T)`
        (T the sampling temperature, before top-p; T = 0 scores at T = 1), and this method
        scores the same way, so behaviour and recomputed logprobs compare like for like.
        """

    @abstractmethod
    def load_adapter(self, adapter_path: str | None, version: str) -> None:
        """Hot-swap to a LoRA adapter (None: the base model) and tag later samples with `version`."""

    def close(self) -> None:
        """Release processes or memory held by the engine."""
