"""Customer-service retail: orders, refunds, exchanges, escalations, customer tiers.

The right action depends on facts read through tools (days since delivery, amount, status,
the customer's tier) and on the rules in force (windows, escalation threshold, which tiers
get the extended window, the gold coupon). Version 4 keeps version 1's rules but drifts the
tools: `get_customer` is renamed `get_profile`, `refund` gains a required `reason`,
`escalate` is deprecated for `handoff`, and the not-found error changes.
"""
from __future__ import annotations

import random

from dynamic_bench.actions import ToolCall, ToolSpec
from dynamic_bench.domains.base import Domain, Rule, Rules, State, ToolSet

TIERS = ("standard", "silver", "gold")
REASONS = ("damaged", "unwanted")
ITEMS = ("lamp", "chair", "shirt", "kettle", "desk", "boots", "phone", "mug")


def _spec(name: str, op: str, args: dict[str, str], write: bool, desc: str, enums: dict | None = None) -> ToolSpec:
    return ToolSpec(name, op, tuple(args.items()), write, desc,
                    tuple((k, tuple(v)) for k, v in (enums or {}).items()))


_COMMON = {
    "get_order": _spec("get_order", "order", {"order_id": "str"}, False, "read an order"),
    "exchange": _spec("exchange", "exchange", {"order_id": "str"}, True, "exchange an order"),
    "issue_coupon": _spec("issue_coupon", "coupon", {"user_id": "str", "amount": "int"}, True, "give a coupon"),
}
TOOL_SETS = {
    1: ToolSet(
        specs={**_COMMON,
               "get_customer": _spec("get_customer", "customer", {"user_id": "str"}, False, "read a customer"),
               "refund": _spec("refund", "refund", {"order_id": "str"}, True, "refund an order"),
               "escalate": _spec("escalate", "escalate", {"order_id": "str"}, True, "send to a human agent")},
        deprecated={},
        errors={"no_order": "error: no order {order_id}", "no_user": "error: no customer {user_id}",
                "status": "error: order {order_id} is {status}"}),
    2: ToolSet(
        specs={**_COMMON,
               "get_profile": _spec("get_profile", "customer", {"user_id": "str"}, False, "read a customer"),
               "refund": _spec("refund", "refund", {"order_id": "str", "reason": "str"}, True, "refund an order",
                               {"reason": REASONS}),
               "handoff": _spec("handoff", "escalate", {"order_id": "str"}, True, "send to a human agent")},
        deprecated={"escalate": "handoff"},
        errors={"no_order": "error 404: order {order_id} not found", "no_user": "error 404: user {user_id} not found",
                "status": "error 409: order {order_id} already {status}"}),
}

VERSIONS: dict[int, Rules] = {
    1: {"refund_window": 30, "extended_window": 30, "extended_tiers": ["gold"], "escalate_over": 200,
        "exchange_window": 30, "gold_coupon": 0, "tools": 1},
    2: {"refund_window": 20, "extended_window": 35, "extended_tiers": ["gold"], "escalate_over": 150,
        "exchange_window": 20, "gold_coupon": 10, "tools": 1},
    3: {"refund_window": 21, "extended_window": 45, "extended_tiers": ["gold", "silver"], "escalate_over": 100,
        "exchange_window": 30, "gold_coupon": 0, "tools": 1},
}
VERSIONS[4] = {**VERSIONS[1], "tools": 2}


def _window(tier: str, r: Rules) -> int:
    return r["extended_window"] if tier in r["extended_tiers"] else r["refund_window"]


def _facts(state: State, call: ToolCall) -> dict | None:
    return state["orders"].get(call.args.get("order_id"))


def _refundable(o: dict, tier: str, r: Rules) -> bool:
    return o["status"] == "delivered" and o["days"] <= _window(tier, r)


def _is(state: State, call: ToolCall, r: Rules, op: str) -> bool:
    spec = TOOL_SETS[r["tools"]].specs.get(call.name)
    return spec is not None and spec.op == op


