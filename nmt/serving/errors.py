"""ApiError: a request the server refuses, answered as `{"error": message}` with a status.

Messages follow the project's style: `what: what is wrong; what to do`.
"""

from __future__ import annotations


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
