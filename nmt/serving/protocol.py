"""Bounded HTTP/1.1 for uvicorn: limits and timeouts that hold before the app (and its API
key) sees a request.

    protocol_class(HttpLimits.of(cfg))        # uvicorn.Config(http=...)
    raise_open_file_limit(max_connections)    # once, before serving

Why a subclass of uvicorn's HttpToolsProtocol: httptools (llhttp) is the fast parser that
uvicorn picks by default, and uvicorn offers only part of what a server on a network needs.
Its `timeout_keep_alive` closes idle keep-alive connections (used: keep_alive_timeout). Its
`limit_concurrency` answers 503 only once a request's head has arrived, so a slow or huge
head is still read and kept first. Its `h11_max_incomplete_event_size` bounds a request's
head only on the h11 protocol, the slower pure-Python parser, which has no timeouts either.
On httptools nothing bounds the URL or the headers (uvicorn appends every URL piece and
header, httptools joins a header's pieces until it ends) and no timeout covers a head or a
body that trickles in. This protocol adds, per connection:

- the head is fed to the parser in slices no larger than what the limits still allow, so a
  URL over max_url_bytes is 414, headers over max_headers or max_header_bytes are 431, and
  no more than the limits is ever kept;
- header_timeout runs from the connection's opening (then from each request's first byte)
  until the head is complete, and is not reset by each byte that trickles in: 408 (a
  connection that sent nothing is closed without an answer);
- body_timeout runs from the end of the head until the body is complete: 408, and the app
  sees a disconnect, never a short body;
- a connection beyond max_connections is answered 503 (Retry-After) at once.

A refusal is a one-line JSON error with `Connection: close`; the connection then reads and
drops what the client still sends until it closes or LINGER_S passes (a close with unread
input would reset the connection, and the client would lose the answer). A lingering
connection no longer counts towards max_connections (a slow client kicked out frees its
place at once); at most max_connections linger, beyond that a refused one closes at once.
Refusals are logged as warnings, each kind at most once per WARN_EVERY_S with its count.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from nmt.errors import option_error
from nmt.serving.config import ServeConfig

log = logging.getLogger("nmt.serving")

REQUEST_LINE_BYTES = 32  # a request line's method, spaces, version and line ends: not the URL
LINGER_S = 2.0  # a refused connection reads and drops input this long before it closes
WARN_EVERY_S = 5.0  # one warning per kind of refusal at most this often
FILES_KEPT = 64  # open files besides the connections: the listening socket, logs, models, pages


@dataclass(frozen=True)
class HttpLimits:
    """The limits of ServeConfig that the protocol enforces (see there)."""

    max_url_bytes: int
    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    max_connections: int

    @classmethod
    def of(cls, cfg: ServeConfig) -> HttpLimits:
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


class RefusalLog:
    """Warnings about refused requests: each message at most once per `every` seconds,
    with how many were refused since it was last written."""

    def __init__(self, every: float = WARN_EVERY_S):
        self.every = every
        self.counts: Counter[str] = Counter()
        self.written: dict[str, float] = {}

    def note(self, status: int, message: str) -> None:
        key = f"{status} {message}"
        self.counts[key] += 1
        now = time.monotonic()
        if now - self.written.get(key, -self.every) >= self.every:
            count, self.counts[key] = self.counts[key], 0
            self.written[key] = now
            log.warning("nmt-serve: answered %d connection(s) %s", count, key)


class _Refused(Exception):
    """Raised in a parser callback to stop parsing (the refusal is kept on the protocol)."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with HttpLimits; made per server by protocol_class."""

    limits: ClassVar[HttpLimits]
    refusals: ClassVar[RefusalLog]
    lingering: ClassVar[set[BoundedHttpToolsProtocol]]  # refused, not yet closed

    IDLE, HEAD, BODY = "idle", "head", "body"  # before a request, reading its head, its body

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.url = b""
        self.reading = self.IDLE
        self.head_bytes = 0  # of the request being read, as fed to the parser
        self.header_count = 0
        self.header_bytes = 0  # names, values, ": " and line ends of the complete headers
        self.refusal: tuple[int, str] | None = None  # raised in a callback, answered after
        self.refused = False  # answered already: input is dropped until the connection closes
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None

    # connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                f"server busy: max_connections={self.limits.max_connections} connections "
                "are open; retry in a moment",
            )
            return
        # the first request's head is due header_timeout after the connection opens
        self.head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lingering.discard(self)
        for timer in (self.head_timer, self.body_timer, self.linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # answered: what the client still sends is dropped
        self._unset_keepalive_if_required()
        while data and not self.refused:
            if self.reading == self.BODY:
                piece, data = data, b""
            else:  # a head: fed only as far as the limits allow, then one byte more
                room = max(self._head_limit() + 1 - self.head_bytes, 1)
                piece, data = data[:room], data[room:]
                self.head_bytes += len(piece)
            self._feed(piece)
            if not self.refused and self.reading != self.BODY:
                self._check_head_size()
        if self.refused:
            return
        begun = self.reading == self.HEAD or (self.reading == self.IDLE and self.head_bytes > 0)
        if begun and self.head_timer is None:
            # a head begun (or bytes between requests): due header_timeout from now
            self.head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)
        elif self.reading == self.BODY and self.body_timer is None:
            self.body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timed_out)

    def _feed(self, piece: bytes) -> None:
        """uvicorn's HttpToolsProtocol.data_received, with refusals answered as such."""
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserError:
            if self.refusal is not None:
                self._refuse(*self.refusal)
                return
            # JSON and a rate-limited warning, as every other refusal of this layer
            self._refuse(400, "request: not valid HTTP/1.1 (request line, method or headers)")
        except httptools.HttpParserUpgrade:
            pass  # no WebSocket routes (ws="none"): the request is answered as plain HTTP

    def _head_limit(self) -> int:
        return self.limits.max_url_bytes + self.limits.max_header_bytes + REQUEST_LINE_BYTES

    def _check_head_size(self) -> None:
        """A head still incomplete: its bytes beyond the URL are headers (one may be
        unfinished, kept whole by httptools)."""
        if self.head_bytes - len(self.url) - REQUEST_LINE_BYTES > self.limits.max_header_bytes:
            self._refuse(*self._too_many_header_bytes())

    def _too_many_header_bytes(self) -> tuple[int, str]:
        return 431, f"request headers: more than max_header_bytes={self.limits.max_header_bytes}"

    # parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.reading = self.HEAD
        self.header_count = self.header_bytes = 0

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > self.limits.max_url_bytes:
            self._stop(414, f"request URL: longer than max_url_bytes={self.limits.max_url_bytes}")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        self.header_bytes += len(name) + len(value) + 4
        if self.header_count > self.limits.max_headers:
            self._stop(431, f"request headers: more than max_headers={self.limits.max_headers}")
        if self.header_bytes > self.limits.max_header_bytes:
            self._stop(*self._too_many_header_bytes())
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.reading = self.BODY
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.reading, self.head_bytes, self.url = self.IDLE, 0, b""
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        super().on_message_complete()

    def _stop(self, status: int, message: str) -> None:
        self.refusal = (status, message)
        raise _Refused(message)

    # timeouts and refusals

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.reading == self.IDLE and self.head_bytes == 0:
            self.transport.close()  # nothing sent (a browser's spare connection): no answer
        elif self.reading != self.BODY:
            timeout = self.limits.header_timeout
            self._refuse(408, f"request headers: not complete within header_timeout={timeout} s")

    def _body_timed_out(self) -> None:
        self.body_timer = None
        if self.reading == self.BODY:
            timeout = self.limits.body_timeout
            self._refuse(408, f"request body: not complete within body_timeout={timeout} s")

    def shutdown(self) -> None:
        """The server is stopping: a request whose body is still arriving has not begun,
        so it is answered 503 now rather than holding the shutdown until body_timeout."""
        cycle = self.cycle
        if self.reading == self.BODY and cycle is not None and not cycle.response_started:
            self._refuse(503, "server shutting down; retry in a moment")
        else:
            super().shutdown()

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` with `{"error": message}` and close (after lingering). A request
        whose head is complete (body timeout) sees a disconnect in the app."""
        self.refused = True
        self.refusals.note(status, message)
        for timer in (self.head_timer, self.body_timer):
            if timer is not None:
                timer.cancel()
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete):
            # a request is under way: only the one whose body is being read, unanswered,
            # may be answered here; else an earlier answer is due first on the wire
            if self.pipeline or self.reading != self.BODY or cycle.response_started:
                self.transport.close()
                return
            cycle.disconnected = True  # the app's receive() gives http.disconnect
            cycle.message_event.set()
        payload = json.dumps({"error": message}).encode()
        head = [STATUS_LINE[status]]
        for name, value in [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
            *([(b"retry-after", b"1")] if status == 503 else []),
        ]:
            head += [name, b": ", value, b"\r\n"]
        self.transport.write(b"".join([*head, b"\r\n", payload]))
        self.connections.discard(self)  # its place is free: it only reads and drops input
        if len(self.lingering) >= self.limits.max_connections or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.lingering.add(self)
        self.linger_timer = self.loop.call_later(LINGER_S, self.transport.close)


def protocol_class(limits: HttpLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol for one server: its limits, and its refusal warnings."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {"limits": limits, "refusals": RefusalLog(), "lingering": set()},
    )


def raise_open_file_limit(max_connections: int) -> int | None:
    """Raise the process's soft limit of open files to its hard limit, and return it;
    NmtError when max_connections, as many lingering refused ones and the files the server
    keeps cannot fit under it."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise or to check
        return None

    unlimited = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # an unlimited hard limit is refused for files on some systems (macOS): then try less
    targets = (hard,) if hard != unlimited else (unlimited, 1 << 20, 10240)
    for target in targets:
        if soft == unlimited or (target != unlimited and target <= soft):
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        soft = target
        break
    if soft != unlimited and 2 * max_connections + FILES_KEPT > soft:
        raise option_error(
            "max_connections",
            max_connections,
            f"more than the open-file limit of {soft} holds (these connections, as many "
            f"refused ones lingering, and {FILES_KEPT} files of the server's own)",
            f"use at most {max((soft - FILES_KEPT) // 2, 1)}, or raise the limit (ulimit -n)",
        )
    return soft
