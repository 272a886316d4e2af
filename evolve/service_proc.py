"""Start and stop `evolve serve` as a child process (the demo and the end-to-end tests use it)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """`with Service(data_dir, engine, tokens) as svc:` → `svc.url`; stopped (and reaped) on exit."""

    def __init__(self, data_dir: str | Path, engine: str, tokens: str, *extra: str, threads: int = 2):
        self.data_dir, self.engine, self.tokens, self.extra = Path(data_dir), engine, tokens, extra
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> "Service":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = {**os.environ, "EVOLVE_TOKENS": self.tokens, "OMP_NUM_THREADS": str(self.threads),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "ANONYMIZED_TELEMETRY": "False"}
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-serve.log"
        log = open(self.log_path, "a")
        evolve = str(Path(sys.executable).parent / "evolve")
        self.proc = subprocess.Popen([evolve, "serve", "--port", str(self.port), "--data-dir", str(self.data_dir),
                                      "--engine", self.engine, *self.extra],
                                     env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"evolve serve exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"evolve serve did not answer within {timeout}s: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Service":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
