"""The one action format every agent speaks, and its parser.

One action per agent turn, one line of text: `NAME {json-args}`, e.g.
`get_order {"order_id":"O-1042"}`; a reply to the user is `reply {"text":"..."}`.
`parse_action` never raises: anything it cannot accept comes back as an `ActionError`
whose message is shown to the agent as its next observation (malformed model output is
an observation, not a crash). `format_action` writes the canonical text (compact JSON,
sorted keys), so `parse_action(format_action(a)) == a`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

MAX_ACTION_CHARS = 2000
REPLY = "reply"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DECODER = json.JSONDecoder()
_TYPES = {"str": str, "int": int}
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode
_STR = json.encoder.encode_basestring  # the C string escaper json itself uses


def _canon(args: dict[str, Any]) -> str:
    """Compact sorted-key JSON; a fast path for the flat str/int arguments every tool takes."""
    parts = []
    for k in sorted(args):
        v = args[k]
        if type(v) is str:
            parts.append(_STR(k) + ":" + _STR(v))
        elif type(v) is int:
            parts.append(_STR(k) + ":" + str(v))
        else:
            return _ENCODE(args)
    return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class ToolSpec:
    """A typed tool. `op` is the domain operation behind it (stable across renames)."""

    name: str
    op: str
    args: tuple[tuple[str, str], ...]  # (arg name, "str" | "int"), all required
    is_write: bool
    description: str = ""
    enums: tuple[tuple[str, tuple[str, ...]], ...] = ()  # allowed values of categorical args

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": dict(self.args), "is_write": self.is_write,
                "description": self.description, "enums": {k: list(v) for k, v in self.enums}}

    def signature(self) -> str:
        """Compact one-line form used in prompts: `refund(order_id:str, reason:damaged|unwanted)`."""
        enums = dict(self.enums)
        parts = [f"{a}:{'|'.join(enums[a]) if a in enums else t}" for a, t in self.args]
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:  # canonical text identifies a call
        return hash(format_action(self))


@dataclass(frozen=True)
class Reply:
    text: str


@dataclass(frozen=True)
class ActionError:
    """Why an action was not accepted; `message` is what the agent sees."""

    message: str
    text: str = ""


Action = Union[ToolCall, Reply]


def format_action(action: Action) -> str:
    """Canonical one-line text of an action."""
    if isinstance(action, Reply):
        return REPLY + ' {"text":' + _STR(action.text) + "}"
    return action.name + " " + _canon(action.args)


def action_dict(action: Action | ActionError) -> dict[str, Any] | None:
    """A JSON-able dict of a parsed action (what `schema.Step.action` stores); None for errors."""
    if isinstance(action, Reply):
        return {"name": REPLY, "args": {"text": action.text}}
    if isinstance(action, ToolCall):
        return {"name": action.name, "args": dict(action.args)}
    return None


def parse_action(text: Any, tools: Mapping[str, ToolSpec] | None = None) -> ToolCall | Reply | ActionError:
    """Parse one action. With `tools` (name -> spec), also check tool name, arguments and types."""
    if not isinstance(text, str):
        return ActionError(f"error: action must be text, got {type(text).__name__}", "")
    if len(text) > MAX_ACTION_CHARS:
        return ActionError(f"error: action too long ({len(text)} characters, limit {MAX_ACTION_CHARS})",
                           text[:200])
    s = text.strip()
    if not s:
        return ActionError('error: empty action; write NAME {json-args}, e.g. reply {"text":"..."}', text)
    m = _NAME.match(s)
    if not m:
        return ActionError(f"error: action must start with a tool name, got {s[:30]!r}", text)
    name, rest = m.group(0), s[m.end():].strip()
    if rest and rest[0] not in "{[":
        return ActionError(f"error: after {name} expected JSON arguments starting with '{{'", text)
    args: Any = {}
    if rest:
        try:
            args, end = _DECODER.raw_decode(rest)
        except json.JSONDecodeError as e:
            return ActionError(f"error: bad JSON arguments for {name}: {e.msg} at column {e.colno}", text)
        if not isinstance(args, dict):
            return ActionError(f"error: arguments of {name} must be a JSON object", text)
        if rest[end:].strip():
            return ActionError(f"error: unexpected text after the JSON arguments of {name}", text)
    if name == REPLY:
        return _check_reply(args, text)
    call = ToolCall(name, args)
    return validate_call(call, tools, text) if tools is not None else call


def _check_reply(args: dict[str, Any], text: str) -> Reply | ActionError:
    extra = sorted(set(args) - {"text"})
    if extra:
        return ActionError(f"error: unexpected argument {extra[0]!r} for reply (only text)", text)
    if "text" not in args:
        return ActionError("error: missing required argument 'text' for reply", text)
    if not isinstance(args["text"], str):
        return ActionError("error: argument 'text' of reply must be str", text)
    return Reply(args["text"])


def validate_call(call: ToolCall, tools: Mapping[str, ToolSpec], text: str = "") -> ToolCall | ActionError:
    """Check a call against the tool specs in force; the first problem found is reported."""
    spec = tools.get(call.name)
    if spec is None:
        names = ", ".join(sorted(tools))
        return ActionError(f"error: unknown tool {call.name!r}; tools: {names}, reply", text)
    allowed = dict(spec.args)
    for a in call.args:
        if a not in allowed:
            return ActionError(f"error: unexpected argument {a!r} for {call.name}", text)
    enums = dict(spec.enums)
    for a, t in spec.args:
        if a not in call.args:
            return ActionError(f"error: missing required argument {a!r} for {call.name}", text)
        v = call.args[a]
        if not isinstance(v, _TYPES[t]) or isinstance(v, bool):
            return ActionError(f"error: argument {a!r} of {call.name} must be {t}, got {type(v).__name__}", text)
        if a in enums and v not in enums[a]:
            return ActionError(f"error: argument {a!r} of {call.name} must be one of {'|'.join(enums[a])}", text)
    return call
