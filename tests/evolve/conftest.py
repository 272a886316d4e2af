"""Fixtures of the evolve tests: the tiny cold-start policy and a trajectory log made the real way
(simulated users driving `evolve serve` over HTTP through a silent rule shift)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

TOKENS = "evolve-test-tok1=acme"
API_KEY = "evolve-test-tok1"
EPISODES = 16
SERVE_ARGS = ("--max-turns", "4", "--max-new-tokens", "48", "--temperature", "0")


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    import torch

    from training.coldstart import ensure_coldstart

    torch.set_num_threads(2)
    return Path(ensure_coldstart(tmp_path_factory.mktemp("evolve-policy") / "tiny", "tiny", seed=0))


@pytest.fixture(scope="session")
def traffic(tmp_path_factory, tiny_policy) -> dict:
    """A service data folder whose ledger holds EPISODES simulated episodes (shift at 25%)."""
    from evolve.demo_full import schedule
    from evolve.service_proc import Service
    from evolve.simulator.run import SimConfig, simulate

    root = tmp_path_factory.mktemp("evolve-traffic")
    data = root / "service"
    sf = schedule(root, 0.25)
    with Service(data, f"torch:{tiny_policy}", TOKENS, *SERVE_ARGS) as svc:
        res = simulate(SimConfig(url=svc.url, users=2, episodes=EPISODES, stream=str(sf), api_key=API_KEY,
                                 temperature=0.0, max_turns=4, seed=0), progress=False)
    state_a_rule(data)
    return {"data": data, "result": res, "stream": sf, "policy": tiny_policy}


RULE_NOTE = "Refunds are allowed up to 45 days after delivery; above 150 escalate to a human."


def state_a_rule(data: Path) -> None:
    """A rule the tenant stated, tied to its first trajectory. The tiny policy's own traffic mines
    no items, so without it nothing would be recalled and no memory path of the cycle would run."""
    from memory import MemoryService

    mem = MemoryService(data / "memory")
    try:
        first = mem.trajectories().trajectories[0]
        mem.add(first.tenant, RULE_NOTE, kind="task_experience", trajectory_id=first.id)
    finally:
        mem.close()


@pytest.fixture
def data_dir(traffic, tmp_path) -> Path:
    """A private copy of the logged service folder (each test changes its own)."""
    d = tmp_path / "service"
    shutil.copytree(traffic["data"], d)
    return d


@pytest.fixture(scope="session")
def competent(tiny_policy) -> float:
    """Tests that show *learning* need a cold-start policy that can act at all; say so when not."""
    from dynamic_bench import generate_tasks
    from training.engines import make_engine
    from training.rollout import RolloutConfig, rollout

    e = make_engine(f"torch:{tiny_policy}", seed=0)
    trajs = rollout(e, e.tokenizer, generate_tasks("retail", 8, seed=5, split="test"),
                    RolloutConfig(temperature=0.0, max_steps=6, seed=5))
    e.close()
    rate = sum(t.outcome == "success" for t in trajs) / len(trajs)
    if rate == 0:
        pytest.skip("the `tiny` cold-start policy solves 0/8 first-rule tasks here, so no adapter trained "
                    "from it can show a gain; showing learning needs a policy that can act (the `small` preset of `evolve demo`)")
    return rate
