"""The HTTP routes: validate, hand to the engine, await. No model work happens here.

The inference routes are made here from the task registry (each task's `Route`s, bert/tasks/base.py): one
generic endpoint per route, its body the route's request schema (serving/routes/schemas.py). No task is named.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import Union

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from bert.tasks import registry
from bert.tasks.base import EmptyInput, Route, Task, TooManyInputs
from bert.tasks.embed import prompt
from serving.batcher import Ticket
from serving.engine import Timing, version
from serving.errors import OPENAI_PREFIX, ClientClosed, Unavailable, refusal
from serving.health import ALIVE, HEALTH_PATH
from serving.protocol import ON_DISCONNECT
from serving.routes import schemas
from serving.routes.schemas import ErrorBody, Info, OpenAIErrorBody, Status


class AnswerResponse(Response):
    """An answer as compact JSON, rendered by orjson: what starlette's JSONResponse writes (byte for byte
    but for an exponent's spelling, 1e-7 for 1e-07; every float round-trips exactly), at a fraction of
    json.dumps's cost on the event loop (docs/serving.md, "Why it is built this way"). A number that is
    not finite is refused as starlette refuses it (a 500), never written as null."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        body = orjson.dumps(content)
        if b"null" in body and _has_nan(content):
            raise ValueError("Out of range float values are not JSON compliant")
        return body

    def init_headers(self, headers=None) -> None:
        """starlette's raw headers, in its order (the given ones, then the body's length and type), for the
        headers the routes give: lowercase names that are neither content-length nor content-type."""
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()] if headers else []
        if not (self.status_code < 200 or self.status_code in (204, 304)):
            raw.append((b"content-length", str(len(self.body)).encode()))
        raw.append((b"content-type", b"application/json"))
        self.raw_headers = raw


def _has_nan(content) -> bool:
    if isinstance(content, float):
        return not math.isfinite(content)
    if isinstance(content, dict):
        return any(_has_nan(v) for v in content.values())
    if isinstance(content, (list, tuple)):
        return any(_has_nan(v) for v in content)
    return False


router = APIRouter()
_ERRORS = {
    400: {"model": ErrorBody, "description": "empty inputs"},
    401: {"model": ErrorBody, "description": "missing or wrong API key"},
    404: {"model": ErrorBody, "description": "the server does not serve this task, or no model of that name"},
    408: {"model": ErrorBody, "description": "the body did not arrive within body_timeout_s"},
    413: {"model": ErrorBody, "description": "too many inputs or body too large"},
    422: {"model": ErrorBody, "description": "invalid request (the field is named) or input too long"},
    429: {"model": ErrorBody, "description": "overloaded; see Retry-After"},
    500: {"model": ErrorBody, "description": "inference failed"},
    503: {"model": ErrorBody, "description": "warming up or shutting down"},
}


_OPENAI_ERRORS = {status: {**about, "model": OpenAIErrorBody} for status, about in _ERRORS.items()}


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _answer(request: Request, work) -> Response:
    """Run `work(ticket, timing)`; if the caller hangs up first, drop its queued sequences; if the server
    gives up on admitted work (shutdown past its timeout), answer a JSON 503 instead of being cut off.

    The work runs in the route's own task, which a disconnect or the abort cancels: no other task where the HTTP
    protocol reports the disconnect (serving/protocol.py), else one beside it that waits for the disconnect
    message (instead of three: work, watcher, abort waiter, and an asyncio.wait)."""
    ticket, timing = Ticket(), Timing()
    # For the access log (serving/middleware.py): request.state's own dict, without building a State per request.
    request.scope.setdefault("state", {})["timing"] = timing
    route = asyncio.current_task()
    stopped: list = []  # why the route was stopped (a response to give instead); [None] once the work is done

    def stop(refusal) -> None:
        if not stopped:
            stopped.append(refusal)
            ticket.cancelled = True
            route.cancel()

    on_disconnect = request.scope.get("extensions", {}).get(ON_DISCONNECT)
    if on_disconnect is not None:  # our HTTP protocol says when the client hangs up: no task per request
        forget_disconnect = on_disconnect(lambda: stop(ClientClosed("client closed the request")))
    else:
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        watcher.add_done_callback(lambda task: task.cancelled() or stop(ClientClosed("client closed the request")))
        forget_disconnect = watcher.cancel
    forget_abort = request.app.state.server.on_abort(
        lambda: stop(
            Unavailable(
                "the server is shutting down and this request did not finish in time (shutdown_timeout_s); "
                "retry on another replica"
            )
        )
    )
    try:
        content = await work(ticket, timing)
    except asyncio.CancelledError:
        if not stopped or route.uncancel() > 0:
            raise  # cancelled from outside, not by stop()
        return stopped[0].response(request.url.path)  # a ClientClosed response nobody reads, or the 503
    finally:
        stopped.append(None)  # a stop() from now on does nothing
        forget_disconnect()
        forget_abort()
    return AnswerResponse(
        content,
        headers={
            "x-queue-time-ms": f"{timing.queue_s * 1000:.2f}",
            "x-inference-time-ms": f"{timing.inference_s * 1000:.2f}",
            **({"x-verified-items": str(timing.verified)} if timing.verified else {}),
        },
    )


