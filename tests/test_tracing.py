"""--otlp-endpoint: a real `python -m serving` exports its requests' spans over OTLP/HTTP to a real receiver on
loopback (http.server, decoding each body as the OTLP protobuf); an unreachable collector costs requests nothing;
without the option the server imports no OpenTelemetry SDK."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from test_serving_support import PYTHON, REPO, Server, free_port

pytest.importorskip("opentelemetry.sdk.trace", reason="needs the otlp extra")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="needs the otlp extra")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span  # noqa: E402

PHASES = ("tokenize", "queue", "inference", "decode")
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def _value(any_value):
    return getattr(any_value, any_value.WhichOneof("value"))


class Receiver:
    """An OTLP/HTTP collector on 127.0.0.1: POST /v1/traces, protobuf bodies; keeps every span with its
    resource's attributes."""

    def __init__(self):
        self.spans: list[dict] = []
        self.paths: list[str] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                received.paths.append(self.path)
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            received.spans.append(
                                {
                                    "name": span.name,
                                    "kind": span.kind,
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(),
                                    "start": span.start_time_unix_nano,
                                    "end": span.end_time_unix_nano,
                                    "status": span.status.code,
                                    "attributes": {a.key: _value(a.value) for a in span.attributes},
                                    "resource": resource,
                                }
                            )
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def wait_for(self, done, timeout: float = 15.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.spans):
                return self.spans
            time.sleep(0.1)
        raise AssertionError(f"spans not received in {timeout}s: {[s['name'] for s in self.spans]}")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def traced():
    receiver = Receiver()
    # The endpoint as a flag, the service name from its env var: both ways of setting them are read.
    server = Server("--otlp-endpoint", receiver.url, env={"BERTSERVE_OTLP_SERVICE_NAME": "bertserve-under-test"})
    with server:
        yield server, receiver
    receiver.close()


def _request_span(spans, request_id):
    found = [s for s in spans if s["attributes"].get("request_id") == request_id]
    assert len(found) == 1, [s["name"] for s in found]
    return found[0]


def test_each_request_is_a_span_with_its_phases_nested_inside(traced):
    server, receiver = traced
    answers = [
        httpx.post(server.url + "/classify", json={"inputs": ["I loved this film."]}, headers={"x-request-id": "rq-1"}),
        httpx.post(server.url + "/embed", json={"inputs": ["a", "b c"]}, headers={"x-request-id": "rq-2"}),
        httpx.post(server.url + "/classify", json={"inputs": 3}, headers={"x-request-id": "rq-bad"}),
        httpx.get(server.url + "/health", headers={"x-request-id": "rq-health"}),
    ]
    assert [a.status_code for a in answers] == [200, 200, 422, 200]
    spans = receiver.wait_for(
        lambda spans: {"rq-1", "rq-2", "rq-bad"} <= {s["attributes"].get("request_id") for s in spans}
    )
    assert set(receiver.paths) == {"/v1/traces"}  # a collector's base URL gets OTLP/HTTP's traces path

    for request_id, route, task, count in (("rq-1", "/classify", "classify", 1), ("rq-2", "/embed", "embed", 2)):
        request = _request_span(spans, request_id)
        assert request["name"] == f"POST {route}"
        assert request["kind"] == Span.SPAN_KIND_SERVER
        assert request["parent"] == ""
        assert request["resource"]["service.name"] == "bertserve-under-test"
        attributes = request["attributes"]
        assert attributes["http.response.status_code"] == 200
        assert attributes["http.request.method"] == "POST" and attributes["http.route"] == route
        assert attributes["task"] == task and attributes["model"] == "demo_model"
        assert attributes["input_tokens"] >= 3 * count and attributes["items"] == count
        children = {s["name"]: s for s in spans if s["parent"] == request["span_id"]}
        assert sorted(children) == sorted(PHASES), request_id
        for child in children.values():
            assert child["trace_id"] == request["trace_id"]
            assert child["kind"] == Span.SPAN_KIND_INTERNAL
            assert request["start"] <= child["start"] <= child["end"] <= request["end"], child["name"]
        # In the order they happen: tokenize, then queue and inference, then decode.
        assert children["tokenize"]["end"] <= children["queue"]["start"]
        assert children["queue"]["end"] <= children["inference"]["end"] <= children["decode"]["start"]

    refused = _request_span(spans, "rq-bad")
    assert refused["name"] == "POST /classify" and refused["attributes"]["http.response.status_code"] == 422
    assert not [s for s in spans if s["parent"] == refused["span_id"]]  # refused before any phase ran
    assert not [s for s in spans if s["attributes"].get("request_id") == "rq-health"]  # probes are not traced


