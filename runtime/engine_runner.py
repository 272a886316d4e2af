"""One policy engine shared by every run: micro-batched sampling and hot-swapped adapters.

Runs call `generate(prompt_ids, params)` from worker threads. A single sampler thread gathers
the requests that arrive within `max_wait_ms` into one `engine.generate` batch (engines are not
thread-safe, and a batch of 32 costs far less than 32 single calls). Before each batch it checks
the policy registry's signature: when another process promoted or rolled back a version, the
new adapter is loaded then and there, so the next sample carries the new `policy_version`,
with no restart. A failed swap keeps the old version serving and is reported by `status()`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Sequence

from runtime.policy_registry import BASE_VERSION, PolicyRegistry
from training.engines.base import Engine, Generation, SamplingParams

log = logging.getLogger("evolve.runtime")


class EngineRunner:
    """Serialises and batches access to one engine; keeps it on the registry's promoted version."""

    def __init__(self, engine: Engine, registry: PolicyRegistry | None = None, *,
                 max_batch: int = 32, max_wait_ms: float = 4.0):
        self.engine = engine
        self.registry = registry
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.swap_error: str | None = None
        self.batches = 0
        self._sig: tuple[int, int] | None = None
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._engine_lock = threading.RLock()  # one engine call or swap at a time
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()

    @property
    def policy_version(self) -> str:
        return self.engine.policy_version

    def refresh(self) -> bool:
        """Load the registry's serving version if the registry changed; True when swapped."""
        if self.registry is None:
            return False
        with self._engine_lock:
            sig = self.registry.signature()
            if sig == self._sig:
                return False
            self._sig = sig
            try:
                rec = self.registry.current()
                want = rec.version if rec else BASE_VERSION
                if want == self.engine.policy_version:
                    return False
                self.engine.load_adapter(rec.adapter_path if rec else None, want)
                self.swap_error = None
                log.warning("policy swapped to %s", want)
                return True
            except Exception as e:  # keep serving the old version; say why in /healthz
                self.swap_error = f"{type(e).__name__}: {e}"
                log.error("policy swap failed, still serving %s: %s", self.engine.policy_version, e)
                return False

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, timeout: float = 300) -> Generation:
        """Sample one completion (blocks the calling worker thread until its batch is done)."""
        fut: Future = Future()
        self._q.put((list(prompt_ids), params, fut))
        return fut.result(timeout=timeout)

    def close(self) -> None:
        self._stop.set()
        self._q.put(None)
        self._thread.join(timeout=5)

    def status(self) -> dict[str, Any]:
        return {"policy_version": self.engine.policy_version, "swap_error": self.swap_error,
                "batches": self.batches, "queued": self._q.qsize()}

    # -- the sampler thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            first = self._q.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + self.max_wait_s
            while len(batch) < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    item = self._q.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    self._stop.set()
                    break
                batch.append(item)
            self.refresh()
            groups: dict[SamplingParams, list] = {}
            for item in batch:  # one engine call per distinct sampling setting
                groups.setdefault(item[1], []).append(item)
            with self._engine_lock:
                for params, items in groups.items():
                    self._run(params, items)

    def _run(self, params: SamplingParams, items: list) -> None:
        try:
            if params.seed is not None and len(items) > 1:  # seeded requests stay reproducible alone
                gens = [self.engine.generate([p], params)[0] for p, _, _ in items]
            else:
                gens = self.engine.generate([p for p, _, _ in items], params)
            self.batches += 1
            for (_, _, fut), g in zip(items, gens):
                fut.set_result(g)
        except Exception as e:
            for _, _, fut in items:
                if not fut.done():
                    fut.set_exception(e)
