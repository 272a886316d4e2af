"""Shared fixtures of the runtime tests: a briefly trained tiny policy, real server processes.

The server is the real `evolve serve` started as a subprocess on 127.0.0.1 with a free port;
clients are the official `langgraph_sdk` client and httpx. Nothing is mocked.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TOKENS = {"alice": "tok-alice-0001", "bob": "tok-bob-00002", "admin": "tok-admin-0003"}
EVOLVE_TOKENS = "tok-alice-0001=alice,tok-bob-00002=bob,tok-admin-0003=ops:admin"
EVOLVE = str(Path(sys.executable).parent / "evolve")
WORLD = {"world": "driftbench/retail-v1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """The `tiny` cold-start policy, trained once per session (seconds)."""
    import torch

    torch.set_num_threads(2)
    from training.coldstart import ensure_coldstart

    return Path(ensure_coldstart(tmp_path_factory.mktemp("policy") / "tiny", "tiny", seed=0))


class ServerProc:
    """`evolve serve` in a subprocess; `kill()` is a real SIGKILL."""

    def __init__(self, data_dir: Path, engine: str, *extra: str):
        self.data_dir, self.engine, self.extra = Path(data_dir), engine, extra
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> "ServerProc":
        self.port = free_port()
        env = {**os.environ, "EVOLVE_TOKENS": EVOLVE_TOKENS, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "ANONYMIZED_TELEMETRY": "False"}
        self.log = open(self.data_dir.parent / f"{self.data_dir.name}-server-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [EVOLVE, "serve", "--port", str(self.port), "--data-dir", str(self.data_dir), "--engine", self.engine,
             "--max-turns", "6", "--max-new-tokens", "24", *self.extra],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.read_log()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server did not answer within {timeout}s: {self.read_log()[-3000:]}")

    def read_log(self) -> str:
        return Path(self.log.name).read_text()

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, no flushing; what is committed is all that survives."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


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

