"""`TorchEngine`: the embedded default engine. In process, batched, KV cache, seeded, LoRA hot-swap.

Logprob convention shared by every engine: the logprob of a sampled token is taken from
`log_softmax(logits / T)` (the distribution it was sampled from, before top-p truncation);
greedy decoding (T = 0) reports `log_softmax(logits)`. `logprobs(..., temperature=T)` scores
the same way, so behaviour and trainer logprobs compare like for like.

`device` ("cpu", "cuda"): the model and every tensor the engine makes live there, and so do the
sampling generators (`torch.multinomial` needs one on the device of the probabilities); results
come back as Python lists either way. CPU runs are unchanged by it, bit for bit.
"""
from __future__ import annotations

import contextlib
import inspect
import time
from pathlib import Path
from typing import Sequence

import torch

from training.engines.base import Engine, Generation, SamplingParams


def sample_token(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> tuple[int, float]:
    """Sample one token from a 1-D logits row; return (token id, its logprob per the convention)."""
    if params.temperature <= 0:
        lp = torch.log_softmax(logits, dim=-1)
        tok = int(torch.argmax(logits))
        return tok, float(lp[tok])
    lp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = lp.exp()
    if params.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p
        masked = torch.zeros_like(probs)
        masked[idx[keep]] = probs[idx[keep]]
        probs = masked
    tok = int(torch.multinomial(probs, 1, generator=gen))
    return tok, float(lp[tok])


def _layout(cfg: dict) -> tuple:
    """What must match for an adapter's tensors to be copied into another's slot."""
    return (cfg.get("r"), cfg.get("lora_alpha"), tuple(sorted(cfg.get("target_modules") or ())),
            cfg.get("use_rslora", False), cfg.get("use_dora", False), str(cfg.get("rank_pattern")),
            str(cfg.get("alpha_pattern")), cfg.get("bias", "none"))


class TorchEngine(Engine):
    """Runs a HF causal LM in this process; LoRA adapters are loaded once per version and switched."""

    def __init__(self, model_path: str | Path | None = None, *, model=None, tokenizer=None,
                 adapter: str | None = None, version: str = "base", seed: int = 0,
                 max_batch_size: int = 64, keep_adapters: int = 4, device: str | None = None) -> None:
        """`device` None: where a passed `model` already is (the cold start's quality check hands over
        the model it is training, which must not move), else "cpu"."""
        from training.policy import load_model, load_tokenizer

        if model is None:
            if model_path is None:
                raise ValueError("TorchEngine needs a model_path or a model")
            model = load_model(model_path)
        if device is None:
            device = str(next(model.parameters()).device)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer if tokenizer is not None else (load_tokenizer(model_path) if model_path else None)
        self.model_path = str(model_path) if model_path else None
        self.max_len = int(getattr(model.config, "max_position_embeddings", 2048))
        self.pad_id = int(self.tokenizer.pad_token_id) if self.tokenizer is not None else 0
        self.max_batch_size = max_batch_size
        self.keep_adapters = keep_adapters
        # the prompt pass needs the last position's logits only; a model that can skip the rest
        # (`logits_to_keep`, Llama and most current HF causal LMs) saves the vocabulary projection of
        # every other position: rollouts ~7% faster on the small policy, the same trajectories to the bit
        # (64 fresh retail tasks, greedy; tests/training/test_engine_conformance.py checks it on the tiny one)
        self._last_logits_only = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._rng = torch.Generator(device=self.device).manual_seed(seed)
        self._peft = None
        self._adapters: dict[str, tuple[str, str]] = {}  # version -> (adapter path, slot), LRU order
        self._slots: dict[str, tuple] = {}  # slot -> LoRA layout (r, alpha, targets)
        self._active: str | None = None
        self.policy_version = version
        self.last_swap_ms = 0.0
        if adapter is not None:
            self.load_adapter(adapter, version)

    # -- adapters ---------------------------------------------------------------------------
    # Versions live in a few peft adapter *slots*. A new version with the same LoRA layout as an
    # idle slot is copied into that slot's tensors in place (safetensors read + copy: a few ms);
    # only a new layout (or the first adapter) builds modules through peft.
    def load_adapter(self, adapter_path: str | None, version: str) -> None:
        t0 = time.perf_counter()
        if adapter_path is None:
            self._active = None
        else:
            path = str(adapter_path)
            if self._adapters.get(version, (None, None))[0] != path:
                self._load(path, version)
            self._adapters[version] = self._adapters.pop(version)  # most recently used last
            slot = self._adapters[version][1]
            if self._peft.active_adapter != slot:  # peft's switch walks every module: skip if live
                self._peft.set_adapter(slot)
            self._active = version
        self.policy_version = version
        self.last_swap_ms = (time.perf_counter() - t0) * 1000

    def _load(self, path: str, version: str) -> None:
        import json

        from peft import PeftModel

        cfg_file = Path(path) / "adapter_config.json"
        if not cfg_file.exists():
            raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {path}")
        layout = _layout(json.loads(cfg_file.read_text()))
        if version in self._adapters:
            slot = self._adapters.pop(version)[1]
            if self._slots[slot] == layout:
                self._copy_into(slot, path)
                self._adapters[version] = (path, slot)
                return
            self._free(slot)
        active_slot = self._adapters[self._active][1] if self._active in self._adapters else None
        if active_slot is not None and self._slots[active_slot] == layout:
            # the usual RL step: the next version replaces the live one in place (no module work)
            del self._adapters[self._active]
            self._copy_into(active_slot, path)
            self._adapters[version] = (path, active_slot)
            return
        if self._peft is None:
            slot = self._new_slot()
            self._peft = PeftModel.from_pretrained(self.model, path, adapter_name=slot, is_trainable=False)
            self._peft.eval()
        else:
            idle = [v for v in self._adapters if v != self._active]
            if len(self._adapters) >= self.keep_adapters and idle:
                old = idle[0]  # the least recently used idle version gives up its slot
                slot = self._adapters.pop(old)[1]
                if self._slots[slot] == layout:
                    self._copy_into(slot, path)
                    self._adapters[version] = (path, slot)
                    return
                self._free(slot)
            slot = self._new_slot()
            self._peft.load_adapter(path, adapter_name=slot, is_trainable=False)
        self._slots[slot] = layout
        self._adapters[version] = (path, slot)

    def _copy_into(self, slot: str, path: str) -> None:
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        f = Path(path) / "adapter_model.safetensors"
        if f.exists():
            sd = load_file(str(f))
        else:
            sd = torch.load(Path(path) / "adapter_model.bin", map_location="cpu", weights_only=True)
        params = self._param_map(slot)
        if set(sd) == set(params) and all(sd[k].shape == params[k].shape for k in sd):
            with torch.no_grad():
                for k, t in sd.items():
                    params[k].copy_(t)
        else:  # unusual key layout: let peft map it
            set_peft_model_state_dict(self._peft, sd, adapter_name=slot)

    def _param_map(self, slot: str) -> dict:
        """Saved-adapter key -> this slot's tensor (peft saves keys without the adapter name)."""
        cache = self.__dict__.setdefault("_pmaps", {})
        if slot not in cache:
            tag = f".{slot}."
            cache[slot] = {n.replace(tag, "."): p for n, p in self._peft.named_parameters() if tag in n}
        return cache[slot]

    def _new_slot(self) -> str:
        self._slot_counter = getattr(self, "_slot_counter", 0) + 1
        return f"slot{self._slot_counter}"

    def _free(self, slot: str) -> None:
        self._peft.delete_adapter(slot)
        self._slots.pop(slot, None)
        self.__dict__.get("_pmaps", {}).pop(slot, None)

    def _net(self):
        """The module to call, inside a context that disables adapters when the base is active."""
        if self._peft is None:
            return self.model, contextlib.nullcontext()
        if self._active is None:
            return self._peft, self._peft.disable_adapter()
        return self._peft, contextlib.nullcontext()

    # -- sampling ---------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = prompts[start:start + self.max_batch_size]
            seeds = [None if params.seed is None else params.seed + start + i for i in range(len(chunk))]
            out.extend(self._generate_batch(chunk, params, seeds))
        return out

    @torch.no_grad()
    def _generate_batch(self, prompts, params: SamplingParams, seeds) -> list[Generation]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token id")
        longest = max(len(p) for p in prompts)
        if longest >= self.max_len:
            raise ValueError(f"prompt of {longest} tokens does not fit the model context ({self.max_len})")
        max_new = min(params.max_new_tokens, self.max_len - longest)
        dev = self.device
        gens = [torch.Generator(device=dev).manual_seed(s) if s is not None else self._rng for s in seeds]
        b = len(prompts)
        # left-padded batch built on the host and sent once (one copy, not one per row)
        ids = torch.full((b, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, longest - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        stops = set(params.stop_token_ids)
        toks: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        done = [False] * b
        reason = ["length"] * b
        net, ctx = self._net()
        with ctx:
            keep = {"logits_to_keep": 1} if self._last_logits_only else {}
            res = net(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep)
            past, logits = res.past_key_values, res.logits[:, -1, :].float()
            last_pos = pos[:, -1]
            for _ in range(max_new):
                nxt = [self.pad_id] * b
                for i in range(b):
                    if done[i]:
                        continue
                    tok, lp = sample_token(logits[i], params, gens[i])
                    toks[i].append(tok)
                    lps[i].append(lp)
                    nxt[i] = tok
                    if tok in stops:
                        done[i], reason[i] = True, "stop"
                if all(done):
                    break
                mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long, device=dev)], dim=1)
                last_pos = last_pos + 1
                step_ids = torch.tensor(nxt, dtype=torch.long, device=dev)[:, None]
                res = net(input_ids=step_ids, attention_mask=mask, position_ids=last_pos[:, None],
                          past_key_values=past, use_cache=True)
                past, logits = res.past_key_values, res.logits[:, -1, :].float()
        return [Generation(token_ids=toks[i], logprobs=lps[i], finish_reason=reason[i],
                           policy_version=self.policy_version) for i in range(b)]

    # -- scoring ----------------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                 temperature: float = 1.0) -> list[float]:
        if not completion_ids:
            return []
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long, device=self.device)
        net, ctx = self._net()
        with ctx:
            logits = net(input_ids=ids).logits[0].float()
        n = len(completion_ids)
        scaled = logits[-n - 1:-1] / (temperature if temperature > 0 else 1.0)
        lp = torch.log_softmax(scaled, dim=-1)
        target = torch.tensor(list(completion_ids), dtype=torch.long, device=self.device)
        return lp.gather(1, target[:, None])[:, 0].tolist()
