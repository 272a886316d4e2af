"""Evolve memory: working, short-term and long-term tiers over an append-only event ledger.

The ledger (SQL via sqlmodel) is the truth; the chromadb collection, the networkx graph and the
keyword index are projections of it. See `memory.service.MemoryService`.
"""
from memory.models import (KINDS, STATUSES, Explanation, Hit, HistoryEntry, InvalidInput,
                           MemoryItem, NotFound, Provenance, TrajectoryPage)
from memory.service import MemoryConfig, MemoryService

__all__ = ["KINDS", "STATUSES", "Explanation", "Hit", "HistoryEntry", "InvalidInput", "MemoryConfig",
           "MemoryItem", "MemoryService", "NotFound", "Provenance", "TrajectoryPage"]
