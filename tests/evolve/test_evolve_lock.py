"""The cycle lock: a second concurrent cycle refuses; a stale lock from a dead process is recovered."""
import json
import socket
import subprocess
import sys
import time

import pytest

from evolve.cycle import CycleConfig, run_cycle
from evolve.lock import CycleLock, CycleLocked

HOLDER = """
import sys, time
from evolve.lock import CycleLock
with CycleLock(sys.argv[1], cycle_id="holder"):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    """A real second process that holds the lock."""
    lock = tmp_path / "cycles" / "cycle.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    yield lock, p
    p.kill()
    p.wait()


def test_second_lock_refuses_with_owner_named(holder):
    lock, p = holder
    with pytest.raises(CycleLocked) as e:
        CycleLock(lock).acquire()
    msg = str(e.value)
    assert f"pid {p.pid}" in msg and socket.gethostname() in msg and "holder" in msg


def test_concurrent_cycle_refuses_and_writes_nothing(holder, tmp_path):
    lock, _ = holder
    calls = []
    fns = {s: (lambda ctx, s=s: calls.append(s) or {}) for s in
           ("mine", "experience", "train", "gate", "consolidate", "report")}
    with pytest.raises(CycleLocked, match="another evolve cycle is running"):
        run_cycle(CycleConfig(data_dir=str(tmp_path)), stage_fns=fns, log=lambda m: None)
    assert calls == []
    assert not list((tmp_path / "cycles").glob("cycle-*"))


def test_stale_lock_from_dead_process_is_recovered(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "cycle.lock"
    path.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                "started_at": time.time() - 5, "cycle_id": "old"}))
    lk = CycleLock(path, cycle_id="new")
    lk.acquire()
    assert lk.recovered is not None and lk.recovered.pid == dead.pid
    assert json.loads(path.read_text())["cycle_id"] == "new"
    lk.release()
    assert not path.exists()


def test_unreadable_lock_is_honoured_until_it_ages(tmp_path):
    path = tmp_path / "cycle.lock"
    path.write_text("{half a lo")
    with pytest.raises(CycleLocked):
        CycleLock(path, stale_after_s=3600).acquire()
    lk = CycleLock(path, stale_after_s=0.0)
    time.sleep(0.01)
    lk.acquire()
    assert lk.recovered is not None
    lk.release()


def test_release_keeps_someone_elses_lock(tmp_path):
    path = tmp_path / "cycle.lock"
    a = CycleLock(path)
    a.acquire()
    path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started_at": time.time()}))
    a.release()
    assert path.exists()
