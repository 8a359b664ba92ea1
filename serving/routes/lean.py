"""The lean path of the inference routes: a well-formed POST to a task's route is answered without FastAPI's
per-request machinery (its router, dependency solving, body reading and content-type parsing), which cost more
of the event loop than the route's own work (docs/serving.md, "Why it is built this way").

It answers only what it answers exactly as FastAPI would: the body is parsed with orjson and validated by the
route's own FastAPI body field (the same pydantic type, strict as the schemas say), and the route's
`TaskEndpoint` answers it, as it answers FastAPI's endpoint. A body that is not plain JSON in UTF-8, or that fails
validation, goes to FastAPI with its bytes replayed, so every such error (its message, its status) is FastAPI's;
a refusal after validation is the same ServingError either way. The routes stay FastAPI's routes: OpenAPI, /docs
and every other method and path are untouched. It sits inside RequestMiddleware (request id, auth, admission,
metrics, the access log) and answers an exception the way FastAPI's ExceptionMiddleware would, through the
app's exception handlers.
"""

from __future__ import annotations

import inspect

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request

_JSON = b"application/json"


class LeanRoutes:
    """ASGI middleware: POST `path` for each task route in `routes` (APIRoutes whose endpoint carries its
    TaskEndpoint) is answered here; everything else goes to `app`."""

    def __init__(self, app, *, routes: list):
        self.app = app
        self.targets = {
            route.path: (route.body_field, route.endpoint.task_endpoint)
            for route in routes
            if isinstance(route, APIRoute) and hasattr(route.endpoint, "task_endpoint") and route.body_field
        }

    async def __call__(self, scope, receive, send):
        target = self.targets.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if target is None:
            await self.app(scope, receive, send)
            return
        messages = await _read_body(receive)
        body = _parse(scope, messages)
        if body is not None:
            field, endpoint = target
            body, errors = field.validate(body, {}, loc=("body",))
            if not errors:
                await self._answer(endpoint, body, scope, receive, send)
                return
        await self.app(scope, _replay(messages, receive), send)  # FastAPI answers it, error and all

    async def _answer(self, endpoint, body, scope, receive, send) -> None:
        request = Request(scope, receive)
        try:
            response = await endpoint.respond(body, request, *endpoint.prepare(body, request))
        except Exception as e:  # noqa: BLE001 - handled as ExceptionMiddleware handles it, or raised as there
            handler = _handler_for(scope["app"].exception_handlers, e)
            if handler is None:
                raise
            response = handler(request, e)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)


async def _read_body(receive) -> list:
    """The request's messages up to its body's last one (or a disconnect)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _parse(scope, messages: list):
    """The JSON body as FastAPI would read it, or None where this path leaves the request to FastAPI: a
    disconnect, an empty body, a content type other than application/json, or anything orjson does not
    parse (JSON in another encoding, NaN, integers beyond 64 bits, lone surrogates: json.loads may take them)."""
    if messages[-1]["type"] != "http.request":
        return None
    content_type = b""
    for name, value in scope["headers"]:  # the first, by its name as the server gives it, as FastAPI reads it
        if name == b"content-type":
            content_type = value
            break
    if content_type.split(b";", 1)[0].strip().lower() != _JSON:
        return None
    raw = b"".join(m.get("body", b"") for m in messages)
    if not raw:
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, (dict, list)) else None  # a scalar body is FastAPI's to refuse


def _replay(messages: list, receive):
    """receive() that gives `messages` again, then the connection's own."""
    pending = list(messages)

    async def replay():
        return pending.pop(0) if pending else await receive()

    return replay


def _handler_for(handlers: dict, error: Exception):
    """The app's handler for `error`'s type, as ExceptionMiddleware looks it up (the catch-all Exception and 500
    handlers belong to ServerErrorMiddleware, further out, and are left to it)."""
    for cls in type(error).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
