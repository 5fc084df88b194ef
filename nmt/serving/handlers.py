"""The server's error answers: whatever a request raises is answered `{"error": message}`
(LibreTranslate's shape) with its status, and the request is labelled with its kind for
the errors metric (`request.state.error_kind`, read by app.Guard).

    add_error_handlers(app)
    app.add_middleware(InternalErrors)  # the outermost of the app's own layers

ApiError (a request refused, nmt.serving.errors) keeps its status; FastAPI's validation
errors are 400 for a body that is not JSON and 422 for wrong types; Starlette's HTTP
errors (404, 405) keep theirs. A client's mistake is one line, in the answer and in the
access log, never a traceback. Anything else is a bug: InternalErrors logs it once with its
traceback under a request id and answers 500 `{"error": "internal error", "request": id}`,
without the exception's text (it may hold paths or data).
"""

from __future__ import annotations

import logging
import secrets
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmt.serving import batching
from nmt.serving.errors import ApiError, printable

log = logging.getLogger("nmt.serving")

STATUS_KINDS = {404: "not_found", 405: "method", 413: "too_large", 500: "internal"}


def add_error_handlers(app: FastAPI) -> None:
    """Register the handlers below on `app`."""
    app.add_exception_handler(ApiError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """`{"error": message}`: a message that echoes a client's text may hold what UTF-8
    cannot write (a lone surrogate), written as an escape."""
    return JSONResponse({"error": printable(message)}, status_code=status, headers=headers)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    request.state.error_kind = exc.kind
    headers = {"Retry-After": str(exc.retry_after)} if exc.status == 503 else None
    return error(exc.status, exc.message, headers)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        request.state.error_kind = "bad_request"
        return error(400, "body: not valid JSON")
    request.state.error_kind = "invalid"
    return error(422, describe(errors))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    request.state.error_kind = STATUS_KINDS.get(exc.status_code, "http")
    return error(
        exc.status_code, f"{request.url.path}: {exc.detail}", getattr(exc, "headers", None)
    )


class InternalErrors:
    """An exception no handler answered (a bug): logged once, with its traceback and a
    request id, and answered 500 `{"error": "internal error", "request": id}`. Raising
    nothing further keeps Starlette and uvicorn from logging it again."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - a bug: logged here, answered 500
            request_id = secrets.token_hex(4)
            where = f"{scope.get('method')} {scope.get('path')}"
            message = f"nmt-serve: internal error, request {request_id}: {where}"
            if _logged_by_a_worker(exc):
                log.error("%s (its traceback is logged above)", message)
            else:
                log.error("%s", message, exc_info=exc)
            if not started:  # else the client sees its answer cut short
                answer = JSONResponse({"error": "internal error", "request": request_id}, 500)
                await answer(scope, receive, send)


def _logged_by_a_worker(exc: BaseException) -> bool:
    """A model's worker (batching.py) logs what fails there with its traceback, once for
    the batch, before the requests in it see the exception."""
    frames = traceback.walk_tb(exc.__traceback__)
    return any(frame.f_code.co_filename == batching.__file__ for frame, _ in frames)


def describe(errors: Any) -> str:
    """Pydantic's errors as one line: `texts.1: Input should be a valid string; ...`."""
    parts = []
    for e in list(errors)[:3]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)
