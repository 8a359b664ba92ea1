"""What every compat route (serving/routes/compat_*.py) runs: the routes turn another API's body into the
body of one of our task routes, run that route as it runs (its schema, its checks, the task's one inference path,
its answer) and turn the answer into the other API's shape. No model work and no task is named here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError

from bert.tasks import registry
from serving.engine import Timing
from serving.errors import BadRequest, Overloaded, ServingError, ValidationFailed, refusal
from serving.routes.api import RouteInfo, TaskEndpoint, _answer

_ENDPOINTS: dict[str, TaskEndpoint] = {}
_ADAPTERS: dict[str, TypeAdapter] = {}


def endpoint_for(path: str) -> TaskEndpoint:
    """The TaskEndpoint that answers our route `path` (as the router built from the registry answers it)."""
    endpoint = _ENDPOINTS.get(path)
    if endpoint is None:
        task = registry.get(registry.routes()[path])
        route = next(r for r in task.routes if r.path == path)
        endpoint = _ENDPOINTS[path] = TaskEndpoint(task, route)
        _ADAPTERS[path] = TypeAdapter(endpoint.body_type)
    return endpoint


def validate(path: str, body: Any, names: dict | None = None):
    """`body` validated as our route `path` validates it; a refusal names the fields as the caller wrote them
    (`names`: our field -> theirs)."""
    endpoint_for(path)
    try:
        return _ADAPTERS[path].validate_python(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        for error in errors:
            loc = error.get("loc", ())
            if names and loc and loc[0] in names:
                error["loc"] = (names[loc[0]], *loc[1:])
        raise RequestValidationError(
            [{**err, "loc": ("body", *err.get("loc", ()))} for err in errors], body=body
        ) from None


async def read_json(request: Request) -> Any:
    """The request's JSON body, refused as FastAPI refuses one (the same error, the same message)."""
    raw = await request.body()
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", e.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": e.msg},
                }
            ],
            body=e.doc,
        ) from None
    except (UnicodeDecodeError, RecursionError):  # FastAPI's answer to a body json.loads cannot read otherwise
        raise BadRequest("There was an error parsing the body") from None


def served_tasks(request: Request) -> list[str]:
    _ready(request)
    return request.app.state.engine.tasks


def _ready(request: Request) -> None:
    refused = request.app.state.server.unavailable(warming=True, leaving=False)
    if refused is not None:
        raise refused


async def run(
    request: Request,
    path: str,
    body: Any,
    reshape: Callable[[Any, Any], Any] = lambda content, info: content,
    *,
    names: dict | None = None,
) -> Response:
    """Answer `body` (a body of our route `path`) as that route does, then `reshape(content, info)` (info: the
    route's RouteInfo: the model's name, the request's tokens). Admitted and bounded as our routes are."""
    _ready(request)
    state, settings = request.app.state.server, request.app.state.settings
    if state.in_flight >= settings.max_concurrent_requests:
        raise Overloaded(f"overloaded: {settings.max_concurrent_requests} requests in flight; retry later")
    endpoint = endpoint_for(path)
    validated = validate(path, body, names)
    state.in_flight += 1
    try:
        try:
            items, options, unit = endpoint.prepare(validated, request)
        except ServingError as e:
            raise _renamed(e, names) from None
        engine, task, route = request.app.state.engine, endpoint.task, endpoint.route

        async def work(ticket, timing: Timing):
            answers = await engine.infer(unit, task, items, options, ticket=ticket, timing=timing)
            info = RouteInfo(engine, task, timing, unit)
            try:
                return reshape(route.shape(answers, validated, info), info)
            except (ValueError, TypeError) as e:
                raise refusal(e) from None

        return await _answer(request, work)
    finally:
        state.in_flight -= 1


def _renamed(error: ServingError, names: dict | None) -> ServingError:
    """`error` with the field its message starts with named as the caller wrote it."""
    for ours, theirs in (names or {}).items():
        if error.message.startswith(ours) and error.message[len(ours) : len(ours) + 1] in ("", " ", "[", ":", "."):
            error.message = theirs + error.message[len(ours) :]
            error.args = (error.message,)
            break
    return error


def refuse(message: str) -> ValidationFailed:
    return ValidationFailed(message)


def json_object(body, fields: set, api: str) -> dict:
    """A copy of a JSON object body whose fields are all among `fields`, or the refusal naming the first other
    (`api`: whose body it is, as the message says it)."""
    if not isinstance(body, dict):
        raise refuse(f"body: a JSON object is required ({api}: {', '.join(sorted(fields))})")
    for name in body:
        if name not in fields:
            raise refuse(f"{name}: not a field of {api} ({', '.join(sorted(fields))})")
    return dict(body)


__all__ = ["endpoint_for", "json_object", "read_json", "refuse", "run", "served_tasks", "validate"]
