"""Telecom support: outage credits and line suspensions, with tool drift.

Facts come from tools (plan, balance due, outage hours); rules set the thresholds and the
credit amount. The tools drift across versions: v2 renames `get_account` to
`lookup_account`; v3 adds a required `reason` to `issue_credit`, deprecates `suspend_line`
for `set_line_status`, and changes an error (an account without outages now answers with an
error instead of "0 hours", which the agent must read as zero). v4 is v1's rules on v3's tools.
"""
from __future__ import annotations

import random

from dynamic_bench.actions import ToolCall, ToolSpec
from dynamic_bench.domains.base import Domain, Rule, Rules, State, ToolSet
from dynamic_bench.domains.retail import _spec

PLANS = ("basic", "premium")
_ACCOUNT_ERR = {"no_account": "error: no account {account_id}", "no_line": "error: no line {line_id}"}

_BASE = {
    "get_outages": _spec("get_outages", "outages", {"account_id": "str"}, False, "read outage hours"),
    "escalate": _spec("escalate", "escalate", {"account_id": "str"}, True, "send to a human agent"),
}
_CREDIT = _spec("issue_credit", "credit", {"account_id": "str", "amount": "int"}, True, "credit an account")
_SUSPEND = _spec("suspend_line", "suspend", {"line_id": "str"}, True, "suspend a line")
TOOL_SETS = {
    1: ToolSet(specs={"get_account": _spec("get_account", "account", {"account_id": "str"}, False, "read an account"),
                      **_BASE, "issue_credit": _CREDIT, "suspend_line": _SUSPEND},
               deprecated={}, errors={**_ACCOUNT_ERR, "no_outage": ""}),
    2: ToolSet(specs={"lookup_account": _spec("lookup_account", "account", {"account_id": "str"}, False,
                                              "read an account"),
                      **_BASE, "issue_credit": _CREDIT, "suspend_line": _SUSPEND},
               deprecated={}, errors={**_ACCOUNT_ERR, "no_outage": ""}),
    3: ToolSet(specs={"lookup_account": _spec("lookup_account", "account", {"account_id": "str"}, False,
                                              "read an account"),
                      **_BASE,
                      "issue_credit": _spec("issue_credit", "credit",
                                            {"account_id": "str", "amount": "int", "reason": "str"}, True,
                                            "credit an account", {"reason": ("outage", "goodwill")}),
                      "set_line_status": _spec("set_line_status", "suspend", {"line_id": "str", "status": "str"},
                                               True, "set a line's status", {"status": ("suspended", "active")})},
               deprecated={"suspend_line": "set_line_status"},
               errors={**_ACCOUNT_ERR, "no_outage": "error: no outage records for {account_id}"}),
}

VERSIONS: dict[int, Rules] = {
    1: {"credit_min_hours": 4, "premium_min_hours": 2, "credit_amount": 10, "suspend_max_due": 100, "tools": 1},
    2: {"credit_min_hours": 8, "premium_min_hours": 4, "credit_amount": 20, "suspend_max_due": 50, "tools": 2},
    3: {"credit_min_hours": 6, "premium_min_hours": 6, "credit_amount": 15, "suspend_max_due": 0, "tools": 3},
}
VERSIONS[4] = {**VERSIONS[1], "tools": 3}


def _op(c: ToolCall, r: Rules) -> str | None:
    spec = TOOL_SETS[r["tools"]].specs.get(c.name)
    return spec.op if spec else None


def _min_hours(s: State, r: Rules) -> int:
    return r["premium_min_hours"] if s["account"]["plan"] == "premium" else r["credit_min_hours"]


