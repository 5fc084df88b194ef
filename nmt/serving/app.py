"""The FastAPI app of nmt-serve: routes, limits, metrics, the web page (error answers:
handlers.py).

    create_app(cfg, models=None) -> FastAPI

Without `models`, the app loads cfg's models in a thread when it starts, so the server
answers at once: /health is 503 until every model is loaded, then 200 (a failed load:
503 "failed", the reason in the log only, as it names files). Every error is
`{"error": message}` (LibreTranslate's shape) with its status. A body over
max_body_bytes is refused (413) before anything reads it. /docs is a page of our own
(static/docs.html, no third-party script) that renders /openapi.json; both as
cfg.api_docs says: off, behind the API key (key), or public.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmt import __version__
from nmt.serving import libretranslate, native
from nmt.serving.config import ServeConfig
from nmt.serving.disconnect import ClientWatch
from nmt.serving.handlers import STATUS_KINDS, InternalErrors, add_error_handlers
from nmt.serving.metrics import CONTENT_TYPE, Metrics
from nmt.serving.models import ModelRegistry
from nmt.serving.service import STOPPING, Service

log = logging.getLogger("nmt.serving")

STATIC = Path(__file__).resolve().parent / "static"
WORKER_STOP_TIMEOUT = 10.0  # seconds to wait for a worker to leave its decoding step
ROUTES = {
    "/",
    "/health",
    "/metrics",
    "/languages",
    "/translate",
    "/v1/models",
    "/v1/translate",
    "/v1/score",
}


def create_app(
    cfg: ServeConfig,
    models: ModelRegistry | None = None,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The server's app for `cfg`. `models`: already loaded (the app does not close them);
    else loaded at startup, and `on_load_error(exc)` hears of a failure (the server stops)."""
    cfg.validate()
    service = Service(cfg)
    metrics = Metrics(
        lambda: {m.name: m.queue.queued for m in service.models.models} if service.models else {}
    )
    state: dict[str, Any] = {"error": None}

    def ready(registry: ModelRegistry) -> None:
        registry.report_batches(metrics.batch, metrics.dropped)
        service.ready(registry)
        metrics.models_loaded.set(1)

    def load() -> None:
        try:
            registry = ModelRegistry.load(cfg)
        except BaseException as exc:  # noqa: BLE001 - reported to the server, which stops
            state["error"] = exc
            log.error("nmt-serve: loading the models failed: %s", exc)
            if on_load_error is not None:
                on_load_error(exc)
            return
        ready(registry)
        names = ", ".join(f"{m.name} ({m.label()})" for m in registry.models)
        log.info("nmt-serve: ready: %s", names)

    loader = threading.Thread(target=load, name="nmt-serve-load", daemon=True)

    def stop_workers() -> bool:
        """Stop the workers of the models the app loaded: what is left is dropped (its
        requests were answered: the drain is over) and a running batch stops at its
        next step. True once no thread of the app is left in torch (loading, decoding)."""
        service.halt(STOPPING)
        if models is not None:
            return True  # the caller's models, the caller's to close
        stopped = service.models is None or service.models.close(WORKER_STOP_TIMEOUT, cancel=True)
        return stopped and not loader.is_alive()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if models is None:
            loader.start()
        else:
            ready(models)
        yield
        # uvicorn has let the requests in flight finish (the server's drain answers those
        # not done within shutdown_timeout with a 503 and cancels their jobs).
        app.state.workers_stopped = stop_workers()

    app = FastAPI(
        title="nmt-serve",
        version=__version__,
        description="Translation with nmt: LibreTranslate's API and nmt's own (/v1).",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: ours below
        redoc_url=None,
        openapi_url=None,
    )
    app.state.service = service
    app.state.stop_workers = stop_workers
    app.state.workers_stopped = False
    app.state.metrics = metrics
    app.state.load_state = state

    add_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.models is not None:
            return JSONResponse({"status": "ok", "models": list(service.models.by_name)})
        if state["error"] is not None:  # its message names files: the log has it
            error = "the models did not load; the server's log says why"
            return JSONResponse({"status": "failed", "error": error}, 503)
        return JSONResponse({"status": "loading"}, 503)

    if cfg.api_docs != "off":

        def check_key(request: Request) -> None:
            if cfg.api_docs == "key":  # as the translation routes: ?api_key= or Bearer
                given = request.query_params.get("api_key")
                service.check_key(given, request.headers.get("authorization"))

        @app.get("/openapi.json", include_in_schema=False)
        async def openapi(request: Request) -> JSONResponse:
            check_key(request)
            return JSONResponse(app.openapi())

        @app.get("/docs", include_in_schema=False)
        async def docs(request: Request) -> FileResponse:
            check_key(request)
            return FileResponse(STATIC / "docs.html")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    app.include_router(libretranslate.router(service))
    app.include_router(native.router(service))
    if cfg.web_page:

        @app.get("/", include_in_schema=False)
        async def page() -> FileResponse:
            return FileResponse(STATIC / "index.html")

        app.mount("/static", StaticFiles(directory=STATIC), name="static")

    if cfg.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cfg.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(
        Guard,
        metrics=metrics,
        max_body_bytes=cfg.max_body_bytes,
        allowed_hosts=list(cfg.allowed_hosts),
    )
    app.add_middleware(InternalErrors)  # outside Guard: Guard counts the 500 it answers
    app.add_middleware(ClientWatch)  # outermost: its receive gives only the disconnect
    return app


