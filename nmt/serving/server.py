"""Run the app under uvicorn: `serve(cfg) -> exit code`.

The checkpoints are found and the glossaries read, then the socket is bound (a missing
file, a bad glossary line or a port in use is a one-line error at once), the models load
while the server already answers (/health says when they are ready), and SIGTERM or
Ctrl-C stop it gracefully: no new connections, the requests in flight are answered (for
up to shutdown_timeout seconds), those still waiting then get a JSON 503 and their work
is dropped at the next decoding step, the workers stop, and the process exits 0. A
second SIGTERM or Ctrl-C cuts the drain short the same way: 503s now, then exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import uvicorn

from nmt.errors import NmtError
from nmt.generation.translator import checkpoint_paths
from nmt.serving.access_log import RedactSecrets
from nmt.serving.app import create_app
from nmt.serving.config import ServeConfig
from nmt.serving.models import read_glossaries
from nmt.serving.protocol import HttpLimits, protocol_class, raise_open_file_limit

log = logging.getLogger("nmt.serving")

# uvicorn cancels the requests still running this long after shutdown_timeout: a backstop
# for those not waiting for a translation (the drain answers those itself, as JSON).
DRAIN_GRACE = 5.0
# after a second signal, seconds for the 503s to go out before uvicorn stops waiting
CUT_SHORT_GRACE = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM/SIGINT is a clean stop: exit 0 once drained
    (uvicorn itself raises the signal again after its graceful shutdown). `halt(message)`
    answers the requests waiting for translations with a 503 (Service.halt): called
    shutdown_timeout after the first signal, or at a second one."""

    def __init__(
        self, config: uvicorn.Config, halt: Callable[[str], None], shutdown_timeout: float
    ):
        super().__init__(config)
        self.halt, self.shutdown_timeout = halt, shutdown_timeout
        self.signals = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._stop) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        # (a signal handler: it only sets flags and hands the rest to the event loop)
        name = signal.Signals(sig).name
        self.signals += 1
        self.should_exit = True
        loop = self.loop
        if self.signals == 1:
            log.warning(
                "nmt-serve: %s: finishing the requests in flight (for up to "
                "shutdown_timeout=%g s), then exiting",
                name,
                self.shutdown_timeout,
            )
            message = (
                f"the server is stopping; not translated within shutdown_timeout="
                f"{self.shutdown_timeout:g} s; retry on another server"
            )
            if loop is not None:
                loop.call_soon_threadsafe(
                    loop.call_later, self.shutdown_timeout, self.halt, message
                )
            return
        if self.signals == 2:
            log.warning("nmt-serve: %s again: answering the requests in flight now", name)
            if loop is not None:
                message = "the server is stopping; its drain was cut short; retry elsewhere"
                loop.call_soon_threadsafe(self.halt, message)
                loop.call_soon_threadsafe(loop.call_later, CUT_SHORT_GRACE, self._cut_short)

    def _cut_short(self) -> None:
        self.force_exit = True  # uvicorn stops waiting for connections and skips the lifespan


def serve(cfg: ServeConfig) -> int:
    """Serve `cfg`'s models until SIGTERM or Ctrl-C; returns the exit code (0)."""
    cfg.validate()
    raise_open_file_limit(cfg.max_connections)
    for spec in cfg.model_specs():
        for path in checkpoint_paths(spec.checkpoint):
            if not Path(path).is_file():
                raise NmtError(f"{path}: checkpoint not found; check the path")
    read_glossaries(cfg)  # a bad line stops the server before it binds (read again to load)
    sock = bind(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    failure: list[BaseException] = []
    server: _Server | None = None

    def load_failed(exc: BaseException) -> None:
        failure.append(exc)
        if server is not None:
            server.should_exit = True

    _log_to_stderr(cfg.log_level)
    app = create_app(cfg, on_load_error=load_failed)
    config = uvicorn.Config(
        app,
        log_level=cfg.log_level,
        access_log=cfg.access_log,
        timeout_graceful_shutdown=cfg.shutdown_timeout + DRAIN_GRACE,  # type: ignore[arg-type]
        lifespan="on",
        http=protocol_class(HttpLimits.of(cfg)),  # httptools, bounded (protocol.py)
        ws="none",  # no WebSocket routes: an upgrade never leaves the bounded protocol
        timeout_keep_alive=cfg.keep_alive_timeout,  # type: ignore[arg-type]  # call_later: a float
    )
    RedactSecrets.install()  # after uvicorn.Config, which configures uvicorn's loggers
    server = _Server(config, app.state.service.halt, cfg.shutdown_timeout)
    shown = f"[{host}]" if ":" in host else host
    print(
        f"nmt-serve: serving on http://{shown}:{port} (the models are loading; "
        f"GET /health answers 200 once they are ready)",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not app.state.workers_stopped:  # the lifespan's shutdown was cut short (or failed)
        app.state.workers_stopped = app.state.stop_workers()
    if not app.state.workers_stopped:
        # A thread is still inside torch (a decoding step or a model loading past the
        # wait): finalizing the interpreter under it aborts the process (SIGABRT, exit
        # 134). Every answer has been sent and nothing else is left to write, so leave
        # at once, without finalizing.
        log.warning("nmt-serve: a model's thread is still busy; exiting without waiting")
        print("nmt-serve: stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    if failure:
        exc = failure[0]
        raise exc if isinstance(exc, NmtError) else NmtError(f"loading the models failed: {exc}")
    print("nmt-serve: stopped", file=sys.stderr, flush=True)
    return 0


def _log_to_stderr(level: str) -> None:
    """nmt's own messages (ready, draining, truncated lines) as uvicorn writes its own."""
    from uvicorn.logging import DefaultFormatter

    for name in ("nmt.serving", "nmt.generation"):
        logger = logging.getLogger(name)
        logger.setLevel(level.upper())
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False))
            logger.addHandler(handler)
            logger.propagate = False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise NmtError(
            f"host={host}: not an address here ({exc.strerror}); use 127.0.0.1"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise NmtError(
                f"port={port}: already in use on {host}; choose another port (port=0: any free one)"
            ) from None
        raise NmtError(f"host={host} port={port}: cannot listen there ({exc.strerror})") from None
    sock.set_inheritable(True)
    return sock
