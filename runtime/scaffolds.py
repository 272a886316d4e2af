"""Prompt scaffolds shared by training and the runtime, so a prompt is rendered one way everywhere.

A prompt is a sequence of text segments, each starting (or ending) at a turn-structure special
token, so encoding the segments one by one gives exactly the ids of encoding the whole text:

    <s><|system|>POLICY<|tools|>SIGNATURES<|memory|>- NOTE ...     header
    <|user|>USER MESSAGE<|assistant|>                             a user turn, then the cue
    [plan: SHORT PLAN\n]ACTION<|end|>                              a completion (sampled)
    <|obs|>OBSERVATION<|assistant|>                                an observation, then the cue

`direct` acts at once; `plan_act` first writes one `plan:` line, then the action line. Rollouts
(training/rollout.py) append sampled ids and encoded observation segments (token in, token out);
the runtime renders a `Context` with `encode_prompt`. Old turns are dropped first when a prompt
does not fit the model's context. Pure Python: depends only on dynamic_bench.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from dynamic_bench.actions import ToolSpec

SYSTEM, TOOLS, MEMORY, USER, ASSISTANT, OBS, END = (
    "<|system|>", "<|tools|>", "<|memory|>", "<|user|>", "<|assistant|>", "<|obs|>", "<|end|>",
)
MAX_MEMORY_ITEMS = 4
MAX_ITEM_CHARS = 240
MAX_OBS_CHARS = 400
PLAN_PREFIX = "plan:"


@dataclass
class Context:
    """What a prompt shows: rules, tools, retrieved memory, and the turns so far.

    `history` holds `(role, text)` with role `user` (a user message), `assistant` (an action
    text, or a whole completion text) or `obs` (a tool result or error). `plan` is kept for
    callers that track one; the scaffolds do not render it (the plan is the model's to write).
    """

    policy_text: str = ""
    tools: Sequence[ToolSpec | dict[str, Any]] = ()
    memory: Sequence[str] = ()
    history: Sequence[tuple[str, str]] = ()
    plan: str | None = None


def tool_signature(tool: ToolSpec | dict[str, Any]) -> str:
    """`refund(order_id:str, reason:damaged|unwanted)` from a ToolSpec or its `to_dict()` form."""
    if isinstance(tool, ToolSpec):
        return tool.signature()
    enums = tool.get("enums", {})
    parts = [f"{a}:{'|'.join(enums[a]) if a in enums else t}" for a, t in tool["args"].items()]
    return f"{tool['name']}({', '.join(parts)})"


def pack_notes(notes: list[str], prefix: str = "") -> list[str]:
    """`notes` joined with "; " into at most `MAX_MEMORY_ITEMS` items (what a prompt shows), each
    `prefix` + statements; if an item would be clipped, the notes one per item (the first ones).
    The cold start's memory examples and the items a user's reason becomes are packed alike."""
    k = max(1, math.ceil(len(notes) / MAX_MEMORY_ITEMS))
    items = [prefix + "; ".join(notes[i:i + k]) for i in range(0, len(notes), k)]
    return items if all(len(x) <= MAX_ITEM_CHARS for x in items) else [prefix + n for n in notes][:MAX_MEMORY_ITEMS]


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


@dataclass
class Scaffold:
    """How prompts are laid out and completions read. Subclasses change the completion format."""

    name: str = "direct"
    format_hint: str = "Answer with one action."  # tells the model which completion format to write
    max_memory_items: int = MAX_MEMORY_ITEMS
    bos: bool = True
    _sep: str = field(default="\n", repr=False)

    # -- rendering (text) --------------------------------------------------------------------
    def header_text(self, policy_text: str, tools: Sequence[ToolSpec | dict], memory: Sequence[str]) -> str:
        sigs = "\n".join(tool_signature(t) for t in tools) + "\nreply(text:str)"
        items = [_clip(m, MAX_ITEM_CHARS) for m in list(memory)[: self.max_memory_items]]
        notes = "\n".join(f"- {m}" for m in items) if items else "none"
        return f"{SYSTEM}{policy_text.strip()}\n{self.format_hint}{TOOLS}{sigs}{MEMORY}{notes}"

    def user_text(self, text: str) -> str:
        return f"{USER}{_clip(text, MAX_OBS_CHARS)}{ASSISTANT}"

    def obs_text(self, text: str, after_unfinished: bool = False) -> str:
        """An observation segment; `after_unfinished` closes a completion that hit its length limit."""
        return f"{END if after_unfinished else ''}{OBS}{_clip(text, MAX_OBS_CHARS)}{ASSISTANT}"

    def completion_text(self, action_text: str, plan: str | None = None) -> str:
        """The target a model should write for `action_text` (SFT data, history rendering)."""
        return f"{action_text.strip()}{END}"

    def parse_completion(self, text: str) -> tuple[str, str | None]:
        """(action text, plan or None) from a decoded completion (special tokens removed or not)."""
        text = text.split(END)[0]
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        acts = [ln for ln in lines if not ln.lower().startswith(PLAN_PREFIX)]
        return (acts[0] if acts else ""), None

    # -- segments and ids ---------------------------------------------------------------------
    def turn_segments(self, history: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """(role, segment text) for each history entry; consecutive user/obs entries are merged."""
        segs: list[tuple[str, str]] = []
        for role, text in history:
            if role == "assistant":
                if text.rstrip().endswith(END):
                    segs.append(("assistant", text))
                else:
                    segs.append(("assistant", self.completion_text(text)))
            elif role == "user":
                segs.append(("user", self.user_text(text)))
            else:
                segs.append(("obs", self.obs_text(text)))
        merged: list[tuple[str, str]] = []
        for role, s in segs:  # two context turns in a row: drop the first one's cue
            if merged and merged[-1][0] != "assistant" and role != "assistant":
                merged[-1] = (merged[-1][0], merged[-1][1][: -len(ASSISTANT)] + s)
            else:
                merged.append((role, s))
        return merged

    def prompt_text(self, ctx: Context) -> str:
        """The whole prompt as text (for display and logs; models get `encode_prompt`)."""
        head = self.header_text(ctx.policy_text, ctx.tools, ctx.memory)
        return head + "".join(s for _, s in self.turn_segments(ctx.history or [("user", "")]))

    def encode_prompt(self, tokenizer, ctx: Context, max_tokens: int | None = None) -> list[int]:
        """Token ids of the prompt, segment by segment; the oldest turns go first if over `max_tokens`."""
        head = self.encode(tokenizer, self.header_text(ctx.policy_text, ctx.tools, ctx.memory), first=True)
        segs = [self.encode(tokenizer, s) for _, s in self.turn_segments(ctx.history or [("user", "")])]
        keep = fit_turns(len(head), [len(s) for s in segs], max_tokens)
        return head + [t for s in segs[:1] + segs[keep:] for t in s]

    def encode(self, tokenizer, text: str, first: bool = False) -> list[int]:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if first and self.bos and getattr(tokenizer, "bos_token_id", None) is not None:
            ids = [tokenizer.bos_token_id] + ids
        return ids


def without_memory(tokenizer, prompt_ids: Sequence[int]) -> list[int] | None:
    """The same prompt with its memory section emptied (`none`), or None if it showed no memory.

    Memory distillation (evolve/stages.py): a logged step that succeeded *with* retrieved memory
    becomes a training example *without* it, so the policy needs the memory less. Only the ids
    between `<|memory|>` and the first `<|user|>` change: segments start at special tokens, so the
    result equals encoding the header with no memory (tested)."""
    mem, user = tokenizer.convert_tokens_to_ids(MEMORY), tokenizer.convert_tokens_to_ids(USER)
    ids = list(prompt_ids)
    i = ids.index(mem) + 1 if mem in ids else len(ids)
    if user not in ids[i:]:
        return None
    j = ids.index(user, i)
    none = list(tokenizer.encode("none", add_special_tokens=False))
    if ids[i:j] == none:
        return None
    return ids[:i] + none + ids[j:]


def fit_turns(head_len: int, seg_lens: Sequence[int], max_tokens: int | None) -> int:
    """Index of the first turn segment to keep after segment 0 (the user's request, always kept).

    Segments after the first come in (completion, observation) pairs; the oldest pairs are
    dropped until the prompt fits `max_tokens` (the newest segment is always kept).
    """
    keep = 1
    if max_tokens is None:
        return keep
    total = head_len + sum(seg_lens)
    while total > max_tokens and keep + 2 < len(seg_lens):
        total -= seg_lens[keep] + seg_lens[keep + 1]
        keep += 2
    return keep


@dataclass
class PlanActScaffold(Scaffold):
    """The model writes `plan: ...` on one line, then the action line."""

    name: str = "plan_act"
    format_hint: str = "Answer with a plan line, then one action."

    def completion_text(self, action_text: str, plan: str | None = None) -> str:
        return f"{PLAN_PREFIX} {(plan or 'act').strip()}\n{action_text.strip()}{END}"

    def parse_completion(self, text: str) -> tuple[str, str | None]:
        text = text.split(END)[0]
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        plan = next((ln[len(PLAN_PREFIX):].strip() for ln in lines if ln.lower().startswith(PLAN_PREFIX)), None)
        acts = [ln for ln in lines if not ln.lower().startswith(PLAN_PREFIX)]
        return (acts[0] if acts else ""), plan


SCAFFOLDS: dict[str, Scaffold] = {"direct": Scaffold(), "plan_act": PlanActScaffold()}


def get(name: str) -> Scaffold:
    """The scaffold called `name` (`direct` or `plan_act`)."""
    if name not in SCAFFOLDS:
        raise KeyError(f"unknown scaffold {name!r}; scaffolds: {sorted(SCAFFOLDS)}")
    return SCAFFOLDS[name]
