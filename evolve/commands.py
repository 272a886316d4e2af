"""Evolve's own commands: `evolve cycle`, `evolve demo`, `evolve simulate fit|run`.

Top-level imports stay light; each command imports what it needs when it runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import typer

simulate_app = typer.Typer(help="User-behaviour simulator: fit personas from logged feedback, drive the service.",
                           no_args_is_help=True)


def cycle(
    data_dir: Path = typer.Option(Path("runs/evolve"), help="The service's data folder (memory, policies, cycles)."),
    domain: str = typer.Option("retail", help="DriftBench domain the gate evaluates on."),
    preset: str = typer.Option("small", help="Cold-start policy preset."),
    base_model: str = typer.Option("", help="Base policy folder the service serves (default: <data-dir>/policy)."),
    rl_steps: int = typer.Option(30, help="RL learner steps for the candidate adapter."),
    gate_tasks: int = typer.Option(100, help="Tasks per gate slice (the paired test needs enough of them)."),
    tolerance: float = typer.Option(0.03, help="Largest allowed success drop on any other slice."),
    distill_tasks: int = typer.Option(64, help="Fresh tasks played with and without memory; those only memory "
                                               "solves are trained on without it (0: off)."),
    distill_focus: bool = typer.Option(True, "--distill-focus/--no-distill-focus", help="Train on the decisions "
                                       "memory changed and anchors' decisions, half of each step's draw (see "
                                       "CycleConfig)."),
    distill_neighbours: int = typer.Option(4, help="Per task only memory solved, so many tasks with its facts "
                                                   "moved a little, played the same way (0: off)."),
    distill_boundary: int = typer.Option(2, help="Per task only memory solved, so many tasks with one fact on a "
                                                 "rule's threshold or one past it, played the same way (0: off)."),
    distill_changed: int = typer.Option(2, help="Per task only memory solved, so many tasks with one fact inside "
                                                "the band a shifted threshold swept, played the same way (0: off)."),
    consolidate_neighbours: int = typer.Option(4, help="Per task of a memory item, so many tasks with its facts "
                                                       "moved a little, also solved without memory before the "
                                                       "item is retired (0: its own tasks only)."),
    consolidate_fresh_tasks: int = typer.Option(100, help="Fresh tasks under the latest rules on which the "
                                                          "promoted policy must need each memory item still live, "
                                                          "or it is retired too (0: off)."),
    seed: int = typer.Option(0),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what the cycle would do; write nothing."),
) -> None:
    """Run (or resume) one evolve cycle: mine → experience → train → gate → consolidate → report."""
    from evolve.cycle import CycleConfig, dry_run as plan, run_cycle
    from evolve.lock import CycleLocked

    cfg = CycleConfig(data_dir=str(data_dir), domain=domain, preset=preset, base_model=base_model, rl_steps=rl_steps,
                      gate_tasks=gate_tasks, tolerance=tolerance, distill_tasks=distill_tasks,
                      distill_focus=distill_focus, distill_neighbours=distill_neighbours,
                      distill_boundary=distill_boundary, distill_changed=distill_changed,
                      consolidate_neighbours=consolidate_neighbours,
                      consolidate_fresh_tasks=consolidate_fresh_tasks, seed=seed,
                      dry_run=dry_run)
    if dry_run:
        typer.echo(json.dumps(plan(cfg), indent=2, default=str))
        return
    try:
        state = run_cycle(cfg)
    except CycleLocked as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(f"{state.cycle_id}: {state.outcome}; report in {data_dir / 'cycles' / state.cycle_id / 'report.md'}")


def demo(
    out: Path = typer.Option(Path("runs/demo"), help="Output folder for the demo report."),
    preset: str = typer.Option("small", help="Policy preset: small (the demo) or tiny (tests)."),
    episodes: int = typer.Option(0, help="Episodes in the drift stream (0: the preset's default)."),
    seed: int = typer.Option(0),
    mode: str = typer.Option("auto", help="auto (full when every part is installed) | full | baseline."),
    policy: str = typer.Option("", help="Use this policy folder instead of building the cold-start policy."),
    cycle_set: list[str] = typer.Option([], "--cycle-set", help="KEY=VALUE: a CycleConfig field for the demo's "
                                        "cycle, e.g. distill_focus=true (repeatable)."),
) -> None:
    """The end-to-end demo: drift stream, memory adapting online, one evolve cycle, the report."""
    from evolve.demo import DemoConfig, run_demo

    try:
        overrides = cycle_overrides(cycle_set)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--cycle-set") from e
    report = run_demo(DemoConfig(out=str(out), preset=preset, episodes=episodes, seed=seed, mode=mode, policy=policy,
                                 cycle=overrides))
    typer.echo(report["summary_text"])


def cycle_overrides(pairs: list[str]) -> dict:
    """{field: value} from "KEY=VALUE" strings, each KEY a CycleConfig field and VALUE JSON of its type
    (a bare word is a string)."""
    from dataclasses import fields

    from evolve.cycle import CycleConfig

    defaults = {f.name: f.default for f in fields(CycleConfig)}
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in defaults:
            raise ValueError(f"{pair!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(defaults))}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        want = type(defaults[key])
        if want is float and type(value) is int:
            value = float(value)
        if type(value) is not want and not (want is tuple and isinstance(value, list)):
            raise ValueError(f"{pair!r}: {key} takes a {want.__name__}, not {text!r}")
        out[key] = tuple(value) if want is tuple else value
    return out


@simulate_app.command("fit")
def simulate_fit(
    data_dir: Path = typer.Option(Path("runs/evolve"), help="The service's data folder (its ledger holds the feedback)."),
    tenant: str = typer.Option(None, help="Only this tenant's feedback."),
    out: Path = typer.Option(Path("runs/persona-fit"), help="Folder for persona.json and validation.json/.md."),
    seed: int = typer.Option(0),
) -> None:
    """Fit persona parameters from logged feedback and validate simulated vs logged behaviour."""
    from evolve.simulator.ledger import fit_from_ledger

    res = fit_from_ledger(data_dir, tenant=tenant, out=out, seed=seed)
    typer.echo(res["summary_text"])


@simulate_app.command("run")
def simulate_run(
    url: str = typer.Option(..., help="Base URL of `evolve serve`."),
    users: int = typer.Option(4, help="Concurrent simulated users."),
    episodes: int = typer.Option(20, help="Episodes in the stream."),
    stream: str = typer.Option("silent", help="DriftBench stream preset."),
    domain: str = typer.Option("retail"),
    api_key: str = typer.Option(None, envvar="EVOLVE_API_KEY", help="Token (sent as x-api-key)."),
    persona_file: Path = typer.Option(None, help="A persona.json from `evolve simulate fit` (default: DriftBench's personas)."),
    seed: int = typer.Option(0),
    out: Path = typer.Option(None, help="Write per-episode results (JSON) here."),
) -> None:
    """Drive the service over HTTP with langgraph-sdk, as real users do."""
    from evolve.simulator.run import SimConfig, simulate

    res = simulate(SimConfig(url=url, users=users, episodes=episodes, stream=stream, domain=domain,
                             api_key=api_key, persona_file=str(persona_file) if persona_file else None,
                             seed=seed))
    if out:
        Path(out).write_text(json.dumps(res, indent=2, default=str))
    typer.echo(f"{len(res['episodes'])} episodes, success {res['success_rate']:.3f}")
