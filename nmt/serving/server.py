"""Run the app under uvicorn: `serve(cfg) -> exit code`.

The socket is bound first (a port in use is a one-line error at once), the models load
while the server already answers (/health says when they are ready), and SIGTERM or
Ctrl-C stop it gracefully: no new connections, the requests in flight are answered (for
up to shutdown_timeout seconds), the workers stop, and the process exits 0. A second
Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn

from nmt.errors import NmtError
from nmt.generation.translator import checkpoint_paths
from nmt.serving.access_log import RedactSecrets
from nmt.serving.app import create_app
from nmt.serving.config import ServeConfig
from nmt.serving.protocol import HttpLimits, protocol_class, raise_open_file_limit

log = logging.getLogger("nmt.serving")


class _Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM/SIGINT is a clean stop: exit 0 once drained
    (uvicorn itself raises the signal again after its graceful shutdown)."""

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
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: do not wait
            return
        name = signal.Signals(sig).name
        log.warning("nmt-serve: %s: finishing the requests in flight, then exiting", name)
        self.should_exit = True


def serve(cfg: ServeConfig) -> int:
    """Serve `cfg`'s models until SIGTERM or Ctrl-C; returns the exit code (0)."""
    cfg.validate()
    raise_open_file_limit(cfg.max_connections)
    for spec in cfg.model_specs():
        for path in checkpoint_paths(spec.checkpoint):
            if not Path(path).is_file():
                raise NmtError(f"{path}: checkpoint not found; check the path")
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
        timeout_graceful_shutdown=int(cfg.shutdown_timeout) or None,
        lifespan="on",
        http=protocol_class(HttpLimits.of(cfg)),  # httptools, bounded (protocol.py)
        ws="none",  # no WebSocket routes: an upgrade never leaves the bounded protocol
        timeout_keep_alive=cfg.keep_alive_timeout,  # type: ignore[arg-type]  # call_later: a float
    )
    RedactSecrets.install()  # after uvicorn.Config, which configures uvicorn's loggers
    server = _Server(config)
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