class RouteInfo:
    """What a task's route may know of the server when it checks a body and shapes its answers
    (bert.tasks.base.Route): the served model's name, the width of its encoder's vectors, and the request's
    input tokens (0 until its sequences have run). `unit`: the model the request runs on, resolved once."""

    def __init__(self, engine, task: Task, timing: Timing, unit):
        self._engine, self._task, self._timing, self._unit = engine, task, timing, unit

    @property
    def model_name(self) -> str:
        return self._engine.answers_as(self._task.name, self._unit)

    @property
    def embedding_dimensions(self) -> int | None:
        return self._unit.dimensions

    @property
    def tokens(self) -> int:
        return self._timing.tokens


def requested_model(body) -> str | None:
    """The body's "model" (ours, or OpenAI's); a list body's items must agree on it."""
    names = {getattr(item, "model", None) for item in (body if isinstance(body, list) else [body])}
    if len(names) > 1:
        raise ValueError(
            f"model: the items of one request name different models ({', '.join(sorted(map(str, names)))})"
        )
    return names.pop() if names else None  # an empty list is refused as empty, further on


def count_items(items: list, limit: int, field: str = "inputs") -> None:
    """Refuse an empty request, or one with more items than a request may carry, before any work."""
    if not items:
        raise EmptyInput(f"{field} is empty")
    if len(items) > limit:
        where = "" if field in ("inputs", "body") else f"{field}: "  # the usual places need no naming
        raise TooManyInputs(f"{where}{len(items)} inputs in one request; the limit is {limit} (max_client_batch_size)")


def schema_class(name_or_class):
    """A route's request or response schema: a class (or type) given as it is, or its name in
    serving/routes/schemas.py."""
    if not isinstance(name_or_class, str):
        return name_or_class
    try:
        return getattr(schemas, name_or_class)
    except AttributeError:
        raise LookupError(f"serving/routes/schemas.py defines no {name_or_class!r}") from None


