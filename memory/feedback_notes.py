"""What users' feedback says, as memory notes: the same text online (the runtime, after each
judged episode) and in the nightly cycle's mining, so the two dedupe into one item.

Notes are about a kind of request, never one order: ids are masked. Why: the policy copies ids it
sees, and an online note that quoted one user's order and id (merged by dedup with every similar
note after it) made the served agent look that user up in every later episode.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from dynamic_bench.actions import Reply, ToolCall, parse_action
from dynamic_bench.schema import CORRECTION_KINDS, Feedback
from memory.text import _ID  # DriftBench-style ids (O-1042, U-7), as entity extraction reads them
from runtime.scaffolds import pack_notes

_NUM = re.compile(r"\d+")


def mask(text: str) -> str:
    """Ids replaced by '#'."""
    return _ID.sub("#", text)


def template(instruction: str) -> str:
    """The kind of request: ids and numbers masked."""
    return _NUM.sub("N", mask(instruction)).strip()


def applies_to(payload: dict[str, Any], request_template: str) -> bool:
    """Whether an item made for one kind of request (its payload's `template`) applies to a request
    of `request_template` (`template(instruction)`, computed once per recall by the caller).
    Why: recall is by similarity, and request templates differ by a word ("refund" vs "exchange"):
    a demo refund request recalled "for a request like 'I want to exchange…', get_order then exchange
    then reply succeeded", followed it, and failed. Items without a template (rules users stated,
    tool notes) apply to every request; so does everything when there is no instruction (a chat)."""
    want = payload.get("template")
    return not want or not request_template or want == request_template


def tool_name(action_text: str) -> str | None:
    """The tool an action text calls ('reply' for a reply, None when unparsable)."""
    a = parse_action(action_text)
    return a.name if isinstance(a, ToolCall) else ("reply" if isinstance(a, Reply) else None)


def rule_statements(text: str) -> list[str]:
    """A user's reason, split into single statements ("no. a; b" → ["a", "b"])."""
    body = re.sub(r"^\s*(no|nope)[.,:!]?\s*", "", text.strip(), flags=re.I)
    return [s.strip().rstrip(".") for s in re.split(r"[;\n]", body) if len(s.strip()) > 3]


def feedback_notes(feedback: Iterable[Feedback], instruction: str) -> list[dict[str, Any]]:
    """Note specs (kind, text, step, evidence, source, payload) from one episode's feedback: the
    statements a user gave when rejecting (source "user": their words), packed as the cold start's
    memory examples are (`pack_notes`: one per item up to four, then two or more per item), so
    that one recall of k=3 items carries a whole reason; and "use B instead of A"
    per correction that changed the tool (source "agent": our generalisation of one correction,
    which can be wrong, e.g. when the amount decided it, so outcomes may invalidate it). Plain
    approvals and bare rejections say nothing a note could carry."""
    out = []
    for f in feedback:
        if f.kind == "respond" and f.payload.get("text"):
            said = rule_statements(str(f.payload["text"]))
            for text in pack_notes([f"Rule: {st}." for st in said]):
                out.append(dict(kind="task_experience", text=text, step=f.step, source="user",
                                evidence=f"user said {f.payload['text']!r} rejecting {f.payload.get('proposed')}",
                                payload={"type": "rule", "statements": said}))
        elif f.kind in CORRECTION_KINDS and f.payload.get("action"):
            a, b = tool_name(str(f.payload.get("proposed", ""))), tool_name(str(f.payload["action"]))
            if a and b and a != b:
                verb = "replace" if f.kind == "edit" else "do"
                kind_of_request = template(instruction)
                out.append(dict(kind="task_experience", step=f.step, source="agent",
                                text=f"Rule: when you would {a} for a request like '{kind_of_request}', "
                                     f"users {verb} {b} instead.",
                                evidence=f"{f.kind}: {f.payload.get('proposed')} -> {f.payload['action']}",
                                payload={"type": "correction", "from": a, "to": b,
                                         "template": kind_of_request}))
    return out
