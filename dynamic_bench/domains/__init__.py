"""The DriftBench domains, by name."""
from __future__ import annotations

from dynamic_bench.domains.base import Domain, Rule, Rules, ToolSet, tool_change_notes
from dynamic_bench.domains.retail import Retail
from dynamic_bench.domains.telecom import Telecom

DOMAINS: dict[str, Domain] = {"retail": Retail(), "telecom": Telecom()}


def get_domain(domain: str | Domain) -> Domain:
    if isinstance(domain, Domain):
        return domain
    if domain not in DOMAINS:
        raise KeyError(f"unknown domain {domain!r}; domains: {sorted(DOMAINS)}")
    return DOMAINS[domain]


__all__ = ["DOMAINS", "Domain", "Rule", "Rules", "ToolSet", "get_domain", "tool_change_notes"]
