"""Fixtures of the evolve tests: the tiny cold-start policy and a trajectory log made the real way
(simulated users driving `evolve serve` over HTTP through a silent rule shift)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

TOKENS = "evolve-test-tok1=acme"
API_KEY = "evolve-test-tok1"
EPISODES = 24
SERVE_ARGS = ("--max-turns", "6", "--max-new-tokens", "48", "--temperature", "0")


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
                                 temperature=0.0, max_turns=6, seed=0), progress=False)
    return {"data": data, "result": res, "stream": sf, "policy": tiny_policy}


@pytest.fixture
def data_dir(traffic, tmp_path) -> Path:
    """A private copy of the logged service folder (each test changes its own)."""
    d = tmp_path / "service"
    shutil.copytree(traffic["data"], d)
    return d
