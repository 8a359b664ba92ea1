"""Starting a server, as a fleet needs it: the port is taken before the model loads (a busy port is one line and
exit 2 at once), /health answers and /ready is 503 while the model loads, a warning when it listens beyond
loopback with no API key, and `--log-format json --access-log`: every line of the log is one JSON object, and
a request's line carries the id a load balancer sent in x-request-id."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time

import httpx
from test_serving_support import PYTHON, REPO, Server, build_checkpoint


def slow_loading_backend(spec, settings):
    from runtime.backends.torch_backend import TorchBackend

    time.sleep(3)  # a model that takes a while to load (a big one, a TensorRT engine build)
    return TorchBackend(spec, settings)


def never_loading_backend(spec, settings):
    time.sleep(600)  # a model whose loading outlasts the test: only a server that never starts it ends soon
    raise AssertionError("the model was loaded")


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "serving", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "PATH": "/usr/bin:/bin"},
    )


def test_a_busy_port_is_one_line_and_exit_2_at_once(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        started = time.perf_counter()
        # the port is taken before the model loads: this one would take ten minutes
        run = _serve("--port", str(port), "--backend", "test_serving_startup:never_loading_backend")
        elapsed = time.perf_counter() - started
    finally:
        taken.close()
    print(f"bar 4: busy port -> exit {run.returncode} after {elapsed:.2f} s: {run.stderr.strip()}")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"], run.stderr
    assert elapsed < 30.0, elapsed  # starting Python and importing the server, not loading the model


def test_health_answers_and_ready_is_503_while_the_model_loads(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server("--model", str(checkpoint), "--backend", "test_serving_startup:slow_loading_backend")
    try:
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                health = httpx.get(server.url + "/health", timeout=2)
                ready = httpx.get(server.url + "/ready", timeout=2)
                classify = httpx.post(server.url + "/classify", json={"inputs": "fine"}, timeout=10)
            except httpx.TransportError:
                assert server.process.poll() is None, server.log()
                time.sleep(0.05)
                continue
            if ready.status_code == 503 and classify.status_code == 200:
                # the load ended between the two requests: /ready must say so now
                ready = httpx.get(server.url + "/ready", timeout=2)
                assert ready.status_code == 200, ready.text
            seen.append((health.status_code, ready.status_code, classify.status_code))
            if ready.status_code == 200:
                break
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            assert ready.status_code == 503 and ready.json()["error_type"] == "unavailable", ready.text
            assert classify.status_code == 503 and classify.json()["error_type"] == "unavailable", classify.text
            time.sleep(0.1)
        loading = [s for s in seen if s[1] == 503]
        print(f"{len(loading)} polls while loading: {set(loading)}; then {seen[-1]}")
        # The load takes 3 s: the port answered through it (a poll is 3 requests and 0.1 s, seconds each on a
        # busy machine, so only a couple are certain).
        assert len(loading) >= 2, seen
        assert seen[-1] == (200, 200, 200), seen
    finally:
        server.stop()


def test_listening_beyond_loopback_without_an_api_key_warns(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    for host, key, warned in (("0.0.0.0", None, True), ("0.0.0.0", "k" * 16, False), ("127.0.0.1", None, False)):
        server = Server("--model", str(checkpoint), "--host", host, *(["--api-key", key] if key else []))
        server.url = f"http://127.0.0.1:{server.port}"
        server.wait_ready()
        server.stop()
        warning = [line for line in server.log().splitlines() if "no API key" in line]
        assert bool(warning) == warned, (host, key, server.log())
        if warned:
            assert "WARNING" in warning[0] and "0.0.0.0" in warning[0]


def test_json_logs_parse_line_by_line_and_carry_the_request_id(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server(
        "--model",
        str(checkpoint),
        "--log-level",
        "info",
        "--log-format",
        "json",
        "--access-log",
        "--drain-delay-s",
        "0.2",
    ).wait_ready()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert (
                c.post(
                    "/classify", json={"inputs": ["a fine film", "a dull one"]}, headers={"x-request-id": "lb-0001"}
                ).status_code
                == 200
            )
            qa = c.post(
                "/qa",
                json={"question": "who went?", "context": "Ann went home early."},
                headers={"x-request-id": "lb-0002"},
            )
            assert qa.status_code == 200 and qa.headers["x-request-id"] == "lb-0002"
            assert c.post("/embed", json={"inputs": "x"}).status_code == 200
            assert c.post("/classify", json={"inputs": 3}, headers={"x-request-id": "lb-0003"}).status_code == 422
            generated = c.get("/ready").headers["x-request-id"]
    finally:
        assert server.stop() == 0
    lines = server.log().splitlines()
    records = [json.loads(line) for line in lines]  # every line, or this fails naming it
    assert all(isinstance(r, dict) and {"time", "level", "message"} <= r.keys() for r in records), lines
    access = {r["request_id"]: r for r in records if r.get("logger") == "bertserve.access"}
    classify, qa_line, bad = access["lb-0001"], access["lb-0002"], access["lb-0003"]
    assert classify["route"] == "/classify" and classify["task"] == "classify" and classify["status"] == 200
    assert classify["items"] == 2 and classify["tokens"] > 4 and classify["method"] == "POST"
    for key in ("queue_ms", "inference_ms", "total_ms"):
        assert isinstance(classify[key], float) and classify[key] >= 0, classify
    assert classify["total_ms"] >= classify["inference_ms"]
    assert qa_line["task"] == "qa" and qa_line["items"] == 1 and qa_line["status"] == 200
    assert bad["status"] == 422 and "items" not in bad
    assert [r for r in access.values() if r.get("task") == "embed" and r["status"] == 200]
    assert access[generated]["route"] == "/ready"  # no id sent: one is made up, answered and logged
    time.strptime(classify["time"][:19], "%Y-%m-%dT%H:%M:%S")
    assert any("drain delay" in r["message"] for r in records)  # the server's own lines are JSON too
    assert any(r.get("logger", "").startswith("uvicorn") for r in records)  # and uvicorn's


def test_the_settings_validate_the_new_flags():
    run = _serve("--log-format", "xml")
    assert run.returncode == 2 and "invalid choice" in run.stderr
    run = _serve("--drain-delay-s", "-1", "--port", "0")
    assert run.returncode == 2 and run.stderr.startswith("error: argument --drain-delay-s: must be at least 0"), (
        run.stderr
    )
    assert "BERTSERVE_DRAIN_DELAY_S" in _serve("--help").stdout


def test_a_client_that_resets_while_the_model_loads_leaves_no_traceback(capfd):
    from serving.startup import LoadingResponder, listen

    sock = listen("127.0.0.1", 0)
    responder = LoadingResponder(sock)
    try:
        for _ in range(20):
            client = socket.create_connection(sock.getsockname()[:2])
            client.sendall(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
            client.close()
        answer = httpx.get(f"http://127.0.0.1:{sock.getsockname()[1]}/health", timeout=5)
        assert answer.status_code == 200, answer.text
    finally:
        responder.stop()
        sock.close()
    assert "Traceback" not in capfd.readouterr().err
