"""The `evolve` command: one typer app; each package mounts its own sub-app here.

Sub-app modules keep their top-level imports light (torch, chromadb, vLLM are imported
inside the commands), so `evolve --help` stays fast.
"""
from __future__ import annotations

import typer

app = typer.Typer(help="Evolve: a memory-centric, self-evolving agent runtime.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """Evolve: a memory-centric, self-evolving agent runtime with a continual-training loop."""


from evolve import commands as _evolve_commands  # noqa: E402  (light: typer only)

app.command("cycle")(_evolve_commands.cycle)
app.command("demo")(_evolve_commands.demo)
app.add_typer(_evolve_commands.simulate_app, name="simulate")


# Sub-apps are registered below, one line each, as packages add them.
from dynamic_bench.cli import app as bench_app  # noqa: E402

app.add_typer(bench_app, name="bench")
from runtime.cli import app as serve_app  # noqa: E402
app.add_typer(serve_app, name="serve")
from memory.cli import app as memory_app  # noqa: E402
app.add_typer(memory_app, name="memory")
from training.cli import app as train_app  # noqa: E402
app.add_typer(train_app, name="train")
