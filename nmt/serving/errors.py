"""ApiError: a request the server refuses, answered as `{"error": message}` with a status;
and the check every request's text gets before anything uses it (`check_text`).

Messages follow the project's style: `what: what is wrong; what to do`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """An HTTP error answer: `status` and a one-line `message`."""

    def __init__(
        self, status: int, message: str, *, kind: str = "bad_request", retry_after: int = 1
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind  # the errors metric's label: bad_request, too_large, busy, ...
        self.retry_after = retry_after  # a 503's Retry-After, in seconds


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def too_large(message: str) -> ApiError:
    return ApiError(413, message, kind="too_large")


def check_text(fields: Mapping[str, Any]) -> None:
    """Every string in `fields` (and in its lists and objects) must be text UTF-8 can
    write: JSON's "\\ud800" parses to a lone surrogate, which the tokenizer, the key
    check and the answer cannot encode. A 400 naming the field (`texts[2]`) otherwise."""
    for key, value in fields.items():
        _check(printable(str(key)), value)


def _check(where: str, value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise bad_request(
                f"{where}: not text (a lone surrogate, {printable(value[exc.start])}, at "
                f"character {exc.start}); send UTF-8 text"
            ) from None
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check(f"{where}[{i}]", item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check(f"{where}.{printable(str(key))}", item)


def printable(text: str) -> str:
    """`text` with what UTF-8 cannot write (lone surrogates) as \\udXXX escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
