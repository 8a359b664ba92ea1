"""bertserve HTTP API against a real `python -m serving` process (torch backend, tiny random multi-task
model): batched answers equal single answers under concurrent load, error shapes, overload, schemathesis."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_serving_support import QA_ITEMS, TEXTS, Server, build_checkpoint

REPO = Path(__file__).resolve().parents[1]
FIGURES: dict = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "multi")
    srv = Server(
        "--model",
        str(checkpoint),
        "--max-concurrent-requests",
        "64",
        "--max-wait-ms",
        "10",
        "--max-batch-requests",
        "16",
        "--max-batch-tokens",
        "4096",
        "--max-client-batch-size",
        "16",
        "--qa-max-windows",
        "8",
    )
    with srv:
        yield srv
    print(srv.log()[-3000:])


def assert_close(a, b, tol=1e-4, where="answer"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {a} != {b}"
        for k in a:
            assert_close(a[k], b[k], tol, f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: {a} != {b}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, tol, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, abs_tol=tol), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def metric(text: str, name: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def is_error_body(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return (
        isinstance(body, dict)
        and set(body) == {"error", "error_type"}
        and isinstance(body["error"], str)
        and isinstance(body["error_type"], str)
    )


# --------------------------------------------------------------------------- bar 1
def test_batched_equals_single_under_concurrent_load(server):
    url = server.url
    pairs = [[TEXTS[0], TEXTS[1]], [TEXTS[2], TEXTS[3]]]
    with httpx.Client(base_url=url, timeout=60) as client:
        single = {
            "classify": [client.post("/classify", json={"inputs": t, "top_k": None}).json() for t in TEXTS],
            # a lone pair still goes in a list: {"inputs": [[a, b]]} ({"inputs": [a, b]} is two texts)
            "pairs": [client.post("/classify", json={"inputs": [p]}).json()[0] for p in pairs],
            "ner": [client.post("/ner", json={"inputs": t}).json() for t in TEXTS],
            "ner_none": [client.post("/ner", json={"inputs": t, "aggregation": "none"}).json() for t in TEXTS],
            "qa": [client.post("/qa", json={**item, "top_k": 2}).json() for item in QA_ITEMS],
        }
    metrics_before = httpx.get(url + "/metrics").text

    async def load():
        async with httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=48)
        ) as c:  # under the 64 admitted
            calls = []
            for _ in range(3):  # the list requests and every input alone, interleaved, all at once
                calls.append(("classify", None, c.post("/classify", json={"inputs": TEXTS, "top_k": None})))
                calls.append(("pairs", None, c.post("/classify", json={"inputs": pairs})))
                calls.append(("ner", None, c.post("/ner", json={"inputs": TEXTS})))
                calls.append(("ner_none", None, c.post("/ner", json={"inputs": TEXTS, "aggregation": "none"})))
                calls.append(("qa", None, c.post("/qa", json=[{**item, "top_k": 2} for item in QA_ITEMS])))
                for i, t in enumerate(TEXTS):
                    calls.append(("classify", i, c.post("/classify", json={"inputs": t, "top_k": None})))
                    calls.append(("ner", i, c.post("/ner", json={"inputs": t})))
                for i, item in enumerate(QA_ITEMS):
                    calls.append(("qa", i, c.post("/qa", json={**item, "top_k": 2})))
            responses = await asyncio.gather(*(call for _, _, call in calls))
            return [(kind, index, r) for (kind, index, _), r in zip(calls, responses)]

    started = time.perf_counter()
    results = asyncio.run(load())
    elapsed = time.perf_counter() - started
    for kind, index, response in results:
        assert response.status_code == 200, response.text
        assert "x-request-id" in response.headers and "x-inference-time-ms" in response.headers
        expected = single[kind] if index is None else single[kind][index]
        assert_close(response.json(), expected, where=f"{kind}[{index}]")
    metrics_after = httpx.get(url + "/metrics").text
    batches = metric(metrics_after, "bertserve_batch_size_count") - metric(metrics_before, "bertserve_batch_size_count")
    sequences = metric(metrics_after, "bertserve_batch_size_sum") - metric(metrics_before, "bertserve_batch_size_sum")
    FIGURES["bar1"] = dict(
        requests=len(results),
        seconds=round(elapsed, 2),
        batches=batches,
        sequences=sequences,
        mean_batch=round(sequences / batches, 1),
    )
    print("bar 1:", FIGURES["bar1"])
    assert sequences / batches > 2, "concurrent requests should have shared batches"


def test_response_shapes_and_headers(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/classify", json={"inputs": "great"}, headers={"x-request-id": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123"
        for key in ("x-total-time-ms", "x-queue-time-ms", "x-inference-time-ms"):
            assert float(r.headers[key]) >= 0
        assert isinstance(r.json(), list) and set(r.json()[0]) == {"label", "score"}
        many = client.post("/classify", json={"inputs": ["a", "b"], "top_k": 2}).json()
        assert len(many) == 2 and all(len(x) == 2 for x in many)
        assert isinstance(client.post("/ner", json={"inputs": "Berlin"}).json(), list)
        answer = client.post("/qa", json=QA_ITEMS[2]).json()
        assert set(answer) == {"answer", "score", "start", "end"}
        assert QA_ITEMS[2]["context"][answer["start"] : answer["end"]] == answer["answer"]
        assert isinstance(client.post("/qa", json={**QA_ITEMS[2], "top_k": 3}).json(), list)
        listed = client.post("/qa", json=[QA_ITEMS[2], QA_ITEMS[1]]).json()
        assert len(listed) == 2 and all(isinstance(a, dict) for a in listed)
        info = client.get("/info").json()
        assert info["tasks"] == ["classify", "ner", "qa", "embed"] and info["backend"] == "torch"
        assert info["labels"]["ner"][0] == "O" and info["max_client_batch_size"] == 16
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/docs").status_code == 200
        text = client.get("/metrics").text
        for name in (
            "bertserve_requests_total",
            "bertserve_request_duration_seconds",
            "bertserve_queue_duration_seconds",
            "bertserve_inference_duration_seconds",
            "bertserve_batch_size",
            "bertserve_batch_tokens",
            "bertserve_queue_depth",
            "bertserve_build_info",
        ):
            assert f"# TYPE {name}" in text or f"# TYPE {name.removesuffix('_total')}" in text, name
        assert 'bertserve_build_info{backend="torch",model="multi",precision="fp32"} 1.0' in text


@pytest.mark.parametrize(
    "path,body,status,kind,mention",
    [
        ("/classify", {"inputs": []}, 400, "empty", "empty"),
        ("/classify", {"inputs": ["x"] * 17}, 413, "payload_too_large", "16"),
        ("/classify", {"inputs": "word " * 600}, 422, "validation", "512"),
        ("/ner", {"inputs": ["ok", "word " * 600], "aggregation": "none"}, 422, "validation", "512"),
        ("/classify", {"inputs": 5}, 422, "validation", "inputs"),
        ("/classify", {"inputs": "x", "top_k": 0}, 422, "validation", "top_k"),
        ("/ner", {"inputs": "x", "aggregation": "bogus"}, 422, "validation", "aggregation"),
        ("/qa", {"question": "q"}, 422, "validation", "context"),
        ("/qa", [], 400, "empty", "empty"),
        (
            "/qa",
            {"question": "Where?", "context": "filler text here. " * 3000},
            413,
            "payload_too_large",
            "max_request_sequences",
        ),
        ("/classify", "not json{", 422, "validation", "JSON"),
    ],
)
def test_errors_are_json(server, path, body, status, kind, mention):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    assert is_error_body(r) and r.json()["error_type"] == kind and mention in r.json()["error"], r.text


def test_truncate_and_long_qa_context(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/classify", json={"inputs": "word " * 600, "truncate": True}).status_code == 200
        assert client.post("/ner", json={"inputs": "word " * 600, "truncate": True}).status_code == 200
        windowed = client.post("/ner", json={"inputs": "word " * 600})  # windowed, not refused and not cut
        assert windowed.status_code == 200 and all(e["end"] <= 3000 for e in windowed.json())
        # a context of ~1000 tokens is windowed, not refused and not cut: the answer may come from its end
        context = "filler text here. " * 300 + "The treasure is buried under the old oak tree."
        r = client.post("/qa", json={"question": "Where is the treasure?", "context": context, "top_k": 50})
        assert r.status_code == 200, r.text
        assert all(context[a["start"] : a["end"]] == a["answer"] for a in r.json())


def test_http_errors_are_json(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.get("/nowhere")
        assert r.status_code == 404 and is_error_body(r)
        r = client.get("/classify")
        assert r.status_code == 405 and is_error_body(r)
        r = client.post("/classify", content=b"x" * 3_000_000, headers={"content-type": "application/json"})
        assert r.status_code == 413 and is_error_body(r)


# --------------------------------------------------------------------------- bar 3
def test_300_concurrent_clients_get_200_or_429(server):
    long_text = "the movie was long and the plot went nowhere but the actors tried their best " * 3

    async def burst():
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            return await asyncio.gather(
                *(c.post("/classify", json={"inputs": [long_text] * 16}) for _ in range(300)), return_exceptions=True
            )

    started = time.perf_counter()
    responses = asyncio.run(burst())
    elapsed = time.perf_counter() - started
    errors = [r for r in responses if isinstance(r, Exception)]
    assert not errors, errors[:3]
    statuses = [r.status_code for r in responses]
    counts = {s: statuses.count(s) for s in set(statuses)}
    FIGURES["bar3"] = dict(clients=300, seconds=round(elapsed, 2), **{str(k): v for k, v in counts.items()})
    print("bar 3:", FIGURES["bar3"])
    assert set(statuses) <= {200, 429}
    assert counts.get(200, 0) >= 64
    assert counts.get(429, 0) > 0, "300 heavy requests at once never exceeded 64 in flight?"
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and is_error_body(r)
    assert httpx.get(server.url + "/ready").status_code == 200
    assert httpx.post(server.url + "/classify", json={"inputs": "fine"}).status_code == 200


def test_client_that_disconnects(server):
    # a caller that hangs up while its request is queued is skipped; the server carries on
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/classify", json={"inputs": ["word " * 400] * 16}, timeout=0.001)
    time.sleep(0.2)
    assert httpx.post(server.url + "/classify", json={"inputs": "fine"}, timeout=30).status_code == 200


def test_a_caller_that_hangs_up_is_answered_499(server):
    """The HTTP protocol reports the hang-up to the route (serving/protocol.py): the work stops and the request
    is counted as 499, not answered 200 to nobody."""
    import socket

    def closed_499s() -> float:
        for line in httpx.get(server.url + "/metrics").text.splitlines():
            if line.startswith('bertserve_requests_total{endpoint="/classify",status="499"}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = closed_499s()
    body = json.dumps({"inputs": ["word " * 400] * 16}).encode()
    head = (
        f"POST /classify HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + body)
    deadline = time.monotonic() + 30
    while closed_499s() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed_499s() == before + 1
    # a body over 64 KiB too: uvicorn stops reading while such a body waits for the app, and the hang-up behind
    # it was read only once the response had been written (the work ran for nobody, counted 200)
    big = json.dumps({"inputs": ["word " * 1000] * 16, "truncate": True}).encode()
    assert len(big) > 64 * 1024
    head = f"POST /classify HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(big)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode())
        time.sleep(0.3)  # the route waits for its body (as a client that sends the head first, like httpx, has it)
        sock.sendall(big)
        time.sleep(0.02)
    deadline = time.monotonic() + 30
    while closed_499s() == before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed_499s() == before + 2


# --------------------------------------------------------------------------- bar 2
def test_schemathesis_fuzz(server, tmp_path):
    har = tmp_path / "run.har"
    command = [
        str(Path(sys.executable).with_name("st")),
        "run",
        server.url + "/openapi.json",
        "--checks",
        "not_a_server_error,content_type_conformance,response_schema_conformance",
        "--max-examples",
        "120",
        "--max-time",
        "25",
        "--workers",
        "2",
        "--seed",
        "7",
        "--no-shrink",
        "--generation-database",
        "none",
        "--suppress-health-check",
        "all",
        "--request-timeout",
        "30",
        "--report",
        "har",
        "--report-har-path",
        str(har),
        "--no-color",
    ]
    started = time.perf_counter()
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=150, cwd=tmp_path
    )  # its cache dir lands there
    elapsed = time.perf_counter() - started
    entries = json.loads(har.read_text())["log"]["entries"]
    statuses = [e["response"]["status"] for e in entries]
    bad_bodies = []
    for e in entries:
        if e["response"]["status"] >= 400:
            try:
                body = json.loads(e["response"]["content"].get("text") or "")
                ok = isinstance(body, dict) and set(body) == {"error", "error_type"}
            except ValueError:
                ok = False
            if not ok:
                bad_bodies.append((e["request"]["url"], e["response"]["status"], e["response"]["content"].get("text")))
    by_status = {s: statuses.count(s) for s in sorted(set(statuses))}
    FIGURES["bar2"] = dict(requests=len(entries), seconds=round(elapsed, 1), statuses=by_status)
    print("bar 2:", FIGURES["bar2"])
    print(run.stdout[-4000:])
    assert len(entries) >= 500
    assert not [s for s in statuses if s >= 500]
    assert not bad_bodies, bad_bodies[:5]
    assert run.returncode == 0, run.stdout[-4000:]
    assert httpx.get(server.url + "/ready").status_code == 200
