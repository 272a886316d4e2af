"""Async actor/learner plumbing: work orders, worker pools (thread, process, Ray), adapter sync, staleness.

The learner hands out *work orders* (one task, G samples, a seed); rollout workers turn each into a
`GroupResult` tagged with the policy version that produced it. The number of outstanding orders is
bounded, so rollouts never run further ahead of the learner than the queue allows (back-pressure).
The learner admits a group only if `current_version - group.version <= eta` (η=0: synchronous) and
counts the rest. Adapters, never full weights, travel to workers: the learner saves the LoRA
adapter and publishes `(path, version)` through an `AdapterChannel` (an atomically replaced JSON
file); each worker polls it before every group and calls `engine.load_adapter(path, version)` when
it changed. The same mechanism serves threads, processes and Ray actors on one machine (a Ray
cluster spanning machines needs the adapter folder on shared storage).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

BACKENDS = ("thread", "process", "ray")
# transformers' model loading patches global init functions: two threads loading at once can
# leave weights uninitialised (NaN logits). Workers build their runners one at a time.
_BUILD_LOCK = threading.Lock()


@dataclass
class WorkOrder:
    order_id: int
    task_id: str
    group_size: int
    seed: int
    payload: dict[str, Any] = field(default_factory=dict)  # e.g. the serialised Task


@dataclass
class GroupResult:
    order_id: int
    task_id: str
    version: int
    trajectories: list  # list[dynamic_bench.schema.Trajectory]
    worker: str = ""
    seconds: float = 0.0
    error: str | None = None


class Runner(Protocol):
    """What a worker drives: an engine (adapter hot-swap) and a way to roll out one order."""

    def load_adapter(self, path: str | None, version: int) -> None: ...

    def run(self, order: WorkOrder) -> list: ...


class RunnerFactory(Protocol):
    """Picklable recipe a worker calls once, in its own thread/process/actor, to build its Runner."""

    def __call__(self, worker_index: int) -> Runner: ...


# ---- adapter sync ---------------------------------------------------------------------------
class AdapterChannel:
    """`latest.json` in a folder: the learner publishes, workers poll. Atomic via os.replace."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.file = self.root / "latest.json"

    def publish(self, path: str | Path | None, version: int) -> None:
        tmp = self.root / f".latest.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps({"path": None if path is None else str(path), "version": int(version)}))
        os.replace(tmp, self.file)

    def poll(self) -> tuple[str | None, int]:
        if not self.file.exists():
            return None, 0
        d = json.loads(self.file.read_text())
        return d["path"], int(d["version"])


def run_order(runner: Runner, channel: AdapterChannel, order: WorkOrder, state: dict, name: str) -> GroupResult:
    """Sync the adapter if the learner published a new one, then roll out one group."""
    t0 = time.perf_counter()
    try:
        path, version = channel.poll()
        if state.get("version") != version:
            runner.load_adapter(path, version)
            state["version"] = version
        trajs = runner.run(order)
        return GroupResult(order.order_id, order.task_id, state["version"], trajs, name, time.perf_counter() - t0)
    except Exception:  # the learner re-raises with the worker's traceback
        return GroupResult(order.order_id, order.task_id, state.get("version", -1), [], name,
                           time.perf_counter() - t0, error=traceback.format_exc())


def _worker_loop(factory: RunnerFactory, index: int, channel_root: str, orders, results, threads: int) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
    name = f"worker-{index}"
    channel = AdapterChannel(channel_root)
    try:
        with _BUILD_LOCK:
            runner = factory(index)
    except Exception:
        results.put(GroupResult(-1, "", -1, [], name, error=traceback.format_exc()))
        return
    state: dict = {}
    while True:
        order = orders.get()
        if order is None:
            return
        results.put(run_order(runner, channel, order, state, name))


# ---- pools ----------------------------------------------------------------------------------
class WorkerPool:
    """Submit orders, get results in completion order; `close()` stops every worker."""

    def __init__(self, factory: RunnerFactory, n_workers: int, channel_root: str | Path,
                 backend: str = "thread", threads_per_worker: int = 1) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        self.backend, self.n_workers, self.outstanding = backend, n_workers, 0
        root = str(channel_root)
        if backend == "thread":
            self._orders, self._results = queue.Queue(), queue.Queue()
            self._workers = [threading.Thread(target=_worker_loop, daemon=True, name=f"rollout-{i}",
                                              args=(factory, i, root, self._orders, self._results, 0))
                             for i in range(n_workers)]
        elif backend == "process":
            ctx = mp.get_context("spawn")
            self._orders, self._results = ctx.Queue(), ctx.Queue()
            self._workers = [ctx.Process(target=_worker_loop, daemon=True, name=f"rollout-{i}",
                                         args=(factory, i, root, self._orders, self._results, threads_per_worker))
                             for i in range(n_workers)]
        else:
            self._ray = _RayWorkers(factory, n_workers, root, threads_per_worker)
            return
        for w in self._workers:
            w.start()

    def submit(self, order: WorkOrder) -> None:
        self.outstanding += 1
        if self.backend == "ray":
            self._ray.submit(order)
        else:
            self._orders.put(order)

    def get(self, timeout: float = 600.0) -> GroupResult:
        if self.backend == "ray":
            res = self._ray.get(timeout)
        else:
            try:
                res = self._results.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no rollout result within {timeout:.0f}s ({self.backend} workers)") from None
        if res.error:
            raise RuntimeError(f"rollout {res.worker} failed on order {res.order_id}:\n{res.error}")
        self.outstanding -= 1
        return res

    def close(self) -> None:
        if self.backend == "ray":
            self._ray.close()
            return
        for _ in self._workers:
            self._orders.put(None)
        for w in self._workers:
            w.join(timeout=30)
            if self.backend == "process" and w.is_alive():
                w.terminate()


