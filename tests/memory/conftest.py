"""Fixtures for memory tests: the embedding model is loaded once per session; every Postgres
test gets its own freshly created database, dropped afterwards."""
from __future__ import annotations

import uuid

import pytest

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"


@pytest.fixture(scope="session", autouse=True)
def _model_once():
    import torch

    torch.set_num_threads(2)
    from memory.embeddings import get_model

    get_model()


def _pg_admin():
    import psycopg

    try:
        return psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test",
                               autocommit=True, connect_timeout=3)
    except Exception:  # noqa: BLE001 - any connection failure means "no server answers"
        return None


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request, tmp_path):
    """(ledger URL or None, data dir): SQLite inside the data dir, or a fresh Postgres database."""
    if request.param == "sqlite":
        yield None, tmp_path / "mem"
        return
    admin = _pg_admin()
    if admin is None:
        pytest.skip("no PostgreSQL answering on 127.0.0.1:5432")
    db = f"evolve_memory_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{db}"')
    try:
        yield PG.format(db=db), tmp_path / "mem"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def open_service(ledger):
    """A factory that opens (and later closes) MemoryService instances on the same ledger."""
    from memory import MemoryService

    url, ddir = ledger
    opened = []

    def _open(**kw):
        svc = MemoryService(url, data_dir=ddir, **kw) if url else MemoryService(ddir, **kw)
        opened.append(svc)
        return svc

    yield _open
    for s in opened:
        try:
            s.close()
        except Exception:  # noqa: BLE001 - already closed by the test
            pass


@pytest.fixture
def svc(open_service):
    return open_service()