class TaskEndpoint:
    """One task's route as the server answers it: `prepare` checks a validated body and names the work (raising
    the client's error), `respond` runs the work and shapes the answers. FastAPI's endpoint (`fastapi_endpoint`)
    and the lean path (serving/routes/lean.py) both answer through these two, so they answer alike."""

    def __init__(self, task: Task, route: Route):
        self.task, self.route = task, route
        self.request_schema = schema_class(route.request)
        self.body_type = Union[self.request_schema, list[self.request_schema]] if route.many else self.request_schema

    def prepare(self, body, request: Request) -> tuple[list, dict, object]:
        """(items, options, the model unit it runs on) of a validated body, or the client's error (a ServingError)
        raised. The model is resolved here, once: an unknown name is a 404 before any other check."""
        task, route = self.task, self.route
        engine, settings = request.app.state.engine, request.app.state.settings
        try:
            unit = engine.unit(task.name, requested_model(body))
            items, options = route.to_items(body)
            options.pop("model", None)  # chosen here, not a codec option
            count_items(items, settings.max_client_batch_size, route.batch_field)
            if route.check is not None:
                route.check(body, RouteInfo(engine, task, Timing(), unit))
            name = options.pop("prompt_name", None)  # a route's PROMPT_NAME field: the model's prompt before each text
            if name is not None:
                items = [prompt(unit.spec.path, name) + item for item in items]
        except (ValueError, TypeError) as e:  # a refusal (EmptyInput, TooManyInputs, a field named): the table's
            raise refusal(e) from None
        return items, options, unit

    async def respond(self, body, request: Request, items: list, options: dict, unit) -> Response:
        engine, task, route = request.app.state.engine, self.task, self.route

        async def work(ticket, timing):
            answers = await engine.infer(unit, task, items, options, ticket=ticket, timing=timing)
            return route.shape(answers, body, RouteInfo(engine, task, timing, unit))

        return await _answer(request, work)

    def fastapi_endpoint(self):
        """The endpoint FastAPI validates the body for (pydantic) and documents in OpenAPI."""

        async def endpoint(body, request: Request):
            return await self.respond(body, request, *self.prepare(body, request))

        endpoint.__signature__ = inspect.Signature(
            [
                inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=self.body_type),
                inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
            ]
        )
        endpoint.__name__ = self.route.path.strip("/").rsplit("/", 1)[-1].replace("-", "_")
        endpoint.__doc__ = getattr(self.request_schema, "endpoint_doc", None) or self.route.summary
        endpoint.task_endpoint = self  # what serving/routes/lean.py answers the route with
        return endpoint


def task_routes() -> APIRouter:
    """A POST endpoint for every route of every task in the registry, in the registry's order."""
    routes = APIRouter()
    for task in registry.TASKS.values():
        for route in task.routes:
            endpoint = TaskEndpoint(task, route).fastapi_endpoint()
            routes.add_api_route(
                route.path,
                endpoint,
                methods=["POST"],
                name=endpoint.__name__,
                response_model=schemas.response_model(route.response),
                responses=_OPENAI_ERRORS if route.path.startswith(OPENAI_PREFIX) else _ERRORS,
                tags=["inference"],
                summary=route.summary,
            )
    return routes


@router.get(HEALTH_PATH, response_model=Status, tags=["status"], responses={503: {"model": ErrorBody}})
async def health(request: Request):
    """Liveness: the process is up and its event loop answers (503 only when the model failed to start)."""
    state = request.app.state.server
    if state.failed:
        return state.unavailable().response()
    return ALIVE


@router.get("/ready", response_model=Status, tags=["status"], responses={503: {"model": ErrorBody}})
async def ready(request: Request):
    """Readiness: the model is loaded and warmed up, and the server is not shutting down."""
    refusal = request.app.state.server.unavailable()
    return refusal.response() if refusal is not None else {"status": "ready"}


@router.get("/info", response_model=Info, tags=["status"], responses={401: {"model": ErrorBody}})
async def info(request: Request):
    """The model, its tasks and labels, each task's models (the first is the default) with each one's longest
    input, the backend and the batching limits (`max_input_length`: the longest input every model takes)."""
    engine, settings = request.app.state.engine, request.app.state.settings
    return Info(
        model=engine.model_name,
        tasks=engine.tasks,
        backend=engine.backend_name,
        precision=engine.precision,
        device=settings.device,
        max_batch_requests=min(engine.max_batch_requests(u) for u in engine.units),
        max_batch_tokens=min(engine.max_batch_tokens(u) for u in engine.units),
        max_input_length=engine.max_input_length,
        max_client_batch_size=settings.max_client_batch_size,
        max_concurrent_requests=settings.max_concurrent_requests,
        version=version(),
        labels=engine.labels(),
        embedding=engine.embedding_info(),
        verify=engine.verify_info(),
        models=engine.models_info(),
    )


@router.get(
    "/metrics",
    tags=["status"],
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
async def metrics(request: Request):
    """Prometheus metrics."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def build_router() -> APIRouter:
    """Every route of the server: the tasks' (as the registry holds them now), then the status routes."""
    routes = task_routes()
    routes.include_router(router)
    return routes


__all__ = ["build_router", "router"]
