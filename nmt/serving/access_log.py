"""Secrets out of uvicorn's access log: a query string's api_key, key or token is written
as `api_key=***`.

    RedactSecrets.install()    # once uvicorn has configured its loggers

uvicorn's access lines are `'%s - "%s %s HTTP/%s" %d'` with the args (client, method,
path with query string, HTTP version, status); the filter rewrites the third.
"""

from __future__ import annotations

import logging
from urllib.parse import unquote_plus

SECRET_NAMES = frozenset({"api_key", "key", "token"})


def redact_query(target: str) -> str:
    """`/translate?api_key=s3cret&q=x` -> `/translate?api_key=***&q=x` (names matched
    however they are percent-encoded or cased)."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        secret = equals and unquote_plus(name).strip().lower() in SECRET_NAMES
        pairs.append(f"{name}=***" if secret else pair)
    return f"{path}?{'&'.join(pairs)}"


class RedactSecrets(logging.Filter):
    """A filter on the "uvicorn.access" logger (see the module's docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True

    @classmethod
    def install(cls) -> None:
        logger = logging.getLogger("uvicorn.access")
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())
