"""Sample scheduler: spend rollouts where they teach something.

A task whose group rewards are all equal gives GRPO no gradient. Tasks the policy always solves
are *retired* for a while, tasks it never solves are *circuit-broken* for a while (with
exponential back-off if they keep failing), and both come back later with a little *heat*
(priority) so they are re-checked promptly: the policy or the rules may have changed meanwhile.
Rollouts per task adapt to variance: the group size is the smallest G with a chance of an
all-equal group below `target_zero_var`. A `replay_share` of each draw comes from older-rule tasks
to limit forgetting. The evolve cycle weights its RL task pool with `learning_value(task_id)`.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

ACTIVE, RETIRED, BROKEN = "active", "retired", "broken"


@dataclass
class SchedulerConfig:
    ema: float = 0.3  # weight of the newest group in the running success rate
    min_attempts: int = 8  # samples seen before a task may be retired or broken
    retire_above: float = 0.95
    break_below: float = 0.05
    cooldown: int = 10  # clock ticks (learner steps) a task sits out
    max_backoff: int = 8  # cooldown multiplier cap for repeat offenders
    heat: float = 0.25  # learning-value bonus for a task that just came back, halves each tick
    group_min: int = 4
    group_max: int = 16
    target_zero_var: float = 0.3
    replay_share: float = 0.2
    success_reward: float = 1.0  # reward at or above which a sample counts as solved
    max_benched: float = 0.5  # never bench more than this share of a pool (current or replay) at once


@dataclass
class TaskStats:
    replay: bool = False
    attempts: int = 0
    success: float = 0.5  # running success rate (prior: unknown = 0.5)
    reward_var: float = 0.0  # running within-group reward variance
    status: str = ACTIVE
    until: int = 0  # clock tick at which a retired/broken task returns
    strikes: int = 0  # times retired or broken, for back-off
    heat: float = 0.0


@dataclass
class TaskScheduler:
    cfg: SchedulerConfig = field(default_factory=SchedulerConfig)
    tasks: dict[str, TaskStats] = field(default_factory=dict)
    clock: int = 0

    def add_task(self, task_id: str, replay: bool = False) -> None:
        """Register a task (replay=True: an older-rule task kept to limit forgetting)."""
        if task_id not in self.tasks:
            self.tasks[task_id] = TaskStats(replay=replay)

    # ---- feedback -------------------------------------------------------------------------
    def update(self, task_id: str, rewards: Sequence[float], successes: Sequence[bool] | None = None) -> None:
        """Fold one group's outcomes into the task's running statistics and maybe bench it."""
        if not rewards:
            return
        st = self.tasks.setdefault(task_id, TaskStats())
        if successes is None:
            successes = [r >= self.cfg.success_reward for r in rewards]
        rate = sum(map(bool, successes)) / len(successes)
        mean = sum(rewards) / len(rewards)
        var = sum((r - mean) ** 2 for r in rewards) / len(rewards)
        a = self.cfg.ema if st.attempts else 1.0
        st.success = (1 - a) * st.success + a * rate
        st.reward_var = (1 - a) * st.reward_var + a * var
        st.attempts += len(rewards)
        if st.status != ACTIVE or st.attempts < self.cfg.min_attempts:
            return
        if st.success >= self.cfg.retire_above and self._may_bench(st):
            self._bench(st, RETIRED)
        elif st.success <= self.cfg.break_below and self._may_bench(st):
            self._bench(st, BROKEN)
        elif self.cfg.break_below < st.success < self.cfg.retire_above:
            st.strikes = 0

    def _may_bench(self, st: TaskStats) -> bool:
        """Benching is for outliers: when most of a pool is already out (right after a shift every
        task fails), the rest stays in play rather than the whole pool sitting out."""
        pool = [s for s in self.tasks.values() if s.replay == st.replay]
        benched = sum(s.status != ACTIVE for s in pool)
        return benched + 1 <= self.cfg.max_benched * len(pool)

    def _bench(self, st: TaskStats, status: str) -> None:
        st.strikes += 1
        st.status = status
        st.until = self.clock + self.cfg.cooldown * min(2 ** (st.strikes - 1), self.cfg.max_backoff)

    def tick(self, steps: int = 1) -> None:
        """Advance the clock; benched tasks whose time is up return with heat."""
        for _ in range(steps):
            self.clock += 1
            for st in self.tasks.values():
                st.heat *= 0.5
                if st.status != ACTIVE and self.clock >= st.until:
                    st.status = ACTIVE
                    st.heat = self.cfg.heat
                    # Re-judge from fresh evidence; keep the old estimate as the prior.
                    st.attempts = 0

    # ---- decisions ------------------------------------------------------------------------
    def learning_value(self, task_id: str) -> float:
        """Expected GRPO signal of a task: Bernoulli variance p(1-p) plus heat; 0 while benched."""
        st = self.tasks.get(task_id)
        if st is None:
            return 0.25  # never seen: as uncertain as it gets
        if st.status != ACTIVE:
            return 0.0
        p = st.success
        return max(p * (1 - p), st.reward_var, 0.01) + st.heat

    def group_size(self, task_id: str) -> int:
        """Smallest G whose chance of an all-equal group, p^G + (1-p)^G, is below the target."""
        st = self.tasks.get(task_id)
        p = 0.5 if st is None else min(max(st.success, 1e-3), 1 - 1e-3)
        for g in range(self.cfg.group_min, self.cfg.group_max + 1):
            if p**g + (1 - p) ** g <= self.cfg.target_zero_var:
                return g
        return self.cfg.group_max

    def sample(self, n: int, rng: random.Random) -> list[str]:
        """Draw n task ids (with replacement) by learning value; a replay share from old-rule tasks."""
        current = [t for t, s in self.tasks.items() if not s.replay]
        replay = [t for t, s in self.tasks.items() if s.replay]
        # floor(n * share), plus one more with the fractional chance: unbiased for the one-task draws
        # the RL runner makes (rounding gave a share of 0.4 no replay at all, 0.75 only replay)
        whole, frac = divmod(n * self.cfg.replay_share, 1.0)
        n_replay = int(whole) + (rng.random() < frac) if replay and current else (n if not current else 0)
        return self._draw(replay, n_replay, rng) + self._draw(current, n - n_replay, rng)

    def _draw(self, pool: list[str], n: int, rng: random.Random) -> list[str]:
        if n <= 0 or not pool:
            return []
        weights = [self.learning_value(t) for t in pool]
        if sum(weights) <= 0:  # everything benched: take the ones returning soonest
            soonest = min(self.tasks[t].until for t in pool)
            pool = [t for t in pool if self.tasks[t].until == soonest]
            weights = [1.0] * len(pool)
        return rng.choices(pool, weights=weights, k=n)

    # ---- persistence / diagnostics ----------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out = {ACTIVE: 0, RETIRED: 0, BROKEN: 0}
        for st in self.tasks.values():
            out[st.status] += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"clock": self.clock, "cfg": asdict(self.cfg), "tasks": {t: asdict(s) for t, s in self.tasks.items()}}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "TaskScheduler":
        return cls(cfg=SchedulerConfig(**state["cfg"]), clock=state["clock"],
                   tasks={t: TaskStats(**s) for t, s in state["tasks"].items()})
