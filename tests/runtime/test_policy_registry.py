"""The policy registry: promote, roll back, reject, concurrency-safe writes, corrupt file."""
import json
import multiprocessing as mp

import pytest

from runtime.policy_registry import PolicyRegistry, UnknownPolicyVersion


def _adapter(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text("{}")
    return d


def test_promote_and_roll_back_chain(tmp_path):
    reg = PolicyRegistry(tmp_path)
    assert reg.current() is None and reg.current_version() == "base"
    sig0 = reg.signature()
    for v in ("v1", "v2", "v3"):
        reg.register(v, _adapter(tmp_path, v), cycle=f"c-{v}")
    assert [r.status for r in reg.list()] == ["candidate"] * 3
    reg.promote("v1")
    reg.promote("v2")
    assert reg.signature() != sig0
    assert reg.current_version() == "v2"
    reg.promote("v2")  # idempotent: a resumed cycle may promote twice
    assert len([h for h in reg.get("v2").history if h["status"] == "promoted"]) == 1
    assert reg.roll_back().version == "v1"
    assert reg.get("v2").status == "rolled_back"
    reg.promote("v3")
    assert reg.roll_back().version == "v1"
    assert reg.roll_back() is None and reg.current_version() == "base"
    with pytest.raises(ValueError):
        reg.roll_back()


def test_roll_back_to_named_version_and_reject(tmp_path):
    reg = PolicyRegistry(tmp_path)
    for v in ("a", "b", "c", "d"):
        reg.register(v, _adapter(tmp_path, v))
    for v in ("a", "b", "c"):
        reg.promote(v)
    assert reg.roll_back(to="a").version == "a"
    assert reg.get("b").status == reg.get("c").status == "rolled_back"
    with pytest.raises(ValueError):
        reg.roll_back(to="c")  # no longer a standing promoted version
    reg.reject("d", "worse on current rules")
    assert reg.get("d").status == "rejected"
    with pytest.raises(ValueError):
        reg.reject("a")  # serving
    with pytest.raises(UnknownPolicyVersion):
        reg.promote("zzz")


def test_register_validates(tmp_path):
    reg = PolicyRegistry(tmp_path)
    with pytest.raises(FileNotFoundError):
        reg.register("v1", tmp_path / "missing")
    a = _adapter(tmp_path, "a")
    reg.register("v1", a)
    assert reg.register("v1", a).version == "v1"  # idempotent
    with pytest.raises(ValueError):
        reg.register("v1", _adapter(tmp_path, "b"))
    with pytest.raises(ValueError):
        reg.register("base", a)


def test_corrupt_file_is_reported_not_reset(tmp_path):
    reg = PolicyRegistry(tmp_path)
    reg.register("v1", _adapter(tmp_path, "a"))
    reg.path.write_text("{not json")
    with pytest.raises(RuntimeError, match="corrupt"):
        reg.list()


def _register_many(args):
    data_dir, adapters, prefix = args
    reg = PolicyRegistry(data_dir)
    for i, a in enumerate(adapters):
        reg.register(f"{prefix}{i}", a)


def test_concurrent_writers_lose_nothing(tmp_path):
    adapters = [str(_adapter(tmp_path, f"ad{i}")) for i in range(10)]
    ctx = mp.get_context("fork")
    with ctx.Pool(2) as pool:
        pool.map(_register_many, [(str(tmp_path), adapters, "p"), (str(tmp_path), adapters, "q")])
    data = json.loads(PolicyRegistry(tmp_path).path.read_text())
    assert len(data["versions"]) == 20
    assert data["revision"] == 20
