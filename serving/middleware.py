"""Everything every request goes through, as one plain ASGI middleware (no BaseHTTPMiddleware, so
the route can still hear the client disconnect): request id, auth, body size, admission (429 at
once beyond max_concurrent_requests), refusal while warming up or draining, timing headers, metrics."""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import re
import time
from collections.abc import Callable

from starlette.exceptions import HTTPException

from bert.tasks import registry
from serving.docs import DOCS_PATHS
from serving.errors import Overloaded, PayloadTooLarge, Unauthorized, Unavailable, for_status
from serving.health import HEALTH_PATH
from serving.logs import log_access
from serving.logs import request_id as current_request_id
from serving.protocol import BODY_RECEIVED
from serving.routes.playground import PLAYGROUND_PATH

INFERENCE_PATHS = frozenset(registry.routes())
TASK_OF_PATH = registry.routes()
OPEN_PATHS = frozenset({HEALTH_PATH, "/ready", "/metrics", PLAYGROUND_PATH}) | DOCS_PATHS
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
log = logging.getLogger("bertserve")
_IDS = random.Random()  # seeded from os.urandom once: a request id must be unique, not secret


def new_request_id() -> str:
    """A random uuid4 written as uuid.uuid4().hex writes it (32 hex digits, its version and variant bits set),
    without uuid4's os.urandom call on every request."""
    bits = _IDS.getrandbits(128) & ~(0xF000 << 64) & ~(0xC000 << 48) | (0x4000 << 64) | (0x8000 << 48)
    return f"{bits:032x}"


class ServerState:
    """Shared between the middleware, the routes and the shutdown logic."""

    def __init__(self) -> None:
        self.ready = False
        self.failed: str | None = None
        # SIGTERM's first phase (--drain-delay-s): /ready answers 503 so load balancers take this replica out,
        # while every request that still arrives is served.
        self.leaving = False
        self.draining = False  # the second phase: admission closed, admitted requests finishing
        self.in_flight = 0  # admitted inference requests not yet answered
        # Set by abort() when the server gives up on admitted work (shutdown past its timeout, or a second
        # signal): every waiting route answers a JSON 503 at once instead of being cut off by the ASGI server.
        self.aborted = False
        self._on_abort: set[Callable[[], None]] = set()  # the waiting routes' ways to stop
        # Called with the reason when the model cannot serve at all (warm-up failed): the process then exits.
        self.on_fatal: Callable[[str], None] | None = None

    def abort(self) -> None:
        """Give up on admitted work: every route waiting now, or from now on, answers its 503 at once."""
        self.aborted = True
        for stop in list(self._on_abort):
            stop()

    def on_abort(self, stop: Callable[[], None]) -> Callable[[], None]:
        """Call `stop` on abort() (at once if the server has aborted already); returns its unregistering."""
        if self.aborted:
            stop()
        self._on_abort.add(stop)
        return lambda: self._on_abort.discard(stop)

    def fail(self, reason: str) -> None:
        self.failed = reason
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def unavailable(self, *, warming: bool = True, leaving: bool = True) -> Unavailable | None:
        """Why the model cannot answer now (None: it can): failed, shutting down, (if `leaving`) in the drain
        delay, or (if `warming`) warming up. All of them for /ready; requests are still served while leaving."""
        if self.failed:
            return Unavailable(f"the model failed to start: {self.failed}", retry_after_s=0)
        if self.draining or (leaving and self.leaving):
            return Unavailable("the server is shutting down")
        if warming and not self.ready:
            return Unavailable("the model is warming up")
        return None


