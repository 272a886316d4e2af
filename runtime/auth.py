"""Token auth: each API token maps to one tenant; some tokens are admins.

Tokens come from `<data_dir>/tokens.json` and/or the `EVOLVE_TOKENS` environment variable:

    {"tokens": [{"token": "s3cret", "tenant": "acme"},
                {"token": "root-tok", "tenant": "ops", "admin": true}]}

`EVOLVE_TOKENS` holds the same JSON, or the short form `s3cret=acme,root-tok=ops:admin`.
A request carries its token as `Authorization: Bearer …` or as `x-api-key: …` (what
`langgraph_sdk.get_client(api_key=…)` sends). Tokens are kept only as SHA-256 digests.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

TOKENS_FILE = "tokens.json"
TOKENS_ENV = "EVOLVE_TOKENS"
_TENANT = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant every read and write is scoped to, and whether admin."""

    tenant: str
    admin: bool = False


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _parse(text: str, source: str) -> list[dict]:
    text = text.strip()
    if not text:
        return []
    if text.startswith("{") or text.startswith("["):
        data = json.loads(text)
        entries = data["tokens"] if isinstance(data, dict) else data
    else:  # short form: tok=tenant[:admin],...
        entries = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            tok, sep, rest = part.partition("=")
            if not sep:
                raise ValueError(f"{source}: expected token=tenant[:admin], got {part!r}")
            tenant, _, flag = rest.partition(":")
            entries.append({"token": tok, "tenant": tenant, "admin": flag == "admin"})
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("token"), str) or len(e["token"]) < 8:
            raise ValueError(f"{source}: every entry needs a token of at least 8 characters")
        if not isinstance(e.get("tenant"), str) or not _TENANT.match(e["tenant"]):
            raise ValueError(f"{source}: tenant must match {_TENANT.pattern}, got {e.get('tenant')!r}")
    return entries


class TokenAuth:
    """Look up a principal by token (digest comparison; no plaintext kept)."""

    def __init__(self, entries: list[dict]):
        self._by_digest = {_digest(e["token"]): Principal(e["tenant"], bool(e.get("admin", False)))
                           for e in entries}

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def load(cls, data_dir: str | Path, env: Mapping[str, str] | None = None) -> "TokenAuth":
        env = os.environ if env is None else env
        entries: list[dict] = []
        path = Path(data_dir) / TOKENS_FILE
        if path.exists():
            entries += _parse(path.read_text(), str(path))
        if env.get(TOKENS_ENV):
            entries += _parse(env[TOKENS_ENV], TOKENS_ENV)
        return cls(entries)

    @staticmethod
    def bootstrap(data_dir: str | Path, tenant: str = "admin") -> str:
        """Write a tokens file with one fresh admin token (first start); returns the token."""
        token = secrets.token_urlsafe(24)
        path = Path(data_dir) / TOKENS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"tokens": [{"token": token, "tenant": tenant, "admin": True}]}, f, indent=2)
        return token

    def authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        """The principal for a request's headers, or None (missing or unknown token)."""
        token = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            token = auth[7:].strip()
        if not token:
            return None
        return self._by_digest.get(_digest(token))
