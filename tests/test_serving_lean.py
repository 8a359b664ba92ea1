"""The lean path of the inference routes (serving/routes/lean.py) answers exactly as FastAPI's routes do: the
same status, bytes and headers for answers and for every kind of bad request, while well-formed requests never
reach FastAPI's router. Two apps on one tiny checkpoint: one as served, one with the lean path taken out."""

from __future__ import annotations

import time
import uuid

import pytest
from fastapi.testclient import TestClient
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from test_serving_support import QA_ITEMS, build_checkpoint

from bert.tasks import registry
from serving.app import ServingApp, create_app
from serving.middleware import first_values, new_request_id, set_header
from serving.routes.api import AnswerResponse
from serving.routes.lean import LeanRoutes
from serving.settings import Settings

# Headers that differ between any two requests: ids and timings.
VARYING = {"x-request-id", "x-total-time-ms", "x-queue-time-ms", "x-inference-time-ms"}

WELL_FORMED = [
    ("/classify", {"inputs": "I loved this film."}),
    ("/classify", {"inputs": ["great plot", ["A man is eating.", "Someone eats."]], "top_k": None}),
    ("/classify", {"inputs": "fine", "function_to_apply": "sigmoid", "model": "anything"}),
    ("/ner", {"inputs": ["My name is Wolfgang and I live in Berlin."], "aggregation": "none"}),
    ("/qa", QA_ITEMS[0]),
    ("/qa", [QA_ITEMS[0], {**QA_ITEMS[1], "top_k": 2}]),
    ("/embed", {"inputs": ["What is the capital of France?"], "normalize": False}),
    ("/v1/embeddings", {"input": "What is the capital of France?", "model": "x", "encoding_format": "base64"}),
]
# Bodies refused at every stage: JSON, pydantic, the route's check, the codec.
REFUSED = [
    ("/classify", b'{"inputs": "a", }'),  # not JSON
    ("/classify", b'{"inputs": NaN}'),  # json.loads takes NaN, orjson does not
    ("/classify", b'{"inputs": "\\ud800"}'),  # a lone surrogate
    ("/classify", b'{"inputs": "a", "top_k": 18446744073709551616}'),  # beyond 64 bits
    ("/classify", b'"just a string"'),
    ("/classify", b"null"),
    ("/classify", b""),
    ("/classify", '{"inputs": "utf-16"}'.encode("utf-16")),
    ("/classify", b'{"inputs": "a", "top_k": "2"}'),  # strict: no coercion
    ("/classify", b'{"inputs": "a", "topk": 2}'),  # a misspelt option
    ("/classify", b'{"inputs": []}'),  # empty: 400
    ("/classify", b'{"inputs": ["a", "b", "c", "d", "e"]}'),  # over max_client_batch_size: 413
    ("/classify", b'{"inputs": "   "}'),  # a blank text: the route's check
    ("/classify", b'{"inputs": "a", "model": "nope"}'),  # one named model... served under any name: answered
    ("/classify", b'{"inputs": "word ' * 600 + b'"}'),  # too long for the model: the codec's 422
    ("/qa", b'[{"question": "q", "context": "c"}, {"question": "q", "context": "c", "model": "m"}]'),
    ("/qa", b'{"question": "", "context": "c"}'),
    ("/embed", b'{"inputs": "a", "dimensions": 100000}'),
    ("/ner", b'{"inputs": "a", "aggregation": "best"}'),
    ("/rerank", b'{"query": "q", "texts": ["a"]}'),  # a task this model does not serve: 404
    ("/v1/rerank", b'{"query": "q", "documents": ["a"], "model": "m"}'),
]


class CountingApp:
    """What the lean path hands on to (FastAPI's exception middleware and router), counting the requests."""

    def __init__(self, app):
        self.app, self.requests = app, 0

    async def __call__(self, scope, receive, send):
        self.requests += scope["type"] == "http"
        await self.app(scope, receive, send)


def _lean_of(app) -> LeanRoutes:
    layer = app.middleware_stack
    while not isinstance(layer, LeanRoutes):
        layer = layer.app
    return layer


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "multi")
    settings = Settings(model=str(checkpoint), threads=1, max_client_batch_size=4)
    lean_app, plain_app = create_app(settings), create_app(settings)
    plain_app.user_middleware = [m for m in plain_app.user_middleware if m.cls is not LeanRoutes]
    with TestClient(lean_app) as lean, TestClient(plain_app) as plain:
        for client in (lean, plain):
            deadline = time.monotonic() + 60
            while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
        inner = _lean_of(lean_app)
        inner.app = CountingApp(inner.app)
        yield lean, plain, inner.app