def _forbid_credit(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    return _op(c, r) == "credit" and (p["kind"] != "credit" or s["outage_hours"] < _min_hours(s, r) or bool(s["credits"]))


def _forbid_amount(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    return _op(c, r) == "credit" and (c.args.get("amount") != r["credit_amount"] or c.args.get("reason", "outage")
                                      != "outage")


def _forbid_suspend(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    return _op(c, r) == "suspend" and (p["kind"] != "suspend" or s["account"]["balance_due"] > r["suspend_max_due"]
                                       or c.args.get("status", "suspended") != "suspended")


def _forbid_escalate(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    return _op(c, r) == "escalate" and not (p["kind"] == "suspend"
                                            and s["account"]["balance_due"] > r["suspend_max_due"])


def _forbid_other_account(s: State, p: dict, c: ToolCall, r: Rules) -> bool:
    return c.args.get("account_id", p["account_id"]) != p["account_id"] or c.args.get(
        "line_id", p["line_id"]) != p["line_id"]


RULES = (
    Rule("credit_hours", lambda r: f"Credit an outage only if it lasted at least {r['credit_min_hours']} hours "
         f"({r['premium_min_hours']} hours on premium plans); credit once.", _forbid_credit),
    Rule("credit_amount", lambda r: f"An outage credit is exactly {r['credit_amount']}.", _forbid_amount),
    Rule("suspend_due", lambda r: f"Suspend a line only if the balance due is at most {r['suspend_max_due']}; "
         "otherwise escalate.", _forbid_suspend),
    Rule("escalate_only_due", lambda r: "Escalate only a suspension blocked by the balance due.", _forbid_escalate),
    Rule("own_account", lambda r: "Act only on the user's own account and line; else deny.", _forbid_other_account),
)


class Telecom(Domain):
    name = "telecom"
    versions = VERSIONS
    tool_sets = TOOL_SETS
    rules = RULES
    outcomes = ("credited", "suspended", "escalated", "denied")
    tool_drift = (1, 4)
    tiers = PLANS
    change_notes = (
        (("credit_min_hours",), lambda r: f"outage credits now need at least {r['credit_min_hours']} hours"),
        (("premium_min_hours",),
         lambda r: f"premium plans now need at least {r['premium_min_hours']} outage hours for a credit"),
        (("credit_amount",), lambda r: f"the outage credit is now {r['credit_amount']}"),
        (("suspend_max_due",), lambda r: f"suspend a line only if the balance due is at most {r['suspend_max_due']}"),
    )

    def random_rules(self, rng: random.Random) -> Rules:
        m = rng.randint(1, 12)
        return {"credit_min_hours": m, "premium_min_hours": rng.randint(1, m), "credit_amount": rng.randint(5, 50),
                "suspend_max_due": rng.choice([0, rng.randint(1, 150)]), "tools": rng.choice([1, 2, 3])}

    def sample_user(self, rng: random.Random) -> dict:
        n = rng.randint(100, 999)
        return {"user_id": f"A-{n}", "line_id": f"L-{n}{rng.randint(1, 9)}", "plan": rng.choice(PLANS)}

    def sample_params(self, rng: random.Random, user: dict) -> dict:
        hours = 0 if rng.random() < 0.15 else rng.randint(1, 14)
        due = 0 if rng.random() < 0.2 else rng.randint(1, 150)
        account = {"plan": user["plan"], "balance_due": due, "line_id": user["line_id"], "line_status": "active"}
        return {"kind": rng.choice(["credit", "suspend"]), "account_id": user["user_id"], "line_id": user["line_id"],
                "user_id": user["user_id"], "db": {"account": account, "outage_hours": hours}}

    def instruction(self, p: dict) -> str:
        if p["kind"] == "credit":
            return f"I had an outage on account {p['account_id']}. I want a credit."
        return f"I lost my phone. Please suspend line {p['line_id']} on account {p['account_id']}."

    def initial_state(self, p: dict) -> State:
        return {"account": dict(p["db"]["account"]), "outage_hours": p["db"]["outage_hours"], "credits": [],
                "escalated": False}

    def execute(self, state: State, p: dict, spec: ToolSpec, call: ToolCall, rules: Rules) -> str:
        a, op, acc = call.args, spec.op, state["account"]
        if "line_id" in a and a["line_id"] != acc["line_id"]:
            return self.error(rules, "no_line", line_id=a["line_id"])
        if "account_id" in a and a["account_id"] != p["account_id"]:
            return self.error(rules, "no_account", account_id=a["account_id"])
        if op == "account":
            return (f"account {p['account_id']}: plan={acc['plan']} balance_due={acc['balance_due']} "
                    f"line={acc['line_id']} line_status={acc['line_status']}")
        if op == "outages":
            h = state["outage_hours"]
            if h == 0 and self.tool_sets[rules["tools"]].errors["no_outage"]:
                return self.error(rules, "no_outage", account_id=p["account_id"])
            return f"outages {p['account_id']}: {h} hours"
        if op == "credit":
            state["credits"].append(a["amount"])
            return f"ok: credited {a['amount']} to {p['account_id']}"
        if op == "suspend":
            acc["line_status"] = a.get("status", "suspended")
            return f"ok: line {acc['line_id']} {acc['line_status']}"
        state["escalated"] = True
        return f"ok: escalated {p['account_id']}"

    def outcome_key(self, state: State) -> tuple:
        return (state["account"]["line_status"], state["escalated"], tuple(state["credits"]))

    def solve(self, p: dict, r: Rules) -> tuple[list[ToolCall], str]:
        acc, aid = p["db"]["account"], p["account_id"]
        if p["kind"] == "credit":
            mins = r["premium_min_hours"] if acc["plan"] == "premium" else r["credit_min_hours"]
            if p["db"]["outage_hours"] < mins:
                return [], "denied"
            return [self.call(r, "credit", account_id=aid, amount=r["credit_amount"], reason="outage")], "credited"
        if acc["balance_due"] > r["suspend_max_due"]:
            return [self.call(r, "escalate", account_id=aid)], "escalated"
        return [self.call(r, "suspend", line_id=p["line_id"], status="suspended")], "suspended"

    def reads(self, p: dict, r: Rules) -> tuple[list[ToolCall], list[ToolCall]]:
        account = self.call(r, "account", account_id=p["account_id"])
        outages = self.call(r, "outages", account_id=p["account_id"])
        return ([account, outages], []) if p["kind"] == "credit" else ([account], [outages])

    def reply_text(self, p: dict, outcome: str) -> str:
        return f"Account {p['account_id']}: {outcome}."