def _forbid_refund_window(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    o = _facts(s, c)
    return _is(s, c, r, "refund") and o is not None and o["days"] > _window(s["customer"]["tier"], r)


def _forbid_not_delivered(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    o = _facts(s, c)
    return (_is(s, c, r, "refund") or _is(s, c, r, "exchange")) and o is not None and o["status"] != "delivered"


def _forbid_over_threshold(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    o = _facts(s, c)
    return _is(s, c, r, "refund") and o is not None and o["amount"] > r["escalate_over"]


def _forbid_escalate(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    o = _facts(s, c)
    if not _is(s, c, r, "escalate") or o is None:
        return False
    ok = p["kind"] == "refund" and _refundable(o, s["customer"]["tier"], r) and o["amount"] > r["escalate_over"]
    return not ok


def _forbid_exchange_window(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    o = _facts(s, c)
    return _is(s, c, r, "exchange") and o is not None and o["days"] > r["exchange_window"]


def _forbid_coupon(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    if not _is(s, c, r, "coupon"):
        return False
    refunded = any(o["status"] == "refunded" for o in s["orders"].values())
    return not (r["gold_coupon"] > 0 and s["customer"]["tier"] == "gold" and refunded
                and c.args.get("amount") == r["gold_coupon"] and not s["coupons"])


def _forbid_unrequested(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    """Only the order the user asked about, and only the kind of change asked for."""
    if "order_id" in c.args and c.args["order_id"] != p["order_id"]:
        return True
    return (p["kind"] == "refund" and _is(s, c, r, "exchange")) or (
        p["kind"] == "exchange" and (_is(s, c, r, "refund") or _is(s, c, r, "escalate")))


def _tiers(r: Rules) -> str:
    return " and ".join(r["extended_tiers"])


RULES = (
    Rule("refund_window", lambda r: f"Refund a delivered order only within {r['refund_window']} days of delivery; "
         f"{_tiers(r)} customers: within {r['extended_window']} days.", _forbid_refund_window),
    Rule("escalate_over", lambda r: f"A refund over {r['escalate_over']} is not refunded: escalate it to a human.",
         _forbid_over_threshold),
    Rule("escalate_only_over", lambda r: "Escalate only a refundable order over that amount.", _forbid_escalate),
    Rule("exchange_window", lambda r: f"Exchange a delivered order only within {r['exchange_window']} days.",
         _forbid_exchange_window),
    Rule("gold_coupon", lambda r: (f"After a refund to a gold customer, issue one coupon of {r['gold_coupon']}."
                                   if r["gold_coupon"] else "Issue no coupons."), _forbid_coupon),
    Rule("delivered_only", lambda r: "Never refund or exchange an order that is not delivered.", _forbid_not_delivered),
    Rule("as_requested", lambda r: "Change only the order the user asked about, as asked; else deny.",
         _forbid_unrequested),
)


class Retail(Domain):
    name = "retail"
    versions = VERSIONS
    tool_sets = TOOL_SETS
    rules = RULES
    outcomes = ("refunded", "exchanged", "escalated", "denied")
    tool_drift = (1, 4)
    tiers = TIERS
    change_notes = (
        (("refund_window",), lambda r: f"refund window is now {r['refund_window']} days"),
        (("extended_window", "extended_tiers"),
         lambda r: f"{_tiers(r)} customers now get a {r['extended_window']} day refund window"),
        (("escalate_over",), lambda r: f"refunds over {r['escalate_over']} must now be escalated"),
        (("exchange_window",), lambda r: f"exchange window is now {r['exchange_window']} days"),
        (("gold_coupon",), lambda r: f"gold refunds now get a coupon of {r['gold_coupon']}" if r["gold_coupon"]
         else "no more coupons after gold refunds"),
    )

    def random_rules(self, rng: random.Random) -> Rules:
        w = rng.randint(7, 60)
        return {"refund_window": w, "extended_window": w + rng.randint(0, 30),
                "extended_tiers": rng.choice([["gold"], ["gold", "silver"]]),
                "escalate_over": rng.randint(5, 45) * 10, "exchange_window": rng.randint(7, 60),
                "gold_coupon": rng.choice([0, rng.randint(5, 50)]), "tools": rng.choice([1, 2])}

    def sample_user(self, rng: random.Random) -> dict:
        return {"user_id": f"U-{rng.randint(10, 999)}", "tier": rng.choices(TIERS, weights=(5, 3, 3))[0]}

    def sample_params(self, rng: random.Random, user: dict) -> dict:
        oid = f"O-{rng.randint(1000, 9999)}"
        order = {"item": rng.choice(ITEMS), "amount": rng.randint(5, 300), "days": rng.randint(1, 40),
                 "status": "delivered" if rng.random() < 0.93 else rng.choice(["shipped", "refunded"])}
        return {"kind": rng.choices(["refund", "exchange"], weights=(3, 1))[0], "order_id": oid,
                "reason": rng.choice(REASONS), "user_id": user["user_id"],
                "db": {"customer": dict(user), "orders": {oid: order}}}

    def instruction(self, p: dict) -> str:
        verb = "a refund for" if p["kind"] == "refund" else "to exchange"
        return f"I want {verb} order {p['order_id']}, it is {p['reason']}. My id is {p['user_id']}."

    def initial_state(self, p: dict) -> State:
        db = p["db"]
        return {"customer": db["customer"], "orders": {k: dict(v) for k, v in db["orders"].items()}, "coupons": []}

    def execute(self, state: State, p: dict, spec: ToolSpec, call: ToolCall, rules: Rules) -> str:
        a, op = call.args, spec.op
        if op == "customer":
            c = state["customer"]
            if a["user_id"] != c["user_id"]:
                return self.error(rules, "no_user", user_id=a["user_id"])
            return f"customer {c['user_id']}: tier={c['tier']}"
        if op == "coupon":
            if a["user_id"] != state["customer"]["user_id"]:
                return self.error(rules, "no_user", user_id=a["user_id"])
            state["coupons"].append(a["amount"])
            return f"ok: coupon {a['amount']} for {a['user_id']}"
        o = state["orders"].get(a["order_id"])
        if o is None:
            return self.error(rules, "no_order", order_id=a["order_id"])
        if op == "order":
            return (f"order {a['order_id']}: user={state['customer']['user_id']} item={o['item']} "
                    f"amount={o['amount']} days={o['days']} status={o['status']}")
        if o["status"] != "delivered":
            return self.error(rules, "status", order_id=a["order_id"], status=o["status"])
        o["status"] = {"refund": "refunded", "exchange": "exchanged", "escalate": "escalated"}[op]
        return f"ok: {o['status']} {a['order_id']}"

    def outcome_key(self, state: State) -> tuple:
        return tuple(sorted((k, o["status"]) for k, o in state["orders"].items())) + tuple(state["coupons"])

    def solve(self, p: dict, r: Rules) -> tuple[list[ToolCall], str]:
        o, tier, oid = p["db"]["orders"][p["order_id"]], p["db"]["customer"]["tier"], p["order_id"]
        if o["status"] != "delivered":
            return [], "denied"
        if p["kind"] == "exchange":
            if o["days"] > r["exchange_window"]:
                return [], "denied"
            return [self.call(r, "exchange", order_id=oid)], "exchanged"
        if not _refundable(o, tier, r):
            return [], "denied"
        if o["amount"] > r["escalate_over"]:
            return [self.call(r, "escalate", order_id=oid)], "escalated"
        calls = [self.call(r, "refund", order_id=oid, reason=p["reason"])]
        if tier == "gold" and r["gold_coupon"] > 0:
            calls.append(self.call(r, "coupon", user_id=p["user_id"], amount=r["gold_coupon"]))
        return calls, "refunded"

    def reads(self, p: dict, r: Rules) -> tuple[list[ToolCall], list[ToolCall]]:
        order = self.call(r, "order", order_id=p["order_id"])
        customer = self.call(r, "customer", user_id=p["user_id"])
        return ([order, customer], []) if p["kind"] == "refund" else ([order], [customer])

    def reply_text(self, p: dict, outcome: str) -> str:
        return f"Order {p['order_id']}: {outcome}."
