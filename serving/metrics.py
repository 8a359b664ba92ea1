"""Prometheus metrics (names from docs/architecture.md, "Metrics"; base units), in a registry per app."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from bert.tasks import registry
from serving.health import HEALTH_PATH

disable_created_metrics()  # no *_created series: they double every counter for no use here

ENDPOINTS = frozenset((*registry.routes(), HEALTH_PATH, "/ready", "/info", "/metrics"))
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "bertserve_requests_total", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.request_duration = Histogram(
            "bertserve_request_duration_seconds", "request latency", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_duration = Histogram(
            "bertserve_queue_duration_seconds",
            "time a sequence waits in the queue before its batch runs",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "bertserve_inference_duration_seconds", "model time per batch", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram("bertserve_batch_size", "sequences per batch", buckets=_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            "bertserve_batch_tokens", "padded tokens per batch (length x sequences)", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("bertserve_queue_depth", "sequences waiting for a batch", registry=r)
        # Per served model (a queue of its own, serving/engine.py), labelled by its tasks and name: the series above
        # are the server's totals, as before.
        self.model_queue_depth = Gauge(
            "bertserve_model_queue_depth", "sequences waiting for a batch, per model", ["task", "model"], registry=r
        )
        self.model_queue_duration = Histogram(
            "bertserve_model_queue_duration_seconds",
            "time a sequence waits in its model's queue before its batch runs",
            ["task", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.model_inference_duration = Histogram(
            "bertserve_model_inference_duration_seconds",
            "model time per batch, per model",
            ["task", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # (endpoint, status) -> its two series; both labels are bounded (ENDPOINTS and "other"; HTTP statuses)
        self._request_children: dict[tuple[str, int], tuple] = {}
        self.build_info = Gauge(
            "bertserve_build_info",
            "what this server runs (value is always 1)",
            ["model", "backend", "precision"],
            registry=r,
        )

    def for_model(self, *, task: str, model: str) -> SimpleNamespace:
        """One model's own series (queue_depth, queue_duration, inference_duration)."""
        return SimpleNamespace(
            queue_depth=self.model_queue_depth.labels(task, model),
            queue_duration=self.model_queue_duration.labels(task, model),
            inference_duration=self.model_inference_duration.labels(task, model),
        )

    def count_request(self, endpoint: str, status: int, seconds: float) -> None:
        """One answered request: bertserve_requests_total and bertserve_request_duration_seconds."""
        children = self._request_children.get((endpoint, status))
        if children is None:  # labels() takes a lock and builds its key on every call: once per label pair here
            children = self.requests.labels(endpoint, str(status)), self.request_duration.labels(endpoint)
            self._request_children[(endpoint, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    @staticmethod
    def endpoint_label(path: str) -> str:
        return path if path in ENDPOINTS else "other"  # unknown paths must not grow the label set

    def render(self) -> bytes:
        return generate_latest(self.registry)
