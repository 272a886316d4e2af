"""Staleness bound η and the adapter channel."""
from __future__ import annotations

import threading

import pytest

from training.rl.async_rl import AdapterChannel, StalenessGate


def test_samples_older_than_eta_are_rejected_and_counted():
    gate = StalenessGate(eta=2)
    assert gate.admit(5, 5) and gate.admit(4, 5) and gate.admit(3, 5)
    assert not gate.admit(2, 5) and not gate.admit(0, 5)
    assert (gate.admitted, gate.rejected) == (3, 2)
    assert dict(gate.histogram) == {0: 1, 1: 1, 2: 1}
    with pytest.raises(ValueError):
        gate.admit(6, 5)
    restored = StalenessGate(eta=2)
    restored.load_state_dict(gate.state_dict())
    assert restored.state_dict() == gate.state_dict()


def test_eta_zero_is_synchronous():
    gate = StalenessGate(eta=0)
    assert gate.admit(7, 7)
    assert not gate.admit(6, 7)


def test_adapter_channel_publishes_atomically(tmp_path):
    ch = AdapterChannel(tmp_path)
    assert ch.poll() == (None, 0)
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            seen.append(ch.poll())  # never a torn or missing file

    t = threading.Thread(target=reader)
    t.start()
    for v in range(1, 200):
        ch.publish(tmp_path / f"v{v}", v)
    stop.set()
    t.join()
    assert ch.poll() == (str(tmp_path / "v199"), 199)
    versions = [v for _, v in seen]
    assert versions == sorted(versions)
