"""One error type, mapped to HTTP in one place: every failure leaves the server as
`{"error": message, "error_type": kind}` with its status and headers from the table below (one class a row)
— never HTML, never a stack trace. On OpenAI's paths (/v1/...) "error" is OpenAI's error object instead,
`{"message", "type", "param", "code"}`, so that OpenAI's clients show the message; "error_type" stays."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bert.tasks import base as task_errors
from bert.tasks.common import TooMuchWork
from bert.tokenizer import InputTooLong

log = logging.getLogger("bertserve")


class ServingError(Exception):
    """An error a client sees. Each subclass is one row of the table: its status, its `error_type`, and
    whether the client should retry after a while (Retry-After). Raise it from anywhere in a request, or
    answer with `.response()` where there is no route to raise from (middleware, the protocol)."""

    status = 500
    error_type = "internal"
    retry_after_s: int | None = None  # seconds, sent as Retry-After

    def __init__(self, message: str, *, retry_after_s: int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        retry = retry_after_s if retry_after_s is not None else self.retry_after_s
        self.headers = {**({"Retry-After": str(retry)} if retry is not None else {}), **(headers or {})} or None

    def response(self, path: str | None = None) -> JSONResponse:
        """The JSON answer; `path`, the request's, picks OpenAI's error object on its paths (error_body)."""
        return error_response(self.status, self.message, self.error_type, self.headers, path)


class BadRequest(ServingError):
    status, error_type = 400, "bad_request"


class EmptyInput(ServingError):
    status, error_type = 400, "empty"


class Unauthorized(ServingError):
    status, error_type = 401, "unauthorized"

    def __init__(self, message: str = "missing or wrong API key (send 'Authorization: Bearer KEY')", **options):
        super().__init__(
            message, headers={"WWW-Authenticate": "Bearer", **(options.pop("headers", None) or {})}, **options
        )


class NotFound(ServingError):
    status, error_type = 404, "not_found"


class MethodNotAllowed(ServingError):
    status, error_type = 405, "method_not_allowed"


class RequestTimeout(ServingError):
    status, error_type = 408, "timeout"


class PayloadTooLarge(ServingError):
    status, error_type = 413, "payload_too_large"


class UnsupportedMediaType(ServingError):
    status, error_type = 415, "unsupported_media_type"


class ValidationFailed(ServingError):
    status, error_type = 422, "validation"


class Overloaded(ServingError):
    status, error_type, retry_after_s = 429, "overloaded", 1


class HeadersTooLarge(ServingError):
    status, error_type = 431, "headers_too_large"


class ClientClosed(ServingError):
    status, error_type = 499, "client_closed"  # nobody reads it: the caller has hung up


class Internal(ServingError):
    status, error_type = 500, "internal"


class BackendFailure(ServingError):
    status, error_type = 500, "backend"


class Unavailable(ServingError):
    """Warming up, shutting down (retry: another replica or a moment later), or failed to start (no retry)."""

    status, error_type, retry_after_s = 503, "unavailable", 1


# The table, as ASGI-level code needs it: status -> the error for that status (the first of its kinds).
BY_STATUS: dict[int, type[ServingError]] = {}
for _kind in (
    BadRequest,
    EmptyInput,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
    Overloaded,
    HeadersTooLarge,
    ClientClosed,
    Internal,
    BackendFailure,
    Unavailable,
):
    BY_STATUS.setdefault(_kind.status, _kind)


# The tasks' refusals (bert.tasks: a route's check, a codec's encode and decode), by exception type: the first
# row whose type matches gives the client's error. A ValueError from a task names the field it refuses.
TASK_REFUSALS: tuple[tuple[type[Exception], type[ServingError]], ...] = (
    (task_errors.EmptyInput, EmptyInput),
    (task_errors.TooManyInputs, PayloadTooLarge),
    (TooMuchWork, PayloadTooLarge),
    (task_errors.UnknownTask, NotFound),
    (InputTooLong, ValidationFailed),
    (ValueError, ValidationFailed),  # also UnicodeError, and each task's own (a question too long for a window)
    (TypeError, ValidationFailed),  # an item of the wrong shape for the task's codec
)


def refusal(error: Exception) -> ServingError | None:
    """The client's error for an exception a task raised (TASK_REFUSALS), or None: not a refusal, a fault."""
    if isinstance(error, ServingError):
        return error
    kind = next((kind for cause, kind in TASK_REFUSALS if isinstance(error, cause)), None)
    return kind(str(error)) if kind is not None else None