def test_a_callers_traceparent_is_the_request_spans_parent(traced):
    server, receiver = traced
    answer = httpx.post(
        server.url + "/classify",
        json={"inputs": ["ok"]},
        headers={"x-request-id": "rq-child", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
    )
    assert answer.status_code == 200
    unsampled = httpx.post(
        server.url + "/classify",
        json={"inputs": ["ok"]},
        headers={"x-request-id": "rq-unsampled", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"},
    )
    assert unsampled.status_code == 200
    after = httpx.post(server.url + "/classify", json={"inputs": ["ok"]}, headers={"x-request-id": "rq-after"})
    assert after.status_code == 200
    wanted = {"rq-child", "rq-after"}
    spans = receiver.wait_for(lambda spans: wanted <= {s["attributes"].get("request_id") for s in spans})
    request = _request_span(spans, "rq-child")
    assert (request["trace_id"], request["parent"]) == (CALLER_TRACE, CALLER_SPAN)
    children = [s for s in spans if s["parent"] == request["span_id"]]
    assert sorted(s["name"] for s in children) == sorted(PHASES)
    assert {s["trace_id"] for s in children} == {CALLER_TRACE}
    # A caller that does not sample its trace (flags 00) gets no spans here either.
    assert not [s for s in spans if s["attributes"].get("request_id") == "rq-unsampled"]


def test_an_unreachable_collector_never_slows_or_fails_a_request():
    closed = free_port()  # nothing listens there
    with Server("--otlp-endpoint", f"http://127.0.0.1:{closed}") as server:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for i in range(40):
                started = time.monotonic()
                answer = client.post("/classify", json={"inputs": [f"request number {i}"]})
                assert answer.status_code == 200, answer.text
                assert time.monotonic() - started < 2.0  # the exporter's retries happen in its own thread
                time.sleep(0.03 if i < 35 else 0.5)  # across several of the exporter's attempts
            assert client.get("/ready").status_code == 200
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 10  # the spans still queued get a bounded flush, not the retries
    log = server.log()
    assert "Traceback" not in log
    # The exporter tried and failed, and said so: once, not on every retry.
    failures = [line for line in log.splitlines() if "opentelemetry" in line]
    assert 1 <= len(failures) <= 4, failures


def test_without_the_sdk_the_option_is_one_line_naming_the_extra(tmp_path):
    # A package earlier on the path that fails to import, as a missing one does.
    shadow = tmp_path / "opentelemetry" / "sdk"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named opentelemetry.sdk')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [PYTHON, "-m", "serving", "--port", "0", "--otlp-endpoint", "http://127.0.0.1:4318"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --otlp-endpoint"), lines
    assert "pip install 'bertserve[otlp]'" in lines[0]


def test_an_endpoint_that_is_not_a_url_is_refused_at_startup():
    done = subprocess.run(
        [PYTHON, "-m", "serving", "--port", "0", "--otlp-endpoint", "localhost:4318"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--otlp-endpoint" in lines[0] and "http://" in lines[0], lines


def test_without_the_option_no_sdk_is_imported_and_no_tracer_is_built():
    script = (
        "import sys\n"
        "from serving.app import create_app\n"
        "from serving.settings import Settings\n"
        "app = create_app(Settings())\n"
        "assert not [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))]\n"
        "(middleware,) = [m for m in app.user_middleware if m.cls.__name__ == 'RequestMiddleware']\n"
        "assert middleware.kwargs['tracer'] is None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()
