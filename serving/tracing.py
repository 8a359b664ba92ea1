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
    """The server's tracer: its own TracerProvider (never the global one, which FastAPI's native telemetry
    would then report every request to as well) with a BatchSpanProcessor to the OTLP/HTTP exporter."""

    def __init__(self, endpoint: str, service_name: str):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from serving import engine

        self.url = traces_url(endpoint)
        self._provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=self.url, timeout=EXPORT_TIMEOUT_S),
                max_queue_size=MAX_QUEUED_SPANS,
                max_export_batch_size=EXPORT_BATCH,
                schedule_delay_millis=EXPORT_DELAY_MS,
                export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000),
            )
        )
        self._tracer = self._provider.get_tracer("bertserve", engine.version())
        self._server_kind, self._internal_kind = SpanKind.SERVER, SpanKind.INTERNAL
        self._error = Status(StatusCode.ERROR)
        self._in_context = set_span_in_context
        self._propagator = TraceContextTextMapPropagator()
        log.info("tracing: spans go to %s as %s", self.url, service_name)

    def record(self, scope, headers: dict[bytes, bytes], request_id: str, status: int, started: float) -> None:
        """The spans of one answered request: `started` is its perf_counter() when it came in, now its end;
        its phases are those its Timing's trace stamped (time.monotonic()). A `traceparent` header makes the
        request's span a child of the caller's (W3C Trace Context)."""
        path = scope["path"]
        if path in UNTRACED_PATHS:
            return
        wall_ns, perf, mono = time.time_ns(), time.perf_counter(), time.monotonic()

        def at(stamp: float, now: float) -> int:
            return wall_ns - int((now - stamp) * 1e9)

        parent = headers.get(b"traceparent")
        context = self._propagator.extract({"traceparent": parent.decode("latin-1")}) if parent else None
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
        span = self._tracer.start_span(
            f"{scope['method']} {path[:200]}",
            context=context,
            kind=self._server_kind,
            attributes=attributes,
            start_time=at(started, perf),
        )
        if status >= 500:
            span.set_status(self._error)
        if trace:
            within, first = self._in_context(span), at(started, perf)
            for name, begun, ended in trace["phases"]:
                # Two clocks read one after the other: a phase's edge may land a microsecond outside its request.
                begun_ns = min(max(at(begun, mono), first), wall_ns)
                child = self._tracer.start_span(name, context=within, kind=self._internal_kind, start_time=begun_ns)
                child.end(end_time=min(max(at(ended, mono), begun_ns), wall_ns))
        span.end(end_time=wall_ns)

    def flush(self, timeout_s: float = FLUSH_AT_EXIT_S) -> None:
        """At shutdown: the spans still queued, given at most `timeout_s` to go out."""
        self._provider.force_flush(timeout_millis=int(timeout_s * 1000))
