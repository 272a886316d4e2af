"""Working and short-term memory: bounded, compressed into facts, serialisable into graph state."""
from __future__ import annotations

from memory.short_term import ShortTermMemory, WorkingMemory, extract_facts


def test_short_term_is_bounded_and_compresses_into_facts():
    st = ShortTermMemory(tenant="alice", thread="th-1", max_turns=4)
    st.observe("user", "I prefer answers in French. Where is my order?")
    st.observe("agent", 'get_order {"order_id": "O-1042"}')
    st.observe("tool", "status=shipped days=23 amount=57")
    st.observe("agent", 'reply {"text": "Shipped"}', outcome="approved")
    assert st.facts == []
    st.observe("user", "thanks")
    assert len(st.turns) <= 4
    st.observe("user", "ok")
    st.observe("agent", 'get_order {"order_id": "O-7"}')
    st.observe("tool", "status=pending")  # overflow again: the approved reply is compressed
    rel = {(f.subject, f.relation): f.value for f in st.facts}
    assert rel[("tool:get_order", "called_with")] == '{"order_id": "O-1042"}'
    assert rel[("observed", "status")] == "shipped" and rel[("observed", "days")] == "23"
    assert all(t.text != 'reply {"text": "Shipped"}' for t in st.turns)
    assert rel[("turn:agent", "outcome")] == "approved"
    assert [f.value for f in st.preferences()] == ["I prefer answers in French"]
    text = st.render()
    assert "fact: observed amount 57" in text and "tool: status=pending" in text
    again = ShortTermMemory.model_validate_json(st.model_dump_json())  # lives in graph state
    assert again == st


def test_newer_facts_replace_older_ones():
    st = ShortTermMemory(tenant="a", thread="t", max_turns=2)
    for s in ("status=pending", "status=shipped", "status=delivered", "x=1"):
        st.observe("tool", s)
    vals = [f.value for f in st.facts if f.relation == "status"]
    assert vals == ["shipped"] or vals == ["delivered"]
    assert len([f for f in st.facts if f.relation == "status"]) == 1


def test_unparsable_tool_call_is_kept_as_text():
    facts = extract_facts([__import__("memory.short_term", fromlist=["Turn"]).Turn(
        role="agent", text="get_order {not json}")])
    assert facts[0].value == '"{not json}"'


def test_working_memory_restates_constraints_and_pins_results():
    wm = WorkingMemory(task_id="task-1", plan=["look up order", "check window", "refund"])
    wm.restate(["refund window is 14 days", "  ", "refund window is 14 days", "gold: no fee"])
    wm.pin("get_order", "days=23 " + "x" * 1000)
    out = wm.render()
    assert out.splitlines()[0] == "constraints: refund window is 14 days; gold: no fee"
    assert "plan: look up order -> check window -> refund" in out
    assert len(wm.pinned["get_order"]) == wm.max_pinned_chars
