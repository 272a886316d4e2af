"""Crash safety (SIGKILL mid bulk write) and rebuilding corrupt or missing projections."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from memory import MemoryService

BATCH = 40


def test_sigkill_mid_bulk_write_loses_no_committed_event(tmp_path):
    d = tmp_path / "mem"
    sys.path.insert(0, str(Path(__file__).parent))
    from crash_writer import TEXTS

    pre = MemoryService(d)
    pre.embedder.embed(TEXTS)  # cached in the ledger: the writer never loads the model
    pre.close()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    p = subprocess.Popen([sys.executable, str(Path(__file__).with_name("crash_writer.py")), str(d),
                          str(BATCH)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                         text=True)
    committed: list[str] = []
    try:
        for _ in range(5):
            line = p.stdout.readline()  # type: ignore[union-attr]
            assert line, "writer died before committing"
            committed += line.split()
    finally:
        p.send_signal(signal.SIGKILL)  # mid-way through the next batch
        p.wait()
    assert p.returncode == -signal.SIGKILL
    svc = MemoryService(d)
    items = svc.items("crash")
    ids = {i.id for i in items}
    assert set(committed) <= ids  # every committed event survived
    per_batch: dict[str, int] = {}
    for it in items:
        b = it.provenance[0].trajectory_id or ""
        per_batch[b] = per_batch.get(b, 0) + 1
    assert all(n == BATCH for n in per_batch.values()), per_batch  # no half-written batch
    assert sorted(svc.vec.ids("crash")) == sorted(ids)  # projections caught up
    for it in items[:: max(1, len(items) // 5)]:  # searchable (dedup off: same texts repeat)
        found = svc.search("crash", it.text, k=len(items))
        assert it.id in {h.item.id for h in found}
    svc.close()


def _service_with_data(d: Path) -> tuple[list[str], list[dict]]:
    svc = MemoryService(d)
    svc.add("alice", "Order O-1 belongs to user U-1", trajectory_id="t1",
            relations=[("id:O-1", "owned_by", "id:U-1")])
    svc.add("alice", "Gold members get free returns", kind="strategy", trajectory_id="t2")
    svc.add("bob", "Bob prefers phone calls", kind="user_preference", trajectory_id="t3")
    ids = sorted(svc.vec.ids("alice"))
    edges = svc.graph.edges("alice")
    svc.close()
    return ids, edges


def _assert_rebuilt(d: Path, ids: list[str], edges: list[dict], caplog, expect: str) -> None:
    with caplog.at_level(logging.WARNING, logger="memory"):
        svc = MemoryService(d)
    assert any(expect in n and "rebuilding it from the ledger" in n for n in svc.notices), svc.notices
    assert any(expect in r.message for r in caplog.records)
    assert sorted(svc.vec.ids("alice")) == ids
    assert sorted(map(str, svc.graph.edges("alice"))) == sorted(map(str, edges))
    assert svc.search("alice", "free returns gold", k=1)[0].item.text == "Gold members get free returns"
    assert svc.embedder.misses == 0  # rebuilt from the embedding cache, nothing re-embedded
    svc.close()


def test_corrupt_vector_files_are_rebuilt(tmp_path, caplog):
    d = tmp_path / "mem"
    ids, edges = _service_with_data(d)
    (d / "chroma" / "chroma.sqlite3").write_bytes(b"this is not a database" * 100)
    _assert_rebuilt(d, ids, edges, caplog, "unreadable")


def test_missing_vector_files_are_rebuilt(tmp_path, caplog):
    d = tmp_path / "mem"
    ids, edges = _service_with_data(d)
    shutil.rmtree(d / "chroma")
    _assert_rebuilt(d, ids, edges, caplog, "missing")


def test_corrupt_graph_file_is_rebuilt(tmp_path, caplog):
    d = tmp_path / "mem"
    ids, edges = _service_with_data(d)
    (d / "graph.json").write_text('{"last_seq": 3, "tenants": {"alice": [1, 2')
    _assert_rebuilt(d, ids, edges, caplog, "unreadable")


def test_missing_graph_file_is_rebuilt(tmp_path, caplog):
    d = tmp_path / "mem"
    ids, edges = _service_with_data(d)
    (d / "graph.json").unlink()
    _assert_rebuilt(d, ids, edges, caplog, "missing")


def test_explicit_rebuild_reuses_the_embedding_cache(tmp_path):
    d = tmp_path / "mem"
    ids, edges = _service_with_data(d)
    svc = MemoryService(d)
    out = svc.rebuild()
    assert out["re_embedded"] == 0 and out["vectors"] == 3
    assert sorted(svc.vec.ids("alice")) == ids
    svc.close()
