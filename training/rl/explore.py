"""Action-level exploration: an engine wrapper whose behaviour policy is a mixture over actions.

Why (PROTOTYPE-FINDINGS 4): after a silent rule shift a confident policy samples the newly right
action with probability ~3e-4, every group has equal rewards and GRPO learns nothing. Token
temperature does not fix it; exploring over *actions* does. With probability ε per agent turn
the wrapper replaces the sampled completion by an alternative valid action drawn from a proposal
distribution u built only from what the agent sees in its prompt: the tools listed there
(`name(arg:type, arg:a|b)` signatures), the ids that appeared in the conversation, the outcome
words of the policy text (for replies).

Behaviour logprobs, the choice (`explore_is`):
  * The behaviour policy really is μ(a) = (1-ε)·π(a) + ε·u(a) over actions. The substituted
    token ids are scored by the engine (`engine.logprobs`) so each token carries π's logprob.
  * "mixture" (honest IS): every explored-able turn's token logprobs are shifted by
    (log μ(a) - log π(a)) / n_tokens, so they sum to log μ(a). The IS correction then weighs a
    substituted action by π/μ ≈ π/(ε·u): exactly unbiased for π's objective, and for the rare
    right action after a shift that weight is tiny (learning stays slow, as the theory says).
  * "policy" (default, deliberately biased): substituted turns carry π's own logprobs, as if π had
    sampled them. The IS weight is then ~1 and a rewarded substitution is learned at full
    strength: an off-policy *guide*, like a correction from a user. The bias is towards actions
    that were tried and rewarded; clip-higher and the KL term bound how far one step goes.
  Every substitution is recorded in `Generation.extra["explore"]` (and counted in `stats`).
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from training.engines.base import Engine, Generation, SamplingParams

_SIG = re.compile(r"\b([a-z_][a-z0-9_]*)\(([^()]*)\)")
_ARG = re.compile(r"\s*([a-z_][a-z0-9_]*)\s*:\s*([^,]+)")
_ID = re.compile(r"\b[A-Z]{1,3}-\d+\b")
_OUTCOMES = re.compile(r"states the outcome:\s*([a-z ,]+?)(?:\.|$)", re.M)


@dataclass
class Proposal:
    """The proposal distribution u over actions for one prompt: tools × argument values."""

    tools: list[tuple[str, list[tuple[str, list]]]]  # (name, [(arg, values)])
    replies: list[str]

    def size(self) -> int:
        return len(self.tools) + (1 if self.replies else 0)

    def draw(self, rng: random.Random) -> tuple[str, float]:
        """(canonical action text, u(action)): a tool (or reply) uniformly, then each arg uniformly."""
        k = rng.randrange(self.size())
        p = 1.0 / self.size()
        if k == len(self.tools):
            word = rng.choice(self.replies)
            return _fmt("reply", {"text": word}), p / len(self.replies)
        name, args = self.tools[k]
        vals = {}
        for a, choices in args:
            vals[a] = rng.choice(choices)
            p /= len(choices)
        return _fmt(name, vals), p

    def prob(self, action_text: str) -> float:
        """u(action) for an arbitrary action text (0 when the proposal cannot produce it)."""
        name, _, rest = action_text.strip().partition(" ")
        try:
            args = json.loads(rest) if rest else {}
        except json.JSONDecodeError:
            return 0.0
        if not isinstance(args, dict):
            return 0.0
        if name == "reply":
            return (1.0 / self.size()) / len(self.replies) if self.replies and args.get("text") in self.replies else 0.0
        for tname, targs in self.tools:
            if tname == name and set(args) == {a for a, _ in targs}:
                p = 1.0 / self.size()
                for a, choices in targs:
                    if args[a] not in choices:
                        return 0.0
                    p /= len(choices)
                return p
        return 0.0


def _log_mixture(log_pi: float, u: float, eps: float) -> float:
    """log μ(a) = log((1-ε)·π(a) + ε·u(a)), stable when π(a) underflows."""
    if u > 0:
        mu = (1 - eps) * math.exp(log_pi) + eps * u
        return math.log(mu)
    return math.log(1 - eps) + log_pi if eps < 1 else float("-inf")


def _fmt(name: str, args: dict) -> str:
    return f"{name} {json.dumps(args, sort_keys=True, separators=(',', ':'))}"


def proposal_from_prompt(text: str) -> Proposal | None:
    """Parse tool signatures, ids and outcome words out of a rendered prompt."""
    ids = sorted(set(_ID.findall(text)))
    nums = sorted({int(x) for x in re.findall(r"\b\d{1,4}\b", text)})[:20]
    tools = []
    for name, argtext in _SIG.findall(text):
        if name == "reply" or any(t[0] == name for t in tools):
            continue
        args, ok = [], True
        for part in filter(None, (x.strip() for x in argtext.split(","))):
            m = _ARG.fullmatch(part)
            if not m:
                ok = False
                break
            a, typ = m.group(1), m.group(2).strip()
            if "|" in typ:
                values: list = typ.split("|")
            elif typ == "int":
                values = nums
            else:
                values = ids
            if not values:
                ok = False
                break
            args.append((a, values))
        if ok:
            tools.append((name, args))
    replies = []
    m = _OUTCOMES.search(text)
    if m:
        replies = [w for w in re.split(r",\s*|\s+or\s+", m.group(1).strip()) if w]
    if not tools and not replies:
        return None
    return Proposal(tools, replies)


@dataclass
class ExploringEngine(Engine):
    """Wraps an engine; with probability `eps` per prompt substitutes an alternative action."""

    inner: Engine
    tokenizer: object
    eps: float = 0.1
    mode: str = "policy"  # "policy" | "mixture" (see module doc)
    completion_text: Callable[[str], str] = lambda action: action + "<|end|>"  # the scaffold's
    rng: random.Random = field(default_factory=random.Random)
    stats: dict = field(default_factory=lambda: {"turns": 0, "explored": 0})
    temperature: float = 1.0

    @property
    def policy_version(self) -> str:  # type: ignore[override]
        return self.inner.policy_version

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def load_adapter(self, adapter_path: str | None, version: str) -> None:
        self.inner.load_adapter(adapter_path, version)

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        return self.inner.logprobs(prompt_ids, completion_ids)

    def close(self) -> None:
        self.inner.close()

    def _score(self, prompt: Sequence[int], ids: list[int]) -> list[float]:
        try:
            return self.inner.logprobs(prompt, ids, temperature=self.temperature)  # type: ignore[call-arg]
        except TypeError:
            return self.inner.logprobs(prompt, ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.temperature = params.temperature if params.temperature > 0 else 1.0
        # Decide first which turns explore, so the engine only samples the others.
        props, subs = [], []
        for prompt in prompts:
            self.stats["turns"] += 1
            roll = self.rng.random()
            prop = None
            if self.eps > 0:
                prop = proposal_from_prompt(self.tokenizer.decode(list(prompt), skip_special_tokens=False))
            props.append(prop)
            subs.append(prop is not None and roll < self.eps)
        sampled = iter(self.inner.generate([p for p, s in zip(prompts, subs) if not s], params)
                       if not all(subs) else [])
        out = []
        for prompt, prop, sub in zip(prompts, props, subs):
            if prop is None:
                out.append(next(sampled))
                continue
            if sub:
                text, u = prop.draw(self.rng)
                ids = list(self.tokenizer.encode(self.completion_text(text), add_special_tokens=False))
                gen = Generation(token_ids=ids, logprobs=self._score(prompt, ids), finish_reason="stop",
                                 policy_version=self.inner.policy_version,
                                 extra={"explore": {"substituted": True, "action": text}})
                self.stats["explored"] += 1
            else:
                gen = next(sampled)
                u = prop.prob(self.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
                gen.extra = {**gen.extra, "explore": {"substituted": False}}
            log_pi = sum(gen.logprobs)
            log_mu = _log_mixture(log_pi, u, self.eps)
            gen.extra["explore"].update(log_pi=log_pi, log_mu=log_mu, u=u)
            if self.mode == "mixture" and gen.logprobs:
                shift = (log_mu - log_pi) / len(gen.logprobs)
                gen.logprobs = [x + shift for x in gen.logprobs]
            out.append(gen)
        return out
