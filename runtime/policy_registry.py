"""The policy registry: which LoRA adapter versions exist and which one serves.

One small JSON file, `<data_dir>/policies/registry.json`, written atomically under a file lock,
so the evolve cycle (another process) can promote or roll back while the service runs: the
service compares `signature()` before each sampling batch and hot-swaps when it changes.

    reg = PolicyRegistry(data_dir)
    reg.register("v3", "/path/to/adapter", parent="v2", cycle="cycle-0003", evaluation={...})
    reg.promote("v3")            # the service serves v3 from its next batch on
    reg.roll_back()              # v3 -> rolled_back; the previous promoted version serves again
    reg.current()                # PolicyRecord | None (None: the base model, no adapter)

Statuses follow DESIGN.md's `PolicyVersion`: candidate | promoted | rejected | rolled_back.
Every status change is appended to the record's `history`, so nothing is overwritten silently.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, Field

PolicyStatus = Literal["candidate", "promoted", "rejected", "rolled_back"]
BASE_VERSION = "base"


class UnknownPolicyVersion(KeyError):
    """Raised for a version the registry does not hold."""


class PolicyRecord(BaseModel):
    """One policy version (DESIGN.md `PolicyVersion`)."""

    version: str
    status: PolicyStatus = "candidate"
    adapter_path: str | None = None  # None: the base model itself
    parent: str | None = None
    base_model: str | None = None
    cycle: str | None = None
    evaluation: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    history: list[dict[str, Any]] = Field(default_factory=list)  # {at, status, reason}


class _RegistryFile(BaseModel):
    current: str | None = None          # the version that serves; None = base model
    promotions: list[str] = Field(default_factory=list)  # promotion order, oldest first
    revision: int = 0
    versions: dict[str, PolicyRecord] = Field(default_factory=dict)


def _record(reg: _RegistryFile, version: str) -> PolicyRecord:
    """The record of `version`, or UnknownPolicyVersion: the one lookup every verb shares."""
    rec = reg.versions.get(version)
    if rec is None:
        raise UnknownPolicyVersion(version)
    return rec


class PolicyRegistry:
    """Read and change the registry file; every method re-reads it (other processes write it)."""

    def __init__(self, data_dir: str | Path):
        self.dir = Path(data_dir) / "policies"
        self.path = self.dir / "registry.json"
        self._lock_path = self.dir / "registry.lock"

    # -- reading ----------------------------------------------------------------------------
    def _read(self) -> _RegistryFile:
        try:
            return _RegistryFile.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return _RegistryFile()
        except ValueError as e:  # a corrupt file is reported, never silently reset
            raise RuntimeError(f"policy registry {self.path} is corrupt: {e}") from e

    def signature(self) -> tuple[int, int]:
        """Change detector, cheap enough to call before every sampling batch: (inode, revision).

        Every write bumps `revision` and replaces the file (a new inode), so no change is missed
        even when two writes land within one mtime tick. (0, 0) when there is no registry yet.
        """
        try:
            with open(self.path, "rb") as f:
                ino = os.fstat(f.fileno()).st_ino
                rev = json.loads(f.read()).get("revision", 0)
        except FileNotFoundError:
            return (0, 0)
        except ValueError:
            return (-1, -1)  # corrupt: current() will say so
        return (ino, int(rev))

    def list(self) -> list[PolicyRecord]:
        return sorted(self._read().versions.values(), key=lambda r: r.created_at)

    def get(self, version: str) -> PolicyRecord:
        return _record(self._read(), version)

    def current(self) -> PolicyRecord | None:
        """The serving version, or None when the base model serves."""
        reg = self._read()
        return reg.versions[reg.current] if reg.current else None

    def current_version(self) -> str:
        rec = self.current()
        return rec.version if rec else BASE_VERSION

    # -- writing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _edit(self) -> Iterator[_RegistryFile]:
        """Lock, read, let the caller change, then write atomically (tmp + fsync + rename)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            reg = self._read()
            yield reg
            reg.revision += 1
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "w") as f:
                f.write(reg.model_dump_json(indent=2))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    @staticmethod
    def _set(rec: PolicyRecord, status: PolicyStatus, reason: str) -> None:
        rec.status = status
        rec.history.append({"at": time.time(), "status": status, "reason": reason})

    def register(self, version: str, adapter_path: str | Path | None, *, parent: str | None = None,
                 base_model: str | None = None, cycle: str | None = None,
                 evaluation: dict[str, Any] | None = None) -> PolicyRecord:
        """Add a candidate. Idempotent for the same (version, adapter_path); a clash raises."""
        if not version or version == BASE_VERSION:
            raise ValueError(f"invalid policy version name {version!r}")
        path = str(Path(adapter_path).resolve()) if adapter_path is not None else None
        if path is not None and not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {path}")
        with self._edit() as reg:
            if version in reg.versions:
                old = reg.versions[version]
                if old.adapter_path != path:
                    raise ValueError(f"policy version {version!r} already registered with {old.adapter_path}")
                if evaluation:
                    old.evaluation.update(evaluation)
                return old
            rec = PolicyRecord(version=version, adapter_path=path, parent=parent, base_model=base_model,
                               cycle=cycle, evaluation=dict(evaluation or {}))
            self._set(rec, "candidate", "registered")
            reg.versions[version] = rec
            return rec

    def promote(self, version: str, reason: str = "") -> PolicyRecord:
        """Make `version` serve. Promoting the serving version again is a no-op."""
        with self._edit() as reg:
            rec = _record(reg, version)
            if reg.current == version:
                return rec
            self._set(rec, "promoted", reason or "promoted")
            reg.current = version
            reg.promotions.append(version)
            return rec

    def reject(self, version: str, reason: str = "") -> PolicyRecord:
        with self._edit() as reg:
            rec = _record(reg, version)
            if reg.current == version:
                raise ValueError(f"{version!r} is serving: roll it back instead of rejecting it")
            self._set(rec, "rejected", reason or "rejected")
            return rec

    def roll_back(self, to: str | None = None, reason: str = "") -> PolicyRecord | None:
        """Retire the serving version (status rolled_back) and serve the previous promoted one.

        With `to`, roll back to that earlier promoted version (or "base"); every version promoted
        after it is marked rolled_back. Returns the record now serving (None: the base model).
        """
        with self._edit() as reg:
            if reg.current is None:
                raise ValueError("nothing to roll back: the base model is serving")
            # promoted versions still standing, by their latest promotion, oldest first
            live = [v for v in reversed(list(dict.fromkeys(reversed(reg.promotions))))
                    if reg.versions[v].status == "promoted"]
            if to is None:
                target = live[-2] if len(live) >= 2 else None
            elif to == BASE_VERSION:
                target = None
            elif to not in live or to == reg.current:
                raise ValueError(f"cannot roll back to {to!r}: not an earlier promoted version")
            else:
                target = to
            cut = live.index(target) + 1 if target else 0
            for v in live[cut:]:
                self._set(reg.versions[v], "rolled_back", reason or "rolled back")
            reg.current = target
            if target:
                reg.promotions.append(target)
            return reg.versions[target] if target else None

    def describe(self) -> dict[str, Any]:
        """A JSON-able view for the API: serving version, order of promotions, all records."""
        reg = self._read()
        return {"current": reg.current or BASE_VERSION, "revision": reg.revision,
                "promotions": reg.promotions,
                "versions": [json.loads(r.model_dump_json()) for r in
                             sorted(reg.versions.values(), key=lambda r: r.created_at)]}
