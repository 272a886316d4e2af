"""BaseStore conformance: the same cases run on LangGraph's InMemoryStore and on EvolveStore,
with absolute checks of LangGraph's documented semantics, then EvolveStore in a real graph."""
from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, GetOp, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from memory import InvalidInput, MemoryService
from memory.embeddings import encode
from memory.store import EvolveStore


def _norm(res):
    if res is None:
        return None
    if isinstance(res, list):
        return [_norm(r) for r in res]
    if isinstance(res, tuple):
        return res
    score = getattr(res, "score", None)
    return (res.namespace, res.key, res.value, None if score is None else round(score, 4))


def case_crud(s, T):
    out = [s.get((T, "prefs"), "theme")]
    s.put((T, "prefs"), "theme", {"text": "dark mode", "n": 1})
    out.append(s.get((T, "prefs"), "theme"))
    assert out[-1].value == {"text": "dark mode", "n": 1}
    s.put((T, "prefs"), "theme", {"text": "light mode", "n": 2})
    out.append(s.get((T, "prefs"), "theme"))
    assert out[-1].value["n"] == 2
    s.delete((T, "prefs"), "theme")
    out.append(s.get((T, "prefs"), "theme"))
    assert out[-1] is None
    return out


def _seed(s, T):
    s.put((T, "docs"), "d1", {"text": "Refunds are possible within 30 days", "n": 1, "tag": "policy",
                              "meta": {"lang": "en", "rank": 3}})
    s.put((T, "notes"), "n1", {"text": "The user likes short answers", "n": 2, "tag": "pref"})
    s.put((T, "docs", "sub"), "d2", {"text": "Shipping takes five business days", "n": 3,
                                     "tag": "policy", "meta": {"lang": "de", "rank": 1}})
    s.put((T, "docs"), "d3", {"text": "Use get_order to look up an order", "n": 4, "tag": "tool",
                              "list": [1, 2]})
    s.put((T, "notes"), "n2", {"text": "Escalate angry customers to a human", "n": 5, "tag": "pref"})


def case_search_no_query(s, T):
    _seed(s, T)
    out = [s.search((T,), limit=10), s.search((T, "docs")), s.search((T, "docs"), limit=1, offset=1),
           s.search((T,), limit=2, offset=3), s.search((T, "nothing"))]
    assert [i.key for i in out[1]] == ["d1", "d3", "d2"]
    assert len(out[0]) == 5 and out[4] == []
    return out


def case_filters(s, T):
    _seed(s, T)
    out = [s.search((T,), filter={"tag": "policy"}), s.search((T,), filter={"n": {"$gt": 2}}),
           s.search((T,), filter={"n": {"$gte": 2, "$lt": 5}}), s.search((T,), filter={"tag": {"$ne": "pref"}}),
           s.search((T,), filter={"meta": {"lang": "de"}}), s.search((T,), filter={"list": [1, 2]}),
           s.search((T,), filter={"n": {"$lte": 1}, "tag": "policy"}), s.search((T,), filter={"tag": "none"})]
    assert {i.key for i in out[0]} == {"d1", "d2"} and {i.key for i in out[1]} == {"d2", "d3", "n2"}
    assert [i.key for i in out[4]] == ["d2"] and [i.key for i in out[5]] == ["d3"] and out[7] == []
    return out


def case_semantic(s, T):
    _seed(s, T)
    out = [s.search((T,), query="how long do I have to return an item for money back?", limit=3),
           s.search((T,), query="delivery time", limit=2, offset=1),
           s.search((T, "notes"), query="customer is upset"),
           s.search((T,), query="order lookup tool", filter={"tag": "tool"})]
    assert out[0][0].key == "d1" and out[0][0].score >= out[0][1].score
    assert out[2][0].key == "n2" and out[3][0].key == "d3"
    return out


def case_namespaces(s, T):
    _seed(s, T)
    s.put((T, "users", "u1", "prefs"), "k", {"text": "x"})
    out = [s.list_namespaces(prefix=(T,)), s.list_namespaces(prefix=(T, "docs")),
           s.list_namespaces(prefix=(T,), max_depth=2), s.list_namespaces(prefix=(T,), suffix=("prefs",)),
           s.list_namespaces(prefix=(T, "*", "u1")), s.list_namespaces(prefix=(T,), limit=2, offset=1)]
    assert out[1] == [(T, "docs"), (T, "docs", "sub")]
    assert out[2] == [(T, "docs"), (T, "notes"), (T, "users")]
    assert out[3] == [(T, "users", "u1", "prefs")]
    return out


def case_order_after_update_and_reput(s, T):
    for k in ("a", "b", "c"):
        s.put((T, "o"), k, {"text": f"item {k}"})
    s.put((T, "o"), "a", {"text": "item a v2"})  # update keeps its place
    s.delete((T, "o"), "b")
    s.put((T, "o"), "b", {"text": "item b again"})  # re-created: goes last
    out = s.search((T, "o"))
    assert [i.key for i in out] == ["a", "c", "b"]
    return out


