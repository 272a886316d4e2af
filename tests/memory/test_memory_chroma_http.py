"""Scale path: the vector projection on chromadb's HTTP client is configuration, not code."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from memory import MemoryService


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def chroma_server(tmp_path):
    exe = Path(shutil.which("chroma") or Path(__import__("sys").executable).with_name("chroma"))
    if not exe.exists():
        pytest.skip("the chroma server CLI is not installed")
    port = _free_port()
    p = subprocess.Popen([str(exe), "run", "--path", str(tmp_path / "server"), "--host", "127.0.0.1",
                          "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{url}/api/v2/heartbeat", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        else:
            pytest.fail("chroma server did not start")
        yield url
    finally:
        p.terminate()
        p.wait(timeout=20)


def test_memory_over_chroma_http(tmp_path, chroma_server):
    svc = MemoryService(tmp_path / "mem", chroma_url=chroma_server)
    a = svc.add("alice", "Gold members get free express shipping", kind="strategy", trajectory_id="t1")
    b = svc.add("bob", "Bob wants invoices by post", kind="user_preference", trajectory_id="t2")
    assert svc.search("alice", "express shipping for gold", k=1)[0].item.id == a.id
    assert svc.search("alice", "invoices by post", k=5)[0].item.tenant == "alice"
    svc.retract_trajectory("t1")
    assert svc.search("alice", "express shipping for gold", k=5) == []
    svc.forget_tenant("bob")
    assert svc.vec.ids("bob") == [] and b.id not in str(svc.search("bob", "invoices", k=5))
    svc.close()
    again = MemoryService(tmp_path / "mem", chroma_url=chroma_server)  # catches up, no rebuild
    assert again.notices == [] and again.vec.last_seq == again.version
    again.close()
