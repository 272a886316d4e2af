"""Prometheus metrics of the service (its own registry, so several apps can live in one process)."""
from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("evolve_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=r)
        self.request_s = Histogram("evolve_http_request_seconds", "HTTP request latency", ["route"],
                                   buckets=_LAT, registry=r)
        self.runs = Counter("evolve_runs_total", "Finished runs by status", ["status"], registry=r)
        self.run_s = Histogram("evolve_run_seconds", "Run wall time", buckets=_LAT, registry=r)
        self.turns = Counter("evolve_agent_turns_total", "Policy calls (agent turns)", registry=r)
        self.turn_s = Histogram("evolve_agent_turn_seconds", "Policy call latency", buckets=_LAT, registry=r)
        self.tokens = Counter("evolve_completion_tokens_total", "Sampled completion tokens", registry=r)
        self.policy = Gauge("evolve_policy_info", "Serving policy version (value 1)", ["version"], registry=r)
        self._version: str | None = None

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.request_s.labels(route).observe(seconds)

    def observe_turn(self, seconds: float, n_tokens: int) -> None:
        self.turns.inc()
        self.turn_s.observe(seconds)
        self.tokens.inc(n_tokens)

    def observe_run(self, handle: Any, seconds: float) -> None:
        self.runs.labels(handle.status).inc()
        self.run_s.observe(seconds)

    def set_policy(self, version: str) -> None:
        if version != self._version:
            if self._version is not None:
                self.policy.remove(self._version)
            self.policy.labels(version).set(1)
            self._version = version

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
