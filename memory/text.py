"""Text helpers shared by dedup, keyword search and the graph: normalising, hashing, terms, entities."""
from __future__ import annotations

import hashlib
import re
from typing import Any

_WS = re.compile(r"\s+")
_TERM = re.compile(r"[a-z0-9][a-z0-9_\-]*")
_ID = re.compile(r"\b[A-Z]{1,5}-\d+\b")  # O-1042, U-7, TCK-12: DriftBench-style ids
_ID_ANYCASE = re.compile(r"\b[A-Za-z]{1,5}-\d+\b")
_NUM = re.compile(r"\d+(?:\.\d+)?")
_TOOL = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*\{")  # `get_order {"order_id": ...}`
STOP = frozenset("a an and are as at be by for from has have i if in is it its of on or that the "
                 "this to was were will with when you your do does not no".split())


def normalise(text: str) -> str:
    return _WS.sub(" ", text.strip().lower())


def text_hash(text: str) -> str:
    """Embedding cache key: the exact text (embeddings depend on case)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def content_hash(tenant: str, kind: str, text: str) -> str:
    """Exact-dedup key: same tenant, kind and normalised text."""
    return hashlib.sha256(f"{tenant}\x1f{kind}\x1f{normalise(text)}".encode()).hexdigest()[:32]


def _stem(t: str) -> str:
    """Crude plural folding ("refunds" ~ "refund"): enough for keyword recall on short notes."""
    if len(t) > 4 and t.endswith("ies"):
        return t[:-3] + "y"
    if len(t) > 3 and t.endswith("s") and not t.endswith("ss") and not t[-2].isdigit():
        return t[:-1]
    return t


def terms(text: str) -> list[str]:
    return [_stem(t) for t in _TERM.findall(text.lower()) if t not in STOP and len(t) > 1]


def signature(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """Ids and numbers: two near-identical texts that differ here say different things
    ("window is 30 days" vs "window is 14 days"), so they must not be merged as duplicates."""
    ids = frozenset(m.upper() for m in _ID_ANYCASE.findall(text))
    return ids, frozenset(_NUM.findall(_ID_ANYCASE.sub(" ", text)))


def extract_entities(text: str, payload: dict[str, Any]) -> list[str]:
    """Graph entities an item mentions: ids in the text, a leading tool call, payload fields."""
    ents: list[str] = [f"id:{m}" for m in _ID.findall(text)]
    if m := _TOOL.match(text):
        ents.append(f"tool:{m.group(1)}")
    for key in ("tool", "user_id", "order_id", "subject", "rule", "task_id", "domain"):
        v = payload.get(key)
        if isinstance(v, (str, int)) and str(v):
            ents.append(f"{key.removesuffix('_id')}:{v}")
    for e in payload.get("entities", []) or []:
        ents.append(str(e))
    return list(dict.fromkeys(ents))
