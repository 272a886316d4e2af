"""The action parser and formatter: canonical round trip; malformed input is an error, never a raise."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamic_bench import get_domain
from dynamic_bench.actions import (MAX_ACTION_CHARS, ActionError, Reply, ToolCall, format_action, parse_action)

TOOLS = get_domain("retail").tools(get_domain("retail").versions[4])  # has an int arg and an enum arg

names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: n != "reply")
values = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=20), st.booleans(), st.none())


@settings(max_examples=200, deadline=None)
@given(names, st.dictionaries(st.text(min_size=1, max_size=8), values, max_size=4))
def test_roundtrip_toolcall(name, args):
    a = ToolCall(name, args)
    text = format_action(a)
    assert "\n" not in text
    assert parse_action(text) == a
    assert format_action(parse_action(text)) == text  # canonical: formatting is a fixed point


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_roundtrip_reply_and_never_raises(s):
    assert parse_action(format_action(Reply(s))) == Reply(s)
    out = parse_action(s)  # arbitrary text: any outcome, but never an exception
    assert isinstance(out, (ToolCall, Reply, ActionError))


def test_canonical_form_is_compact_and_sorted():
    a = parse_action('  refund   {"reason": "damaged", "order_id": "O-1042"}  ')
    assert format_action(a) == 'refund {"order_id":"O-1042","reason":"damaged"}'
    assert parse_action("get_order") == ToolCall("get_order", {})  # bare name: no arguments


@pytest.mark.parametrize("text,expected", [
    ('get_order {"order_id": "O-1"', "bad JSON"),
    ('get_order {"order_id": O-1}', "bad JSON"),
    ("get_order [1, 2]", "must be a JSON object"),
    ('get_order "O-1"', "expected JSON arguments"),
    ('get_order {"order_id":"O-1"} and more', "unexpected text after"),
    ('fly_away {"order_id":"O-1"}', "unknown tool 'fly_away'"),
    ("refund {}", "missing required argument 'order_id'"),
    ('refund {"order_id":"O-1"}', "missing required argument 'reason'"),
    ('refund {"order_id":"O-1","reason":"damaged","x":1}', "unexpected argument 'x'"),
    ('refund {"order_id":1042,"reason":"damaged"}', "must be str, got int"),
    ('issue_coupon {"user_id":"U-1","amount":"10"}', "must be int, got str"),
    ('issue_coupon {"user_id":"U-1","amount":true}', "must be int, got bool"),
    ('refund {"order_id":"O-1","reason":"bored"}', "must be one of damaged|unwanted"),
    ("reply", "missing required argument 'text'"),
    ('reply {"text": 5}', "'text' of reply must be str"),
    ('reply {"text":"a","b":1}', "unexpected argument 'b'"),
    ("", "empty action"),
    ("{}", "must start with a tool name"),
    ("x" * (MAX_ACTION_CHARS + 1), "too long"),
])
def test_malformed_actions_give_clear_errors(text, expected):
    out = parse_action(text, TOOLS)
    assert isinstance(out, ActionError), out
    assert out.message.startswith("error") and expected in out.message


def test_non_text_input_is_an_error():
    for bad in (None, 3, b"reply", ["reply"]):
        out = parse_action(bad)
        assert isinstance(out, ActionError) and "must be text" in out.message


def test_huge_json_is_refused_before_parsing():
    huge = "get_order " + json.dumps({"order_id": "O-1" * 100_000})
    out = parse_action(huge, TOOLS)
    assert isinstance(out, ActionError) and "too long" in out.message and len(out.text) <= 200