def _same(lean_response, plain_response) -> None:
    assert (lean_response.status_code, lean_response.content) == (plain_response.status_code, plain_response.content)
    ours = {k: v for k, v in lean_response.headers.items() if k not in VARYING}
    theirs = {k: v for k, v in plain_response.headers.items() if k not in VARYING}
    assert ours == theirs


def test_every_task_route_takes_the_lean_path(clients):
    lean, _, _ = clients
    assert set(_lean_of(lean.app).targets) == set(registry.routes())


@pytest.mark.parametrize("path,body", WELL_FORMED, ids=[f"{p}-{i}" for i, (p, _) in enumerate(WELL_FORMED)])
def test_well_formed_requests_are_answered_alike_without_fastapi(clients, path, body):
    lean, plain, fastapi_side = clients
    before = fastapi_side.requests
    answer = lean.post(path, json=body)
    assert answer.status_code == 200, answer.text
    assert fastapi_side.requests == before  # answered by the lean path
    _same(answer, plain.post(path, json=body))


def test_refused_requests_are_answered_alike(clients):
    lean, plain, _ = clients
    for path, raw in REFUSED:
        headers = {"content-type": "application/json"}
        _same(lean.post(path, content=raw, headers=headers), plain.post(path, content=raw, headers=headers))


def test_content_types_are_read_as_fastapi_reads_them(clients):
    lean, plain, fastapi_side = clients
    body = b'{"inputs": "I loved this film."}'
    for content_type in (None, "application/x-www-form-urlencoded", "text/plain", "application/merge-patch+json"):
        headers = {"content-type": content_type} if content_type else {}
        _same(
            lean.post("/classify", content=body, headers=headers),
            plain.post("/classify", content=body, headers=headers),
        )
    before = fastapi_side.requests
    lean.post("/classify", content=body, headers={"content-type": "text/plain"})
    assert fastapi_side.requests == before + 1  # not JSON by its type: FastAPI's to answer


def test_other_methods_and_paths_go_to_fastapi(clients):
    lean, plain, _ = clients
    for method, path in (("GET", "/classify"), ("POST", "/classify/"), ("POST", "/nothing"), ("GET", "/ready")):
        _same(lean.request(method, path), plain.request(method, path))


def test_generated_request_ids_are_uuid4_hex(clients):
    lean, _, _ = clients
    ids = {lean.post("/classify", json={"inputs": "fine"}).headers["x-request-id"] for _ in range(3)}
    ids |= {new_request_id() for _ in range(1000)}
    assert len(ids) == 1003
    for request_id in ids:
        parsed = uuid.UUID(hex=request_id)
        assert (parsed.hex, parsed.version, parsed.variant) == (request_id, 4, uuid.RFC_4122)


RAW_HEADERS = [
    [],
    [(b"host", b"x"), (b"content-type", b"application/json")],
    [(b"x-request-id", b"first"), (b"accept", b"*/*"), (b"x-request-id", b"second"), (b"connection", b"close")],
    [(b"content-length", b"12"), (b"x-total-time-ms", b"1"), (b"x-total-time-ms", b"2"), (b"x-total-time-ms", b"3")],
]
NAMES = ("x-request-id", "content-type", "content-length", "x-total-time-ms", "connection", "authorization")


@pytest.mark.parametrize("raw", RAW_HEADERS)
def test_header_lookups_and_updates_are_starlettes(raw):
    found = first_values(raw)
    for name in NAMES:
        value = Headers(raw=raw).get(name)
        assert found.get(name.encode()) == (None if value is None else value.encode("latin-1"))
        ours, theirs = {"headers": list(raw)}, {"headers": list(raw)}
        set_header(ours["headers"], name.encode(), b"v")
        MutableHeaders(scope=theirs)[name] = "v"
        assert ours["headers"] == theirs["headers"]


def test_answer_headers_are_starlettes():
    for headers in (None, {}, {"x-queue-time-ms": "0.50", "x-inference-time-ms": "1.25", "x-verified-items": "2"}):
        ours = AnswerResponse([{"label": "positive", "score": 0.5}], headers=headers)
        theirs = Response(ours.body, headers=headers, media_type="application/json")
        assert ours.raw_headers == theirs.raw_headers


def test_fastapi_telemetry_is_skipped_only_when_nothing_is_configured():
    from opentelemetry import trace

    unconfigured = ServingApp()
    unconfigured.check_telemetry()
    assert unconfigured._telemetry_off
    configured = ServingApp(telemetry={"tracer_provider": trace.NoOpTracerProvider()})
    configured.check_telemetry()
    assert not configured._telemetry_off
