"""Shared fixtures of the runtime tests: a briefly trained tiny policy, real server processes.

The server is the real `evolve serve` started as a subprocess on 127.0.0.1 with a free port;
clients are the official `langgraph_sdk` client and httpx. Nothing is mocked.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from evolve.service_proc import Service

TOKENS = {"alice": "tok-alice-0001", "bob": "tok-bob-00002", "admin": "tok-admin-0003"}
EVOLVE_TOKENS = "tok-alice-0001=alice,tok-bob-00002=bob,tok-admin-0003=ops:admin"
WORLD = {"world": "driftbench/retail-v1"}


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """The `tiny` cold-start policy, trained once per session (seconds)."""
    import torch

    torch.set_num_threads(2)
    from training.coldstart import ensure_coldstart

    return Path(ensure_coldstart(tmp_path_factory.mktemp("policy") / "tiny", "tiny", seed=0))


class ServerProc(Service):
    """`evolve serve` in a subprocess (evolve/service_proc.py) with small budgets; `kill()` is a real SIGKILL."""

    def __init__(self, data_dir: Path, engine: str, *extra: str):
        super().__init__(data_dir, engine, EVOLVE_TOKENS, "--max-turns", "6", "--max-new-tokens", "24", *extra)

    def read_log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, no flushing; what is committed is all that survives."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def server(tiny_policy, tmp_path_factory):
    """One shared server for most tests (each test uses its own threads)."""
    srv = ServerProc(tmp_path_factory.mktemp("serve") / "data", f"torch:{tiny_policy}").start()
    yield srv
    srv.stop()


@pytest.fixture()
def fresh_server(tiny_policy, tmp_path):
    """A server of a test's own (restart, hot swap): its data dir is the test's."""
    servers: list[ServerProc] = []

    def make(*extra: str, data_dir: Path | None = None) -> ServerProc:
        srv = ServerProc(data_dir or tmp_path / "data", f"torch:{tiny_policy}", *extra).start()
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


class Helpers:
    """What tests share (conftest modules are not importable by name): tokens, clients, headers."""

    TOKENS = TOKENS
    WORLD = WORLD

    @staticmethod
    def client(srv: ServerProc, who: str = "alice"):
        from langgraph_sdk import get_sync_client

        return get_sync_client(url=srv.url, api_key=TOKENS[who])

    @staticmethod
    def headers(who: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKENS[who]}"}


@pytest.fixture(scope="session")
def h() -> type[Helpers]:
    return Helpers


@pytest.fixture(scope="session")
def pg_url():
    """A Postgres database of this test session's own, dropped afterwards."""
    import uuid

    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError:
        pytest.skip("no PostgreSQL answering on 127.0.0.1:5432")
    name = f"evolve_runtime_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()

