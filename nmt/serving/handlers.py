"""The server's error answers: whatever a request raises is answered `{"error": message}`
(LibreTranslate's shape) with its status, and the request is labelled with its kind for
the errors metric (`request.state.error_kind`, read by app.Guard).

    add_error_handlers(app)

ApiError (a request refused, nmt.serving.errors) keeps its status; FastAPI's validation
errors are 400 for a body that is not JSON and 422 for wrong types; Starlette's HTTP
errors (404, 405) keep theirs; anything else is a 500, logged with its traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nmt.serving.errors import ApiError

log = logging.getLogger("nmt.serving")

STATUS_KINDS = {404: "not_found", 405: "method", 413: "too_large", 500: "internal"}


def add_error_handlers(app: FastAPI) -> None:
    """Register the handlers below on `app`."""
    app.add_exception_handler(ApiError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, failed)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    request.state.error_kind = exc.kind
    headers = {"Retry-After": str(exc.retry_after)} if exc.status == 503 else None
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        request.state.error_kind = "bad_request"
        return JSONResponse({"error": "body: not valid JSON"}, status_code=400)
    request.state.error_kind = "invalid"
    return JSONResponse({"error": describe(errors)}, status_code=422)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    request.state.error_kind = STATUS_KINDS.get(exc.status_code, "http")
    return JSONResponse(
        {"error": f"{request.url.path}: {exc.detail}"},
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def failed(request: Request, exc: Exception) -> JSONResponse:
    log.exception("nmt-serve: %s %s failed", request.method, request.url.path)
    request.state.error_kind = "internal"
    return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)


def describe(errors: Any) -> str:
    """Pydantic's errors as one line: `texts.1: Input should be a valid string; ...`."""
    parts = []
    for e in list(errors)[:3]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)
