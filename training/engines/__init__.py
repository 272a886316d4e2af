"""Policy engines behind one interface (see base.py), built from a spec string by `make_engine`.

Specs: `torch:DIR` (in process), `vllm:DIR` (vLLM in process), `openai:URL#model` (any
OpenAI-compatible completions server that returns token ids and logprobs, e.g. `vllm serve`).
A bare path means `torch:PATH`. Heavy imports happen inside `make_engine`.
"""
from __future__ import annotations

from training.engines.base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams", "make_engine"]


def make_engine(spec: str, **kwargs) -> Engine:
    """Build an engine from `torch:DIR`, `vllm:DIR` or `openai:URL#model` (kwargs go to the class)."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("torch", "vllm", "openai"):
        kind, rest = "torch", spec
    if not rest:
        raise ValueError(f"engine spec {spec!r} names no model (expected torch:DIR, vllm:DIR or openai:URL#model)")
    if kind == "torch":
        from training.engines.torch_engine import TorchEngine

        return TorchEngine(rest, **kwargs)
    if kind == "vllm":
        from training.engines.vllm_engine import VLLMEngine

        return VLLMEngine(rest, **kwargs)
    from training.engines.openai_engine import OpenAICompatEngine

    url, _, model = rest.partition("#")
    return OpenAICompatEngine(url, model=model or None, **kwargs)
