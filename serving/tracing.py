"""--otlp-endpoint: one OpenTelemetry trace per request, exported over OTLP/HTTP (protobuf).

Imported only when --otlp-endpoint is set: without it the server imports no OpenTelemetry SDK and builds nothing
per request. With it, the request's phases are stamped as they happen (serving/engine.py, `Timing.trace`, a few
clock reads) and the spans are built after the answer has been sent, from those stamps: a span named after the
request ("POST /embed") with one child per phase ("tokenize", "queue", "inference", "decode"). Spans go to a
BatchSpanProcessor, whose bounded queue drops spans rather than grow, and whose own thread does the exporting:
a slow or unreachable collector costs spans, never a request's time or its answer.
"""

from __future__ import annotations

import logging
import random
import re
import time
from urllib.parse import urlsplit

from bert.tasks import registry

EXTRA = "otlp"
# Probes and scrapes are not traced: an orchestrator's every few seconds would drown the requests.
UNTRACED_PATHS = frozenset({"/health", "/ready", "/metrics"})
TASK_OF_PATH = registry.routes()
# Spans waiting for export beyond this are dropped (the processor's bounded queue); a batch of at most
# EXPORT_BATCH goes out every EXPORT_DELAY_MS, each export given at most EXPORT_TIMEOUT_S.
MAX_QUEUED_SPANS = 8192
EXPORT_BATCH = 512
EXPORT_DELAY_MS = 1000
EXPORT_TIMEOUT_S = 5.0
FLUSH_AT_EXIT_S = 1.0
PERIOD_S = 60.0  # the SDK's warnings of failed exports and dropped spans: one of each per this

# W3C Trace Context: version-trace_id-parent_id-flags.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

log = logging.getLogger("bertserve")


def missing() -> str | None:
    """Why --otlp-endpoint cannot work here (the OpenTelemetry SDK or its OTLP/HTTP exporter is not installed),
    as one line; None when it can."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as e:
        return (
            f"--otlp-endpoint needs the OpenTelemetry SDK and its OTLP/HTTP exporter ({e}): "
            f"pip install 'bertserve[{EXTRA}]'"
        )
    return None


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: a collector's base URL (no path) gets OTLP/HTTP's /v1/traces, as
    OTEL_EXPORTER_OTLP_ENDPOINT does; a URL with a path is used as it is."""
    parts = urlsplit(endpoint)
    return endpoint.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else endpoint


class Tracer:
    """The server's spans, built as finished spans (the SDK's ReadableSpan) from a request's stamps and handed to
    a BatchSpanProcessor to the OTLP/HTTP exporter. No TracerProvider: the global one (FastAPI's native
    telemetry, `opentelemetry-instrument`) is left alone, and a live span per phase (a context, a lock, the
    sampler: docs/serving.md, "Tracing") is not needed for spans whose times are all known at the end."""

    def __init__(self, endpoint: str, service_name: str):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        from serving import engine

        self.url = traces_url(endpoint)
        self._processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=self.url, timeout=EXPORT_TIMEOUT_S),
            max_queue_size=MAX_QUEUED_SPANS,
            max_export_batch_size=EXPORT_BATCH,
            schedule_delay_millis=EXPORT_DELAY_MS,
            export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000),
        )
        _quiet_export_failures()
        self._span, self._context = ReadableSpan, SpanContext
        self._resource = Resource.create({SERVICE_NAME: service_name})  # OTEL_RESOURCE_ATTRIBUTES too
        self._scope = InstrumentationScope("bertserve", engine.version())
        self._server_kind, self._internal_kind = SpanKind.SERVER, SpanKind.INTERNAL
        self._error = Status(StatusCode.ERROR)
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._ids = random.Random()  # seeded from os.urandom once: ids must be unique, not secret
        log.info("tracing: spans go to %s as %s", self.url, service_name)

    def _new_id(self, bits: int) -> int:
        return self._ids.getrandbits(bits) or 1  # 0 is the invalid id

    def record(self, scope, headers: dict[bytes, bytes], request_id: str, status: int, started: float) -> None:
        """The spans of one answered request: `started` is its perf_counter() when it came in, now its end;
        its phases are those its Timing's trace stamped (time.monotonic()). A `traceparent` header (W3C Trace
        Context) makes the request's span a child of the caller's, and a caller that does not sample its trace
        gets none here either."""
        path = scope["path"]
        if path in UNTRACED_PATHS:
            return
        wall_ns, perf, mono = time.time_ns(), time.perf_counter(), time.monotonic()
        parent = None
        given = headers.get(b"traceparent")
        if given is not None:
            caller = _TRACEPARENT.match(given.decode("latin-1").strip().lower())
            if caller is not None and int(caller[2], 16) and int(caller[3], 16):
                if not int(caller[4], 16) & 1:
                    return  # the caller's trace is not sampled
                parent = self._context(int(caller[2], 16), int(caller[3], 16), True, self._sampled)
        trace_id = parent.trace_id if parent is not None else self._new_id(128)
        context = self._context(trace_id, self._new_id(64), False, self._sampled)
        state = scope.get("state", {})
        timing = state.get("timing")
        trace = getattr(timing, "trace", None)
        attributes = {
            "http.request.method": scope["method"],
            "http.route": path[:200],
            "http.response.status_code": status,
            "request_id": request_id,
        }
        task = (trace or {}).get("task") or TASK_OF_PATH.get(path)
        if task:
            attributes["task"] = task
        if trace and trace.get("model"):
            attributes["model"] = trace["model"]
        if timing is not None:
            attributes["input_tokens"] = timing.tokens
            attributes["items"] = timing.items
        first = wall_ns - int((perf - started) * 1e9)
        if trace:
            for name, begun, ended in trace["phases"]:
                # Two clocks read one after the other: a phase's edge may land a microsecond outside its request.
                begun_ns = min(max(wall_ns - int((mono - begun) * 1e9), first), wall_ns)
                ended_ns = min(max(wall_ns - int((mono - ended) * 1e9), begun_ns), wall_ns)
                self._processor.on_end(
                    self._span(
                        name,
                        self._context(trace_id, self._new_id(64), False, self._sampled),
                        context,
                        self._resource,
                        kind=self._internal_kind,
                        start_time=begun_ns,
                        end_time=ended_ns,
                        instrumentation_scope=self._scope,
                    )
                )
        request = self._span(
            f"{scope['method']} {path[:200]}",
            context,
            parent,
            self._resource,
            attributes,
            kind=self._server_kind,
            start_time=first,
            end_time=wall_ns,
            instrumentation_scope=self._scope,
            **({"status": self._error} if status >= 500 else {}),
        )
        self._processor.on_end(request)

    def flush(self, timeout_s: float = FLUSH_AT_EXIT_S) -> None:
        """At shutdown: the spans still queued, given at most `timeout_s` to go out."""
        self._processor.force_flush(timeout_millis=int(timeout_s * 1000))


class _OncePerMinute(logging.Filter):
    """An unreachable collector makes the SDK warn on every retry and every dropped span: one of each per minute."""

    def __init__(self):
        super().__init__()
        self._last: dict[tuple, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = (record.name, record.msg), time.monotonic()
        if now - self._last.get(key, -PERIOD_S) < PERIOD_S:
            return False
        self._last[key] = now
        return True


def _quiet_export_failures() -> None:
    once = _OncePerMinute()
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("opentelemetry."):
            logging.getLogger(name).addFilter(once)
