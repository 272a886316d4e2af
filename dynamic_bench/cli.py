"""`evolve bench`: list the benchmark, print a rule version's policy, run a baseline over a stream."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(help="DriftBench: tool-using domains whose rules change over an episode stream.",
                  no_args_is_help=True)


@app.command("list")
def list_cmd() -> None:
    """Environments, domains with their rule versions, stream presets, agents and personas."""
    from dynamic_bench import AGENTS, BENCH_VERSION, DOMAINS, PERSONAS, PRESETS, list_envs

    typer.echo(f"bench version: {BENCH_VERSION}")
    typer.echo("envs: " + ", ".join(list_envs()))
    for name, d in DOMAINS.items():
        typer.echo(f"domain {name}: rule versions {sorted(d.versions)}; tool drift {d.tool_drift[0]}->{d.tool_drift[1]}")
    typer.echo("streams: " + ", ".join(PRESETS) + ", or a JSON/YAML schedule file")
    typer.echo("agents: " + ", ".join(AGENTS))
    typer.echo("personas: " + ", ".join(PERSONAS))


@app.command("policy")
def policy_cmd(domain: str = typer.Option(..., "--domain", "-d"),
               version: int = typer.Option(1, "--version", "-v")) -> None:
    """Print the rendered rules (and tools) of one rule version."""
    from dynamic_bench import get_domain

    try:
        d = get_domain(domain)
        rules = d.rules_for(version)
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0])) from e
    typer.echo(d.policy_text(rules, version))
    typer.echo("tools: " + "; ".join(s.signature() + (" [write]" if s.is_write else "")
                                     for s in d.tools(rules).values()))


def plot_curve(summary: dict[str, Any], path: Path, title: str) -> None:
    """Success over episodes (trailing window), shifts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(summary["curve"], label=f"success (window {summary['window']})")
    for s in summary["shifts"]:
        ax.axvline(s["index"], color="red", ls="--", lw=1)
        ax.text(s["index"], 1.02, f"{s['kind']} v{s['to_version']}", fontsize=7, color="red")
    ax.set_ylim(-0.02, 1.1)
    ax.set_xlabel("episode")
    ax.set_ylabel("success")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@app.command("run")
def run_cmd(agent: str = typer.Option("oracle", "--agent", help="oracle, stale or random"),
            domain: str = typer.Option("retail", "--domain"),
            stream: str = typer.Option("mixed", "--stream", help="a preset or a JSON/YAML schedule file"),
            episodes: int = typer.Option(200, "--episodes", min=1),
            seed: int = typer.Option(0, "--seed"),
            out: Path = typer.Option(Path("runs/bench"), "--out"),
            pass_tasks: int = typer.Option(20, "--pass-tasks", help="final-phase tasks re-run 4 times for pass^k"),
            ) -> None:
    """Run a baseline agent over a drift stream; write DIR/result.json and DIR/curve.png."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from dynamic_bench import AGENTS, make_stream, metrics, repeat_tasks, run_stream

    if agent not in AGENTS:
        raise typer.BadParameter(f"unknown agent {agent!r}; agents: {', '.join(AGENTS)}")
    try:
        s = make_stream(stream, domain, episodes, seed)
    except (KeyError, ValueError) as e:
        raise typer.BadParameter(str(e)) from e
    make_agent = AGENTS[agent]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        job = bar.add_task(f"{agent} on {domain}/{s.name}", total=episodes)
        results = run_stream(make_agent(seed=seed), s, on_episode=lambda r: bar.advance(job))
    last = s.phases[-1]
    tasks = [ep.task for ep in s.episodes[last["start"]:last["end"]]][:pass_tasks]
    trials = repeat_tasks(make_agent, tasks, n_trials=4, seed=seed)
    summary = metrics.summarize(results, s, pass_trials=trials, agent=agent)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(summary, indent=1))
    plot_curve(summary, out / "curve.png", f"DriftBench {summary['bench_version']}: {agent} on {domain}/{s.name}")
    con = Console()
    t = Table(title=f"{agent} on {domain}/{s.name} ({episodes} episodes, seed {seed})")
    for c in ("phase", "episodes", "version", "kind", "success"):
        t.add_column(c)
    for p in summary["phases"]:
        t.add_row(str(p["phase"]), f"{p['start']}-{p['end']}", str(p["version"]), p["kind"],
                  "-" if p["success_rate"] is None else f"{p['success_rate']:.2f}")
    con.print(t)
    pk = ", ".join(f"{k}={v:.2f}" for k, v in summary["pass_k"].items() if v is not None)
    con.print(f"success {summary['success_rate']:.3f}  aulc {summary['aulc']:.3f}  recovery "
              f"{summary['recovery_episodes']} (changed tasks {summary['recovery_episodes_changed']})  "
              f"stale-violation rate {summary['stale_violation_rate']:.3f}  "
              f"pass^k {pk}")
    con.print(f"wrote {out / 'result.json'} and {out / 'curve.png'}")