class _RayWorkers:
    """Ray actors, one order in flight per actor; pending orders wait in the learner."""

    def __init__(self, factory: RunnerFactory, n: int, root: str, threads: int) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=max(2, n), include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads or 1),
                                               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
            self._owns_ray = True
        else:
            self._owns_ray = False
        actor_cls = ray.remote(num_cpus=0)(RolloutActor)
        self.ray = ray
        self.actors = [actor_cls.remote(factory, i, root, threads) for i in range(n)]
        self.free = list(range(n))
        self.pending: list[WorkOrder] = []
        self.inflight: dict[Any, int] = {}

    def _dispatch(self) -> None:
        while self.free and self.pending:
            i = self.free.pop(0)
            self.inflight[self.actors[i].run.remote(self.pending.pop(0))] = i

    def submit(self, order: WorkOrder) -> None:
        self.pending.append(order)
        self._dispatch()

    def get(self, timeout: float) -> GroupResult:
        done, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        if not done:
            raise TimeoutError(f"no rollout result within {timeout:.0f}s (ray actors)")
        ref = done[0]
        self.free.append(self.inflight.pop(ref))
        self._dispatch()
        return self.ray.get(ref)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        if self._owns_ray:
            self.ray.shutdown()


class RolloutActor:
    """The body of a Ray rollout actor (wrapped with `ray.remote` at pool start)."""

    def __init__(self, factory: RunnerFactory, index: int, root: str, threads: int) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.name = f"ray-worker-{index}"
        self.channel = AdapterChannel(root)
        self.runner = factory(index)
        self.state: dict = {}

    def run(self, order: WorkOrder) -> GroupResult:
        return run_order(self.runner, self.channel, order, self.state, self.name)


# ---- staleness --------------------------------------------------------------------------------
@dataclass
class StalenessGate:
    """Admit a group only if it is at most `eta` policy versions old; count and histogram the rest."""

    eta: int
    admitted: int = 0
    rejected: int = 0
    histogram: Counter = field(default_factory=Counter)  # staleness of admitted groups

    def admit(self, sample_version: int, current_version: int) -> bool:
        lag = current_version - sample_version
        if lag < 0:
            raise ValueError(f"sample version {sample_version} is newer than the learner's {current_version}")
        if lag > self.eta:
            self.rejected += 1
            return False
        self.admitted += 1
        self.histogram[lag] += 1
        return True

    def state_dict(self) -> dict:
        return {"eta": self.eta, "admitted": self.admitted, "rejected": self.rejected,
                "histogram": {str(k): v for k, v in self.histogram.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.admitted, self.rejected = d["admitted"], d["rejected"]
        self.histogram = Counter({int(k): v for k, v in d["histogram"].items()})


def collect(pool: WorkerPool, gate: StalenessGate, version: int, want: int,
            make_order: Callable[[], WorkOrder], max_outstanding: int, sync: bool,
            keep: Callable[[GroupResult], bool] = lambda r: True, max_results: int | None = None,
            timeout: float = 600.0) -> tuple[list[GroupResult], dict]:
    """Gather `want` admitted groups that `keep` accepts (dynamic sampling) for one learner step.

    sync (η=0): submit exactly what is missing, wait for all of it, repeat; nothing runs ahead.
    async: keep `max_outstanding` orders in flight, so rollouts continue while the learner trains.
    `keep` sees every admitted group (so a scheduler can learn from zero-variance ones too).
    Returns the kept groups (ordered by order id, for determinism) and counts of what was dropped.
    """
    kept: list[GroupResult] = []
    stats = {"groups_seen": 0, "groups_stale": 0, "groups_filtered": 0}
    limit = max_results if max_results is not None else 4 * want
    while len(kept) < want and stats["groups_seen"] < limit:
        if sync:
            for _ in range(min(want - len(kept), limit - stats["groups_seen"])):
                pool.submit(make_order())
            batch = [pool.get(timeout) for _ in range(pool.outstanding)]
        else:
            while pool.outstanding < max_outstanding:
                pool.submit(make_order())
            batch = [pool.get(timeout)]
        for res in sorted(batch, key=lambda r: r.order_id):
            stats["groups_seen"] += 1
            if not gate.admit(res.version, version):
                stats["groups_stale"] += 1
            elif not keep(res):
                stats["groups_filtered"] += 1  # counted, not trained on
            elif len(kept) < want:
                kept.append(res)
    kept.sort(key=lambda r: r.order_id)
    return kept, stats
