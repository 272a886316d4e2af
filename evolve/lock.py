"""The cycle lock: one `evolve cycle` at a time per data folder.

The lock file holds the owner's PID, host and start time. It is created atomically
(written to a private file, then hard-linked into place, which fails if a lock exists),
so a reader never sees a half-written lock. A lock left by a dead process on this host is
recovered; a live one makes the second cycle refuse with a message naming the owner.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path


class CycleLocked(RuntimeError):
    """Another cycle holds the lock."""


@dataclass
class LockInfo:
    pid: int
    host: str
    started_at: float
    cycle_id: str = ""

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
        return f"pid {self.pid} on {self.host}, started {started}" + (
            f", cycle {self.cycle_id}" if self.cycle_id else "")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # A zombie (dead, not yet reaped) counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class CycleLock:
    """`with CycleLock(path, cycle_id):` — refuses (CycleLocked) while a live owner holds it.

    `stale_after_s` bounds how long a lock from another host (whose PID cannot be checked)
    or an unreadable lock file is honoured.
    """

    def __init__(self, path: str | Path, cycle_id: str = "", stale_after_s: float = 24 * 3600):
        self.path = Path(path)
        self.cycle_id = cycle_id
        self.stale_after_s = stale_after_s
        self.recovered: LockInfo | None = None  # the stale lock we replaced, if any
        self._held = False

    def read(self) -> LockInfo | None:
        try:
            return LockInfo(**json.loads(self.path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            return LockInfo(pid=-1, host="?", started_at=self.path.stat().st_mtime)

    def _is_stale(self, info: LockInfo) -> bool:
        if info.host == socket.gethostname() and info.pid > 0:
            return not _pid_alive(info.pid)
        return time.time() - info.started_at > self.stale_after_s

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = LockInfo(pid=os.getpid(), host=socket.gethostname(), started_at=time.time(),
                      cycle_id=self.cycle_id)
        tmp = self.path.with_name(f".{self.path.name}.{me.pid}.{time.monotonic_ns()}")
        tmp.write_text(json.dumps(asdict(me)))
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                    self._held = True
                    return
                except FileExistsError:
                    info = self.read()
                    if info is None:
                        continue
                    if not self._is_stale(info):
                        raise CycleLocked(
                            f"another evolve cycle is running ({info.describe()}); lock file "
                            f"{self.path}. Wait for it to finish, or remove the file if that "
                            "process is gone.") from None
                    # Move the stale lock aside atomically; only one contender wins the rename.
                    aside = self.path.with_name(f".{self.path.name}.stale.{me.pid}")
                    try:
                        os.replace(self.path, aside)
                        aside.unlink(missing_ok=True)
                        self.recovered = info
                    except FileNotFoundError:
                        pass
            raise CycleLocked(f"could not take the cycle lock {self.path} (contended)")
        finally:
            tmp.unlink(missing_ok=True)

    def release(self) -> None:
        if not self._held:
            return
        info = self.read()
        if info is not None and info.pid == os.getpid():
            self.path.unlink(missing_ok=True)
        self._held = False

    def __enter__(self) -> "CycleLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
