"""`evolve serve`: run the agent service (imports stay inside the command: `evolve --help` is fast)."""
from __future__ import annotations

from typing import Optional

import typer

app = typer.Typer(help="Serve the agent over the LangGraph server API.", invoke_without_command=True)


@app.callback()
def serve(
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8123, help="TCP port"),
    data_dir: str = typer.Option("runs/serve", help="tokens, threads, checkpoints, memory, policy registry"),
    engine: Optional[str] = typer.Option(None, help="torch:DIR | vllm:DIR | openai:URL#model (default: the "
                                                    "cold-start policy under the data dir)"),
    tokenizer: Optional[str] = typer.Option(None, help="tokenizer folder (for openai: engines)"),
    preset: str = typer.Option("small", help="cold-start preset when no engine is given"),
    checkpointer: str = typer.Option("sqlite", help="sqlite | postgresql://... URL"),
    memory_url: Optional[str] = typer.Option(None, help="memory ledger URL (default: <data-dir>/memory)"),
    max_turns: int = typer.Option(12, help="agent turns per episode"),
    max_new_tokens: int = typer.Option(96, help="tokens per agent turn"),
    temperature: float = typer.Option(1.0, help="sampling temperature"),
    max_body_bytes: int = typer.Option(1 << 20, help="largest request body accepted"),
    seed: int = typer.Option(0, help="seed of the cold-start policy"),
    torch_threads: int = typer.Option(1, help="intra-op threads of the in-process torch engine"),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
) -> None:
    """Serve the agent: LangGraph API (threads, runs, streaming, interrupts) + Evolve routes."""
    from runtime.service import ServiceConfig, serve as run_server

    cfg = ServiceConfig(data_dir=data_dir, engine=engine, tokenizer=tokenizer, preset=preset,
                        checkpointer=checkpointer, memory_url=memory_url, max_turns=max_turns,
                        max_new_tokens=max_new_tokens, temperature=temperature, max_body_bytes=max_body_bytes,
                        seed=seed, torch_threads=torch_threads)
    run_server(cfg, host=host, port=port, log_level=log_level)