def for_status(status: int, message: str, headers: dict | None = None) -> ServingError:
    """The table's error for an HTTP status raised by the framework (404, 405, 413 from a body limit...)."""
    kind = BY_STATUS.get(status) or type(
        f"Http{status}",
        (ServingError,),
        {"status": status, "error_type": "internal" if status >= 500 else "bad_request"},
    )
    return kind(message, headers=headers)


OPENAI_PREFIX = "/v1/"  # OpenAI's paths: their errors in OpenAI's shape


def error_body(message: str, error_type: str, path: str | None = None) -> dict:
    if path is not None and path.startswith(OPENAI_PREFIX):
        return {
            "error": {"message": message, "type": error_type, "param": None, "code": None},
            "error_type": error_type,
        }
    return {"error": message, "error_type": error_type}


def error_message(body: dict) -> str:
    """The message of an error body of either shape."""
    error = body.get("error")
    return error.get("message", "") if isinstance(error, dict) else str(error)


def error_response(
    status: int, message: str, error_type: str, headers: dict | None = None, path: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, error_type, path), status_code=status, headers=headers)


# Union members show up in pydantic's error locations ("str", "list[QARequest]", "QARequest"): not fields.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|\w*\[.*\]|[A-Z]\w*(Request|Item))$")


def _field(loc) -> str:
    # ("body", "inputs", 0) -> "inputs[0]": name the field the way the caller wrote it
    parts = [str(p) for p in loc if p != "body" and not _TYPE_TAG.match(str(p))]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def _wrong_branch(loc, body) -> bool:
    """True when the error is about a union member that the sent value plainly is not (a list sent where
    the error explains what an object would need): such errors only add noise."""
    value = {"body": body}
    for part in loc:
        part_s = str(part)
        if _TYPE_TAG.match(part_s):
            if part_s.startswith("list[") and not isinstance(value, list):
                return True
            if part_s[:1].isupper() and not isinstance(value, dict):
                return True
            if part_s == "str" and isinstance(value, (list, dict)):
                return True
            continue
        try:
            value = value[part] if not isinstance(value, list) or isinstance(part, int) else None
        except (KeyError, IndexError, TypeError):
            return False
    return False


def validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    body = getattr(exc, "body", None)
    relevant = [e for e in errors if not _wrong_branch(e.get("loc", ()), body)]
    messages = []
    for error in (relevant or errors)[:5]:
        if error.get("type") == "json_invalid":
            messages.append(f"body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}")
        elif error.get("type") == "missing" and tuple(error.get("loc", ())) == ("body",):
            messages.append("body: a JSON object is required")
        else:
            messages.append(f"{_field(error.get('loc', ()))}: {error.get('msg')}")
    return "; ".join(dict.fromkeys(messages)) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServingError)
    async def _serving_error(request: Request, exc: ServingError) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return ValidationFailed(validation_message(exc)).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            # No redirect for a trailing slash: its Location would be built from the client's Host header.
            detail = f"no route {request.method} {request.url.path}"
            stripped = request.url.path.rstrip("/")
            if stripped != request.url.path and any(getattr(r, "path", None) == stripped for r in request.app.routes):
                detail += f" (did you mean {stripped}?)"
        elif exc.status_code == 405:
            detail = f"method {request.method} not allowed on {request.url.path}"
        return for_status(exc.status_code, detail, getattr(exc, "headers", None)).response(request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return Internal("internal server error").response(request.url.path)
