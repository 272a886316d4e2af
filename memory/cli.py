"""`evolve memory ...`: inspect and repair memory from the shell.

Destructive commands (rollback, retract, forget) ask for confirmation; `--yes` skips it.
Unknown ids and bad input print one clear line to stderr and exit with status 1.
Heavy imports (chromadb, the embedding model) happen inside the commands.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Optional

import typer

app = typer.Typer(help="Long-term memory: inspect, search, explain, roll back, retract, forget.",
                  no_args_is_help=True)

DataOpt = typer.Option(os.environ.get("EVOLVE_MEMORY_DIR", "runs/memory"), "--data",
                       help="memory data dir (ledger.db, chroma/, graph.json) [env EVOLVE_MEMORY_DIR]")
LedgerOpt = typer.Option(os.environ.get("EVOLVE_MEMORY_LEDGER"), "--ledger",
                         help="ledger SQLAlchemy URL, e.g. postgresql+psycopg://... [env EVOLVE_MEMORY_LEDGER]")
YesOpt = typer.Option(False, "--yes", "-y", help="do not ask for confirmation")


def _open(data: str, ledger: str | None) -> Any:
    from memory import MemoryService

    svc = MemoryService(ledger, data_dir=data) if ledger else MemoryService(data)
    for n in svc.notices:
        typer.secho(f"note: {n}", fg="yellow", err=True)
    return svc


def _run(data: str, ledger: str | None, fn: Any) -> None:
    from memory.models import MemoryError_

    svc = None
    try:
        svc = _open(data, ledger)
        fn(svc)
    except MemoryError_ as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(1)
    finally:
        if svc is not None:
            svc.close()


def _out(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def _when(s: str) -> float:
    """An epoch number or an ISO time."""
    try:
        return float(s)
    except ValueError:
        try:
            return datetime.fromisoformat(s).timestamp()
        except ValueError:
            raise typer.BadParameter(f"{s!r} is neither an epoch time nor an ISO date") from None


def _confirm(yes: bool, what: str) -> None:
    if not yes and not typer.confirm(f"{what}. Continue?", default=False):
        typer.echo("aborted; nothing changed")
        raise typer.Exit(1)


@app.command()
def stats(tenant: Optional[str] = typer.Option(None, help="only this tenant"),
          data: str = DataOpt, ledger: Optional[str] = LedgerOpt) -> None:
    """Ledger version, items by status, projection sizes."""
    _run(data, ledger, lambda s: _out(s.stats(tenant)))


@app.command()
def search(tenant: str, query: str, k: int = typer.Option(5, "-k"),
           kind: Optional[list[str]] = typer.Option(None, help="filter by kind (repeatable)"),
           at: Optional[str] = typer.Option(None, help="validity time (epoch or ISO)"),
           data: str = DataOpt, ledger: Optional[str] = LedgerOpt) -> None:
    """Hybrid search inside one tenant."""
    def go(s: Any) -> None:
        hits = s.search(tenant, query, k=k, kinds=kind or None, at=_when(at) if at else None)
        if not hits:
            typer.echo("no hits")
        for h in hits:
            p = h.provenance[0] if h.provenance else None
            typer.echo(f"{h.score:.3f}  {h.item.id}  [{h.item.kind}/{h.item.status}]  {h.item.text}"
                       f"  (vector {h.scores['vector']:.2f} keyword {h.scores['keyword']:.2f} "
                       f"graph {h.scores['graph']:.2f}; from {p.trajectory_id if p else '-'})")
    _run(data, ledger, go)


@app.command()
def show(item_id: str, data: str = DataOpt, ledger: Optional[str] = LedgerOpt) -> None:
    """One item, as stored now."""
    _run(data, ledger, lambda s: _out(s.get(item_id).model_dump()))


@app.command()
def explain(item_id: str, data: str = DataOpt, ledger: Optional[str] = LedgerOpt) -> None:
    """Provenance chain, full history and graph edges of an item."""
    _run(data, ledger, lambda s: _out(s.explain(item_id).model_dump()))


@app.command()
def history(item_id: Optional[str] = typer.Argument(None), tenant: Optional[str] = None,
            limit: int = 50, data: str = DataOpt, ledger: Optional[str] = LedgerOpt) -> None:
    """An item's events, or the latest ledger events."""
    def go(s: Any) -> None:
        for h in s.history(item_id, tenant=tenant, limit=limit):
            ts = datetime.fromtimestamp(h.ts).isoformat(timespec="seconds")
            typer.echo(f"{h.seq:>8}  {ts}  {h.type:<20} {h.tenant:<12} {h.item_id or h.trajectory_id or ''}"
                       f"  {h.status or ''}")
    _run(data, ledger, go)


@app.command()
def rollback(version: Optional[int] = typer.Option(None, help="ledger version to return to"),
             at: Optional[str] = typer.Option(None, help="or a time (epoch or ISO)"),
             tenant: Optional[str] = typer.Option(None, help="only this tenant"),
             reason: str = "", yes: bool = YesOpt, data: str = DataOpt,
             ledger: Optional[str] = LedgerOpt) -> None:
    """Return memory to an earlier version (recorded as new events; nothing is deleted)."""
    if (version is None) == (at is None):
        typer.secho("error: give exactly one of --version or --at", fg="red", err=True)
        raise typer.Exit(1)

    def go(s: Any) -> None:
        target = version if version is not None else s.ledger.version_at_time(_when(at))  # type: ignore[arg-type]
        if target > s.version:
            from memory import NotFound
            raise NotFound(f"unknown ledger version {target} (current version is {s.version})")
        _confirm(yes, f"Roll {'tenant ' + tenant if tenant else 'all memory'} back from version "
                      f"{s.version} to {target}")
        _out(s.rollback(target, tenant=tenant, reason=reason))
    _run(data, ledger, go)


@app.command()
def retract(trajectory: Optional[str] = typer.Option(None, help="trajectory id"),
            cycle: Optional[str] = typer.Option(None, help="evolve cycle id"),
            reason: str = "", yes: bool = YesOpt, data: str = DataOpt,
            ledger: Optional[str] = LedgerOpt) -> None:
    """Retract everything derived from a trajectory or an evolve cycle (graph edges too)."""
    if (trajectory is None) == (cycle is None):
        typer.secho("error: give exactly one of --trajectory or --cycle", fg="red", err=True)
        raise typer.Exit(1)

    def go(s: Any) -> None:
        _confirm(yes, f"Retract everything derived from {trajectory or cycle}")
        gone = (s.retract_trajectory(trajectory, reason=reason) if trajectory
                else s.retract_cycle(cycle, reason=reason))  # type: ignore[arg-type]
        _out({"retracted": gone})
    _run(data, ledger, go)


@app.command()
def forget(tenant: str, yes: bool = YesOpt, data: str = DataOpt,
           ledger: Optional[str] = LedgerOpt) -> None:
    """Erase a tenant completely and irreversibly (items, trajectories, text in old events)."""
    def go(s: Any) -> None:
        if tenant not in s.ledger.tenants():
            from memory import NotFound
            raise NotFound(f"unknown tenant {tenant!r}")
        _confirm(yes, f"Forget tenant {tenant!r} irreversibly")
        _out(s.forget_tenant(tenant))
    _run(data, ledger, go)


@app.command()
def rebuild(data: str = DataOpt, ledger: Optional[str] = LedgerOpt) -> None:
    """Rebuild the vector collection, the graph and the keyword index from the ledger."""
    _run(data, ledger, lambda s: _out(s.rebuild()))
