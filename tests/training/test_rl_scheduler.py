"""The sample scheduler retires, circuit-breaks and reinstates tasks, and adapts group sizes."""
from __future__ import annotations

import random
from collections import Counter

from training.rl.scheduler import BROKEN, RETIRED, SchedulerConfig, TaskScheduler


def _sched(**kw) -> TaskScheduler:
    kw.setdefault("max_benched", 1.0)
    s = TaskScheduler(SchedulerConfig(min_attempts=8, cooldown=5, **kw))
    for t in ("easy", "hard", "mid"):
        s.add_task(t)
    return s


def test_always_solved_is_retired_never_solved_is_broken_and_both_return():
    s = _sched()
    for _ in range(2):
        s.update("easy", [1.0] * 4)
        s.update("hard", [0.0] * 4)
        s.update("mid", [1.0, 0.0, 1.0, 0.0])
    assert s.tasks["easy"].status == RETIRED
    assert s.tasks["hard"].status == BROKEN
    assert s.tasks["mid"].status == "active"
    assert s.learning_value("easy") == 0.0 and s.learning_value("hard") == 0.0
    assert s.learning_value("mid") > 0.2
    assert set(s.sample(50, random.Random(0))) == {"mid"}
    s.tick(4)
    assert s.tasks["easy"].status == RETIRED
    s.tick(1)
    assert s.tasks["easy"].status == "active" and s.tasks["hard"].status == "active"
    # heat compensation: a returning task is briefly preferred over its steady-state value
    assert s.learning_value("easy") > 0.2
    assert s.counts() == {"active": 3, "retired": 0, "broken": 0}


def test_repeat_offenders_back_off_exponentially():
    s = _sched()
    s.update("hard", [0.0] * 8)
    first = s.tasks["hard"].until - s.clock
    s.tick(first)
    s.update("hard", [0.0] * 8)
    assert s.tasks["hard"].status == BROKEN
    assert s.tasks["hard"].until - s.clock == 2 * first


def test_a_task_that_starts_succeeding_stays_in_play():
    s = _sched()
    s.update("hard", [0.0] * 8)
    s.tick(5)
    s.update("hard", [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert s.tasks["hard"].status == "active"


def test_group_size_adapts_to_success_rate():
    s = _sched(group_min=2, group_max=16, target_zero_var=0.3)
    s.tasks["mid"].success = 0.5
    s.tasks["easy"].success = 0.9
    s.tasks["hard"].success = 0.02
    assert s.group_size("mid") == 3  # 2 * 0.5^3 = 0.25
    assert s.group_size("mid") < s.group_size("easy") <= s.group_size("hard") == 16
    p = 0.9
    g = s.group_size("easy")
    assert p**g + (1 - p) ** g <= 0.3 < p ** (g - 1) + (1 - p) ** (g - 1)


def test_replay_share_and_learning_value_weighting():
    s = TaskScheduler(SchedulerConfig(replay_share=0.25))
    for i in range(4):
        s.add_task(f"new{i}")
        s.add_task(f"old{i}", replay=True)
    s.tasks["new0"].success = 0.5
    s.tasks["new1"].success = 0.97  # near-solved: little to learn
    ids = s.sample(400, random.Random(1))
    assert sum(t.startswith("old") for t in ids) == 100
    c = Counter(ids)
    assert c["new0"] > 3 * c["new1"]
    assert s.sample(10, random.Random(5)) == s.sample(10, random.Random(5))


def test_replay_share_holds_for_one_task_draws():
    """The RL runner draws one task per work order: the share must hold over those draws too."""
    s = TaskScheduler(SchedulerConfig(replay_share=0.4))
    for i in range(4):
        s.add_task(f"new{i}")
        s.add_task(f"old{i}", replay=True)
    rng = random.Random(2)
    ids = [s.sample(1, rng)[0] for _ in range(1000)]
    assert 0.35 < sum(t.startswith("old") for t in ids) / 1000 < 0.45


def test_state_round_trips():
    s = _sched()
    s.update("easy", [1.0] * 8)
    s.tick(2)
    r = TaskScheduler.from_state_dict(s.state_dict())
    assert r.state_dict() == s.state_dict()
    assert r.sample(20, random.Random(3)) == s.sample(20, random.Random(3))


def test_a_failing_pool_is_not_benched_wholesale():
    """Right after a shift every task fails: only up to `max_benched` of the pool sits out."""
    s = TaskScheduler(SchedulerConfig(min_attempts=4, max_benched=0.5))
    for i in range(6):
        s.add_task(f"t{i}")
        s.add_task(f"old{i}", replay=True)
    for i in range(6):
        s.update(f"t{i}", [0.0] * 4)
    assert s.counts()["broken"] == 3
    assert len(set(s.sample(60, random.Random(0))) - {f"old{i}" for i in range(6)}) == 3
    s.update("old0", [1.0] * 4)  # the replay pool has its own budget
    assert s.tasks["old0"].status == RETIRED
