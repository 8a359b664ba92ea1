"""One exception per kind of failure, all under BertserveError.

The server answers errors as JSON `{"error": message, "error_type": kind}`; the status code picks
the class. Transport failures get their own two classes. They are named `APIConnectionError` and
`APITimeoutError` (as in openai-python) so that they do not shadow Python's builtin
`ConnectionError` and `TimeoutError` in a module that does `from bertserve_client import *`.
`ValidationError` is ours, not pydantic's: import it as `bertserve_client.ValidationError`.
"""

from __future__ import annotations

import httpx


class BertserveError(Exception):
    """Base class. `status_code`, `error_type` and `response` are None when no HTTP answer came;
    `retry_after` is the answer's Retry-After in seconds (a 429 or a 503 says it), else None. `partial`: when
    a list was sent as several requests and one failed, what the requests before it answered (the call's answer
    for the items before the failed request's; for rerank, the ranking of those texts), else None."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_type: str | None = None,
        response: httpx.Response | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_type = error_type
        self.response = response
        self.retry_after = retry_after
        self.partial: list | None = None

    def _add_note(self, note: str) -> None:
        """Append context the SDK knows and the server did not say (which request of a split list, the attempts)."""
        self.message = f"{self.message} ({note})"
        self.args = (self.message, *self.args[1:])

    def __str__(self) -> str:
        if self.status_code is None:
            return self.message
        kind = f" {self.error_type}" if self.error_type else ""
        return f"HTTP {self.status_code}{kind}: {self.message}"


class ValidationError(BertserveError):
    """The request was refused as it stands: 422 invalid, 400 empty, 413 too large. Not retried."""


class UnauthorizedError(BertserveError):
    """401: missing or wrong API key. Not retried."""


class NotFoundError(BertserveError):
    """404: no such route, e.g. a task this server's model does not serve. Not retried."""


class OverloadedError(BertserveError):
    """429: the server's queue is full. Retried, waiting `retry_after` seconds when it says so."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs) -> None:
        super().__init__(message, retry_after=retry_after, **kwargs)


class ServerError(BertserveError):
    """5xx: the backend failed or is not ready (503, with `retry_after` when the server says). Retried."""


class APIConnectionError(BertserveError):
    """No HTTP answer: refused, reset, DNS, TLS. Retried."""


class APITimeoutError(APIConnectionError):
    """The request took longer than the client's `timeout`. Retried."""


_BY_STATUS: dict[int, type[BertserveError]] = {
    400: ValidationError,
    401: UnauthorizedError,
    404: NotFoundError,
    413: ValidationError,
    422: ValidationError,
    429: OverloadedError,
}


def error_class_for(status_code: int) -> type[BertserveError]:
    if status_code in _BY_STATUS:
        return _BY_STATUS[status_code]
    if status_code >= 500:
        return ServerError
    return BertserveError
