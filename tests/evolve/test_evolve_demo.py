"""The demo report's wording of recovery: a count where the arm recovered, "never" where it did not."""
from __future__ import annotations

from dynamic_bench import make_stream, metrics
from evolve.demo import recovery_text
from evolve.demo_full import schedule


def test_recovery_reads_never_where_the_arm_did_not_recover(tmp_path):
    stream = make_stream(str(schedule(tmp_path)), "retail", 40, 0)
    start = stream.phases[1]["start"]
    window = 4
    recovered = [1.0] * 40
    stuck = [1.0] * start + [0.0] * (40 - start)
    late = [1.0] * start + [0.0] * 6 + [1.0] * (34 - start)
    assert recovery_text(metrics.recovery_episodes(recovered, stream, window), stream) == "0"
    assert recovery_text(metrics.recovery_episodes(stuck, stream, window), stream) == "never"
    assert recovery_text(metrics.recovery_episodes(late, stream, window), stream) == "6"
    assert recovery_text([None], stream) == "n/a"