def case_batch_reads_before_writes(s, T):
    s.put((T, "x"), "k", {"text": "old"})
    res = s.batch([GetOp((T, "x"), "k"), PutOp((T, "x"), "k", {"text": "new"}),
                   SearchOp((T, "x"), None, 10, 0, None), PutOp((T, "x"), "k", {"text": "newest"}),
                   GetOp((T, "x"), "k")])
    assert res[0].value == {"text": "old"} and res[1] is None
    after = s.get((T, "x"), "k")
    assert after.value == {"text": "newest"}
    return [res[0], res[2], res[4], after]


def case_async(s, T):
    async def go():
        await s.aput((T, "a"), "k1", {"text": "async one"})
        await s.aput((T, "a"), "k2", {"text": "async two"})
        got = await s.aget((T, "a"), "k1")
        found = await s.asearch((T, "a"), query="two")
        await s.adelete((T, "a"), "k1")
        return [got, found, await s.aget((T, "a"), "k1"), await s.alist_namespaces(prefix=(T,))]
    out = asyncio.run(go())
    assert out[0].value == {"text": "async one"} and out[2] is None and out[1][0].key == "k2"
    return out


CASES = [case_crud, case_search_no_query, case_filters, case_semantic, case_namespaces,
         case_order_after_update_and_reput, case_batch_reads_before_writes, case_async]


@pytest.fixture(scope="module")
def evolve_store(tmp_path_factory):
    svc = MemoryService(tmp_path_factory.mktemp("store") / "mem")
    yield EvolveStore(svc, index={"fields": ["text"]})
    svc.close()


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_conformance_agrees_with_inmemorystore(case, evolve_store):
    reference = InMemoryStore(index={"dims": 384, "embed": lambda xs: encode(list(xs)).tolist(),
                                     "fields": ["text"]})
    tenant = f"tenant-{case.__name__}"
    expected = _norm(case(reference, tenant))
    got = _norm(case(evolve_store, tenant))
    assert got == expected


def test_store_data_is_memory_and_memory_is_visible_through_the_store(evolve_store):
    svc = evolve_store.memory
    evolve_store.put(("t-x", "notes"), "n1", {"text": "The refund desk closes at 5pm", "kind": "strategy",
                                              "provenance": [{"trajectory_id": "traj-9", "step": 2}]})
    hit = svc.search("t-x", "when does the refund desk close", k=1)[0]
    assert hit.item.kind == "strategy" and hit.provenance[0].trajectory_id == "traj-9"
    it = svc.add("t-x", "Customers in tier gold skip the queue", kind="user_preference", trajectory_id="t7")
    got = evolve_store.get(("t-x", "memories", "user_preference"), it.id)
    assert got.value["status"] == "candidate" and got.value["provenance"][0]["trajectory_id"] == "t7"
    svc.retract_trajectory("traj-9")  # retraction reaches store data too
    assert evolve_store.get(("t-x", "notes"), "n1") is None
    assert evolve_store.search(("t-y",)) == []  # another tenant sees nothing
    with pytest.raises(InvalidInput):
        evolve_store.search(())
    with pytest.raises(InvalidInput):
        evolve_store.list_namespaces()
    with pytest.raises(InvalidInput):
        evolve_store.put(("t-x", "memories", "strategy"), it.id, {"text": "overwrite"})


class S(TypedDict):
    user: str
    question: str
    recalled: Annotated[list[str], operator.add]


def test_compile_with_evolve_store_in_a_real_state_graph(tmp_path):
    svc = MemoryService(tmp_path / "mem")
    store = EvolveStore(svc)

    def remember(state: S, *, store: BaseStore) -> dict:
        store.put((state["user"], "facts"), "lang", {"text": f"{state['user']} writes in Italian"})
        return {}

    def recall(state: S, *, store: BaseStore) -> dict:
        hits = store.search((state["user"],), query=state["question"], limit=1)
        return {"recalled": [h.value["text"] for h in hits]}

    g = StateGraph(S)
    g.add_node("remember", remember)
    g.add_node("recall", recall)
    g.add_edge(START, "remember")
    g.add_edge("remember", "recall")
    g.add_edge("recall", END)
    app = g.compile(store=store)
    out = app.invoke({"user": "ugo", "question": "which language?", "recalled": []})
    assert out["recalled"] == ["ugo writes in Italian"]
    out2 = app.invoke({"user": "vera", "question": "which language?", "recalled": []})
    assert out2["recalled"] == ["vera writes in Italian"]  # not ugo's
    svc.close()
    reopened = MemoryService(tmp_path / "mem")  # durable: it is in the ledger
    assert reopened.search("ugo", "Italian", k=1)[0].item.text == "ugo writes in Italian"
    reopened.close()