class _Refusal(Exception):
    """A request Guard answers itself: `status`, `{"error": message}`, metrics' `kind`."""

    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class Guard:
    """Outermost ASGI layer: refuses a Host not in allowed_hosts (400), a body over the
    limit (413) before the app reads it and a body cut off by a disconnect (400: never
    passed on as complete), and records each request's status, latency and error kind
    (metrics). Starlette's TrustedHostMiddleware checks hosts the same way, but answers in
    plain text and reads an IPv6 Host (`[::1]:5000`) wrongly: hence `_check_host`."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        max_body_bytes: int,
        allowed_hosts: list[str] | None = None,
    ):
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes
        hosts = [h.lower().strip("[]") for h in allowed_hosts or ["*"]]
        self.allowed_hosts = None if "*" in hosts else hosts  # None: any host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path = scope["path"]
        route = path if path in ROUTES else "static" if path.startswith("/static/") else "other"
        status, answered = [500], [False]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0], answered[0] = message["status"], True
            await send(message)

        state = scope.setdefault("state", {})
        self.metrics.in_flight.inc()
        try:
            self._check_host(scope)
            body = await self._body(scope, receive)
            await self.app(scope, _replay(body, receive), send_status)
        except _Refusal as refusal:
            state["error_kind"] = refusal.kind
            await _answer(send_status, refusal.status, refusal.message)
        except Exception:
            if not answered[0]:
                raise
            # answered (500) and logged by the app's handler: nothing more to say
        finally:
            self.metrics.in_flight.dec()
            kind = state.get("error_kind")
            if kind is None and status[0] >= 400:
                kind = STATUS_KINDS.get(status[0], "http")
            self.metrics.answered(route, status[0], time.perf_counter() - start, kind)

    def _check_host(self, scope: Scope) -> None:
        """Refuse a Host header that allowed_hosts does not name (exact, or *.domain)."""
        if self.allowed_hosts is None:
            return
        value = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip().lower()
        host = value[1:].partition("]")[0] if value.startswith("[") else value.rpartition(":")[0]
        host = host or value  # no port
        for pattern in self.allowed_hosts:
            if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
                return
        raise _Refusal(400, f"Host: {value!r} is not a host this server answers to", "bad_host")

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body; a _Refusal when it is over the limit or cut off."""
        too_large = _Refusal(413, f"body: more than {self.max_body_bytes} bytes", "too_large")
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > self.max_body_bytes:
                        raise too_large
                except ValueError:
                    pass
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # the client left (or timed out, body_timeout) before the body's end
                raise _Refusal(400, "body: the connection closed before its end", "truncated")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then the client's next messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Send, status: int, message: str) -> None:
    payload = json.dumps({"error": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
