"""Whether the client of the request being handled is still connected.

    app.add_middleware(ClientWatch)    outermost: keeps each request's ASGI receive
    await client_gone()                returns once that request's client has left

A request's body is read in full before its handler runs (app.Guard), so what the
server's receive gives after it is `http.disconnect` alone: the client closed the
connection (or the answer was sent). Waiting for it costs nothing while the client stays.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

_receive: ContextVar[Receive | None] = ContextVar("nmt_serve_receive", default=None)


class ClientWatch:
    """ASGI middleware: makes the request's receive known to client_gone()."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _receive.set(receive)
        try:
            await self.app(scope, receive, send)
        finally:
            _receive.reset(token)


async def client_gone() -> None:
    """Return once the client of the request being handled disconnects (never outside
    a request seen by ClientWatch)."""
    receive = _receive.get()
    if receive is None:
        await asyncio.get_running_loop().create_future()  # never done
        return
    while (await receive())["type"] != "http.disconnect":
        pass  # body left unread (not the case behind Guard): not a disconnect
