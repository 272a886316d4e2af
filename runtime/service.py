"""`evolve serve`: the agent behind the LangGraph server API (the subset `langgraph-sdk` uses)
plus Evolve's routes (feedback, memory, policy versions), `/healthz`, `/metrics`, `/openapi.json`.

Everything lives under one data dir:

    <data_dir>/tokens.json          API tokens -> tenants (runtime/auth.py)
    <data_dir>/service.sqlite       threads and runs (runtime/service_db.py)
    <data_dir>/checkpoints.sqlite   LangGraph checkpoints (or a Postgres URL: --checkpointer)
    <data_dir>/memory/              Evolve's memory: ledger, trajectory log, projections
    <data_dir>/policies/            the policy registry (runtime/policy_registry.py)
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime import api_evolve, api_langgraph
from runtime.auth import TokenAuth
from runtime.metrics import Metrics

log = logging.getLogger("evolve.runtime")
OPEN_PATHS = {"/healthz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/info"}
ASSISTANTS = ({"name": "agent", "scaffold": "direct", "description": "DriftBench agent, direct act"},
              {"name": "agent-plan", "scaffold": "plan_act", "description": "DriftBench agent, plan then act"},
              {"name": "agent-supervised", "scaffold": "direct", "approval": "all",
               "description": "every proposal waits for the human (corrections become training data)"})


@dataclass
class ServiceConfig:
    """Flat service config (CLI flags of `evolve serve`)."""

    data_dir: str = "runs/serve"
    engine: str | None = None          # torch:DIR | vllm:DIR | openai:URL#model; None: cold-start policy
    tokenizer: str | None = None       # needed for openai: engines (prompts are rendered locally)
    preset: str = "small"              # cold-start preset when no engine is given
    checkpointer: str = "sqlite"       # sqlite | postgresql://... (psycopg URL)
    memory_url: str | None = None      # ledger URL; default <data_dir>/memory
    max_body_bytes: int = 1 << 20
    max_workers: int = 64
    torch_threads: int = 1             # intra-op threads of the in-process engine (1: no spin-waiting on busy cores)
    max_turns: int = 12
    max_new_tokens: int = 96
    temperature: float = 1.0
    seed: int = 0
    assistants: tuple[dict, ...] = ASSISTANTS
    extra_tools: list = field(default_factory=list)  # user-supplied LangChain tools


class Runtime:
    """Everything a request handler needs, built once at start-up."""

    def __init__(self, cfg: ServiceConfig):
        from runtime.engine_runner import EngineRunner
        from runtime.graph import AgentConfig, AgentDeps, build_graph
        from runtime.policy_registry import PolicyRegistry
        from runtime.runs import RunManager
        from runtime.service_db import ServiceDB

        self.cfg = cfg
        self.data_dir = Path(cfg.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = Metrics()
        self.auth = TokenAuth.load(self.data_dir)
        self.db = ServiceDB(self.data_dir / "service.sqlite")
        self.registry = PolicyRegistry(self.data_dir)
        if cfg.torch_threads > 0:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        engine, tokenizer = _make_engine(cfg)
        self.runner = EngineRunner(engine, self.registry)
        self.memory = _make_memory(cfg, self.data_dir)
        self.store = _make_store(self.memory)
        self.checkpointer, self._cp_close = _make_checkpointer(cfg.checkpointer, self.data_dir)
        deps = AgentDeps(runner=self.runner, tokenizer=tokenizer, memory=self.memory, tools=list(cfg.extra_tools),
                         cfg=AgentConfig(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                                         temperature=cfg.temperature,
                                         max_context=int(getattr(engine, "max_len", 1024))),
                         on_turn=self.metrics.observe_turn)
        self.graph = build_graph(deps, checkpointer=self.checkpointer, store=self.store)
        self.assistants = api_langgraph.make_assistants(cfg.assistants)
        self.runs = RunManager(self.graph, self.db, max_workers=cfg.max_workers, on_finish=self.metrics.observe_run)
        self.started_at = time.time()

    def close(self) -> None:
        self.runs.shutdown()
        self.runner.close()
        self._cp_close()
        if self.memory is not None:
            self.memory.close()
        self.db.close()


def _make_engine(cfg: ServiceConfig):
    from training.engines import make_engine
    from training.policy import load_tokenizer

    spec = cfg.engine
    if spec is None:  # the embedded default: the cold-start policy under the data dir
        from training.coldstart import ensure_coldstart

        spec = "torch:" + str(ensure_coldstart(Path(cfg.data_dir) / "policy", cfg.preset, cfg.seed))
    engine = make_engine(spec)
    tok = getattr(engine, "tokenizer", None)
    if tok is None:
        path = cfg.tokenizer or (spec.split(":", 1)[1] if spec.startswith(("torch:", "vllm:")) else None)
        if path is None:
            raise ValueError("an openai: engine needs --tokenizer DIR (prompts are rendered and encoded locally)")
        tok = load_tokenizer(path)
    return engine, tok


def _make_memory(cfg: ServiceConfig, data_dir: Path):
    from memory import MemoryService

    return MemoryService(cfg.memory_url) if cfg.memory_url else MemoryService(data_dir / "memory")


def _make_store(memory):
    try:
        from memory.store import EvolveStore
    except ImportError:  # the store adapter is optional for the service's own work
        return None
    return EvolveStore(memory)


def _make_checkpointer(spec: str, data_dir: Path):
    """SQLite by default (durable across restarts); a postgresql:// URL selects PostgresSaver."""
    if spec.startswith(("postgresql://", "postgres://")):
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        conn = Connection.connect(spec, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(conn)
        saver.setup()
        return saver, conn.close
    if spec != "sqlite":
        raise ValueError(f"checkpointer must be 'sqlite' or a postgresql:// URL, got {spec!r}")
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(data_dir / "checkpoints.sqlite"), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    saver = SqliteSaver(conn)
    saver.setup()
    return saver, conn.close


def create_app(cfg: ServiceConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        rt = Runtime(cfg)
        app.state.rt = rt
        n = rt.runs.resume_unfinished(lambda run: api_langgraph.configurable_for(rt, run))
        if n:
            log.warning("resumed %d unfinished run(s) after a restart", n)
        try:
            yield
        finally:
            rt.close()

    app = FastAPI(title="Evolve agent service", version="0.1.0", lifespan=lifespan,
                  description="The Evolve agent behind the LangGraph server API, plus feedback, "
                              "memory and policy routes. Auth: `Authorization: Bearer <token>` or `x-api-key`.")
    app.include_router(api_langgraph.router)
    app.include_router(api_evolve.router)

    @app.middleware("http")
    async def limits_auth_metrics(request: Request, call_next):
        """Size limits, then auth (before the body is even parsed), then the route; metrics."""
        t0 = time.perf_counter()
        cl = request.headers.get("content-length")
        if cl is not None and (not cl.isdigit() or int(cl) > cfg.max_body_bytes):
            return JSONResponse({"detail": f"request body too large (limit {cfg.max_body_bytes} bytes)"}, 413)
        if cl is None and request.headers.get("transfer-encoding"):  # a length we can check up front
            return JSONResponse({"detail": "send a Content-Length header (chunked request bodies are refused)"}, 411)
        rt = getattr(request.app.state, "rt", None)
        if request.url.path not in OPEN_PATHS and rt is not None:
            request.state.principal = rt.auth.authenticate(request.headers)
            if request.state.principal is None:
                return JSONResponse({"detail": "missing or invalid API token: send 'Authorization: Bearer <token>' "
                                               "or 'x-api-key: <token>'"}, 401, headers={"WWW-Authenticate": "Bearer"})
        try:
            response = await call_next(request)
        except Exception:  # never a bare 500 page: log it, answer with a JSON error
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            response = JSONResponse({"detail": "internal error (logged)"}, 500)
        route = request.scope.get("route")
        if rt is not None:
            rt.metrics.observe_request(request.method, getattr(route, "path", "unmatched"), response.status_code,
                                       time.perf_counter() - t0)
        return response

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"] if x != "body") or "body"
        return JSONResponse({"detail": f"invalid request: {where}: {first['msg']}", "errors": errors}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=getattr(exc, "headers", None))

    @app.get("/healthz", tags=["ops"])
    def healthz(request: Request) -> dict[str, Any]:
        rt: Runtime = request.app.state.rt
        return {"ok": rt.runner.swap_error is None, "uptime_s": round(time.time() - rt.started_at, 1),
                "torch_threads": rt.cfg.torch_threads,
                **rt.runner.status(), "active_runs": sum(not h.finished.is_set() for h in rt.runs.handles.values())}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    def metrics(request: Request) -> PlainTextResponse:
        rt: Runtime = request.app.state.rt
        rt.metrics.set_policy(rt.runner.policy_version)
        body, ctype = rt.metrics.render()
        return PlainTextResponse(body, media_type=ctype)

    @app.get("/info", tags=["ops"])
    def info() -> dict[str, Any]:
        return {"version": "0.1.0", "langgraph_api": "subset", "flags": {"assistants": True, "crons": False,
                                                                         "store": False}}

    return app


def serve(cfg: ServiceConfig, host: str = "127.0.0.1", port: int = 8123, log_level: str = "warning") -> None:
    import uvicorn

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not (Path(cfg.data_dir) / "tokens.json").exists() and not _env_tokens():
        token = TokenAuth.bootstrap(cfg.data_dir)
        print(f"created {Path(cfg.data_dir) / 'tokens.json'} with an admin token: {token}", flush=True)
    uvicorn.run(create_app(cfg), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2)


def _env_tokens() -> bool:
    import os

    return bool(os.environ.get("EVOLVE_TOKENS"))


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)