class _BodyTooLarge(HTTPException):
    """Raised from receive() while the route reads the body; FastAPI re-raises HTTPExceptions as they are,
    and the HTTPException handler turns it into the JSON 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class _BodyTooSlow(HTTPException):
    """Raised from receive() when the body has not fully arrived in time (a slow-send client holding a slot)."""

    def __init__(self, limit_s: float):
        super().__init__(408, f"the request body did not arrive within {limit_s:g} s (body_timeout_s)")


class RequestMiddleware:
    def __init__(self, app, *, settings, state: ServerState, metrics, tracer=None):
        self.app = app
        self.tracer = tracer  # serving/tracing.py's, with --otlp-endpoint
        self.settings = settings
        self.state = state
        self.metrics = metrics
        self._api_key = settings.api_key.encode() if settings.api_key else None
        self._access_log = settings.access_log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = first_values(scope["headers"])
        given_id = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given_id if _REQUEST_ID.match(given_id) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        id_token = current_request_id.set(request_id)
        path = scope["path"]
        endpoint = self.metrics.endpoint_label(path)
        status = [500]
        response_started = [False]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                response_started[0] = True
                # A copy, as starlette's MutableHeaders(scope=message) makes: a response sent twice keeps its own.
                out = message["headers"] = list(message["headers"])
                set_header(out, b"x-request-id", request_id.encode("latin-1"))
                set_header(out, b"x-total-time-ms", f"{(time.perf_counter() - started) * 1000:.2f}".encode())
                if self.state.leaving or self.state.draining:
                    # No kept-alive connection outlives the drain delay: a balancer's next request opens a new
                    # one, to a replica that is staying.
                    set_header(out, b"connection", b"close")
            await send(message)

        admitted = False
        try:
            refusal = self._refuse(scope, headers, path)
            if refusal is not None:
                await refusal(scope, receive, send_with_headers)
                return
            if path in INFERENCE_PATHS and scope["method"] == "POST":
                _default_to_json(scope, headers)
                if self.state.in_flight >= self.settings.max_concurrent_requests:
                    await Overloaded(
                        f"overloaded: {self.settings.max_concurrent_requests} requests in flight; retry later"
                    ).response(path)(scope, receive, send_with_headers)
                    return
                admitted = True
                self.state.in_flight += 1
            try:
                await self.app(scope, self._limited(scope, receive), send_with_headers)
            except (_BodyTooLarge, _BodyTooSlow) as e:
                if not response_started[0]:
                    await for_status(e.status_code, e.detail).response(path)(scope, receive, send_with_headers)
        finally:
            if admitted:
                self.state.in_flight -= 1
            total_s = time.perf_counter() - started
            self.metrics.count_request(endpoint, status[0], total_s)
            if self._access_log:
                self._log_access(scope, request_id, status[0], total_s)
            if self.tracer is not None:
                self._trace(scope, headers, request_id, status[0], started)
            current_request_id.reset(id_token)

    def _trace(self, scope, headers: dict[bytes, bytes], request_id: str, status: int, started: float) -> None:
        try:
            self.tracer.record(scope, headers, request_id, status, started)
        except Exception:  # noqa: BLE001 - a request is never failed by its trace
            log.exception("tracing: the spans of request %s were dropped", request_id)

    @staticmethod
    def _log_access(scope, request_id: str, status: int, total_s: float) -> None:
        timing = scope.get("state", {}).get("timing")  # set by the inference routes
        client = scope.get("client")
        log_access(
            request_id,
            {
                "method": scope["method"],
                "route": scope["path"][:200],
                "status": status,
                "task": TASK_OF_PATH.get(scope["path"]),
                "items": getattr(timing, "items", None),
                "tokens": getattr(timing, "tokens", None),
                "queue_ms": round(timing.queue_s * 1000, 2) if timing is not None else None,
                "inference_ms": round(timing.inference_s * 1000, 2) if timing is not None else None,
                "total_ms": round(total_s * 1000, 2),
                "client": f"{client[0]}:{client[1]}" if client else None,
            },
        )

    def _refuse(self, scope, headers: dict[bytes, bytes], path: str):
        if self._api_key is not None and path not in OPEN_PATHS:
            given = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._api_key):
                return Unauthorized().response(path)
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.settings.max_body_bytes:
            return PayloadTooLarge(f"request body larger than {self.settings.max_body_bytes} bytes").response(path)
        if path in INFERENCE_PATHS or path == "/info":
            refusal = self.state.unavailable(warming=path != "/info", leaving=False)
            if refusal is not None:
                return refusal.response(path)
        return None

    def _limited(self, scope, receive):
        """receive() bounded while the body arrives: in size (413) and in time (408). Once the body is in,
        receive() waits unbounded again (the route listens for the client's disconnect with it)."""
        limit, timeout_s = self.settings.max_body_bytes, self.settings.body_timeout_s
        seen, deadline, body_done = 0, asyncio.get_running_loop().time() + timeout_s, False
        body_received = scope.get("extensions", {}).get(BODY_RECEIVED)  # our HTTP protocol's (serving/protocol.py)

        async def limited_receive():
            nonlocal seen, body_done
            if body_done or (body_received is not None and body_received()):
                message = await receive()  # nothing left to wait for: no timeout to arm
            else:
                try:
                    # A timeout on the calling task, not wait_for's extra task per message.
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
                except TimeoutError:
                    raise _BodyTooSlow(timeout_s) from None
            if body_done:
                return message
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge(limit)
                body_done = not message.get("more_body", False)
            return message

        return limited_receive


def first_values(raw) -> dict[bytes, bytes]:
    """A request's headers by name, each name's first value: what starlette's Headers.get finds (names as the
    ASGI server gives them: lowercased by uvicorn), from one pass in C instead of a scan per lookup."""
    return dict(reversed(raw if isinstance(raw, list) else list(raw)))


def set_header(raw: list, name: bytes, value: bytes) -> None:
    """starlette's MutableHeaders.__setitem__ on a raw header list, for a lowercase `name`: the first entry of
    that name takes `value`, any later ones go; none, and it is appended."""
    found = [i for i, (key, _) in enumerate(raw) if key == name]
    if not found:
        raw.append((name, value))
        return
    for i in reversed(found[1:]):
        del raw[i]
    raw[found[0]] = (name, value)


def _default_to_json(scope, headers: dict[bytes, bytes]) -> None:
    """The inference routes take JSON only: a body sent without a content type, or with curl -d's
    form default, is read as JSON rather than refused."""
    content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if content_type in ("", "application/x-www-form-urlencoded"):
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"] + [
            (b"content-type", b"application/json")
        ]


async def wait_for_idle(state: ServerState, timeout_s: float) -> bool:
    """After draining starts: wait until every admitted request has been answered (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while state.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return state.in_flight == 0
