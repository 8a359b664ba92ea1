"""Hostile requests against a real server (issue 11, bar 1): whatever a client sends, the answer is never a
5xx, every 4xx is JSON {"error", "error_type"}, and the server stays ready after each.

One `python -m serving` process (a tiny multi-task checkpoint, an API key, small limits so that the limits
are cheap to reach) answers every case; raw-socket cases speak broken HTTP where httpx would not.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from test_serving_support import QA_ITEMS, Server, build_checkpoint

KEY = "s3cret-key"
AUTH = {"authorization": f"Bearer {KEY}"}
LIMITS = {"max_client_batch_size": 4, "max_body_bytes": 200_000, "max_request_sequences": 8}
LONG_TEXT = "word " * 600  # more tokens than the model's 512
HUGE_TEXT = "many words here " * 11_000  # 176 k chars: tokenised only as far as the limit
CONTEXT = QA_ITEMS[0]["context"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("hostile") / "multi")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()]
    srv = Server(
        "--model", str(checkpoint), "--api-key", KEY, "--header-timeout-s", "1", "--body-timeout-s", "1", *flags
    ).wait_ready()
    yield srv
    srv.stop()


# ---- JSON bodies: (route, body) --------------------------------------------------------------------------
def _body_cases():
    cases = []
    bad_json = [
        "{",
        "[",
        "",
        "nul",
        "{}}",
        '{"inputs": NaN}',
        '{"inputs": 1e999}',
        "'single quotes'",
        '{"inputs": "unterminated}',
        '{"inputs": "x",}',
        "\x00",
        '{"inputs": "\\ud800"}',
        "[" * 5000 + "]" * 5000,
        '{"a":' * 3000 + "1" + "}" * 3000,
    ]
    not_objects = ["null", "true", "123", '"a string"', "[]", "{}", "[1, 2]"]
    for route in ("/classify", "/ner", "/qa", "/embed", "/v1/embeddings"):
        cases += [(route, raw, "raw") for raw in bad_json + not_objects]
    classify_inputs = [
        1,
        2.5,
        True,
        None,
        {"text": "x"},
        [1, 2],
        [None],
        [["a", "b", "c"]],
        [["a"]],
        [[["a"]]],
        "",
        "   ",
        "\n\t",
        ["ok", ""],
        [["a", ""]],
        [],
        ["x"] * 5,
        LONG_TEXT,
        HUGE_TEXT,
        [LONG_TEXT],
        [["a", LONG_TEXT]],
        "x" * 250_000,
    ]
    cases += [("/classify", {"inputs": value}, "json") for value in classify_inputs]
    classify_options = [
        {"top_k": 0},
        {"top_k": -1},
        {"top_k": "2"},
        {"top_k": 2.5},
        {"top_k": True},
        {"top_k": 1e9},
        {"function_to_apply": "bogus"},
        {"function_to_apply": 1},
        {"truncate": "yes"},
        {"truncate": 1},
        {"truncate": None},
        {"unknown": 1},
        {"Inputs": "x"},
        {"top_k": [1]},
        {"function_to_apply": "SOFTMAX"},
    ]
    cases += [("/classify", {"inputs": "fine", **option}, "json") for option in classify_options]
    cases += [("/classify", {"top_k": 1}, "json")]  # no inputs at all
    ner_bodies = [
        {"inputs": 7},
        {"inputs": [1]},
        {"inputs": [["a", "b"]]},
        {"inputs": ""},
        {"inputs": [" "]},
        {"inputs": []},
        {"inputs": ["x"] * 5},
        {"inputs": LONG_TEXT, "aggregation": "none"},  # windowed otherwise
        {"inputs": HUGE_TEXT},
        {"inputs": "x", "aggregation": "FIRST"},
        {"inputs": "x", "aggregation": None},
        {"inputs": "x", "aggregation": 1},
        {"inputs": "x", "aggregation": "bogus"},
        {"inputs": "x", "truncate": "true"},
        {"inputs": "x", "extra": True},
        {"aggregation": "first"},
        {"inputs": {"text": "x"}},
        {"inputs": LONG_TEXT, "stride": -1},
        {"inputs": LONG_TEXT, "stride": "8"},
        {"inputs": LONG_TEXT, "stride": 10**12},
        {"inputs": LONG_TEXT, "stride": 8, "truncate": True},
        {"inputs": [LONG_TEXT * 3] * 2},  # 10 windows of 512 tokens; at most 8 (max_request_sequences)
    ]
    cases += [("/ner", body, "json") for body in ner_bodies]
    ok = {"question": "Where?", "context": "In Berlin."}
    qa_bodies = [
        {"context": "x"},
        {"question": "x"},
        {**ok, "question": ""},
        {**ok, "question": "  "},
        {**ok, "context": ""},
        {**ok, "context": "\n"},
        {**ok, "question": 1},
        {**ok, "context": ["a"]},
        {**ok, "top_k": 0},
        {**ok, "top_k": 101},
        {**ok, "top_k": "1"},
        {**ok, "max_answer_len": 0},
        {**ok, "max_answer_len": 513},
        {**ok, "max_answer_len": 1.5},
        {**ok, "doc_stride": -1},
        {**ok, "doc_stride": 159},
        {**ok, "doc_stride": 10**12},
        {**ok, "doc_stride": "1"},
        {**ok, "doc_stride": False},
        {**ok, "truncate": "yes"},
        {**ok, "extra": 1},
        {**ok, "question": "why " * 80},
        {"question": "why " * 80_000, "context": "x"},
        {"question": "Where?", "context": CONTEXT * 20},
        {"question": "Where?", "context": HUGE_TEXT},
        {"question": "Where?", "context": HUGE_TEXT, "doc_stride": 158},
    ]
    cases += [("/qa", body, "json") for body in qa_bodies]
    embed_bodies = [
        {"inputs": 3},
        {"inputs": [["a", "b"]]},
        {"inputs": ""},
        {"inputs": ["x", " "]},
        {"inputs": []},
        {"inputs": ["x"] * 5},
        {"inputs": LONG_TEXT},
        {"inputs": HUGE_TEXT},
        {"inputs": [HUGE_TEXT]},
        {"inputs": "x", "normalize": "yes"},
        {"inputs": "x", "normalize": None},
        {"inputs": "x", "truncate": 1},
        {"inputs": "x", "pooling": "max"},
        {"normalize": True},
        {"inputs": LONG_TEXT, "chunking": "max"},
        {"inputs": LONG_TEXT, "chunking": "mean", "truncate": True},
        {"inputs": HUGE_TEXT, "chunking": "mean"},
        {"inputs": "x", "dimensions": 33},
        {"inputs": "x", "dimensions": 0},
        {"inputs": "x", "dimensions": "8"},
    ]
    cases += [("/embed", body, "json") for body in embed_bodies]
    openai_bodies = [
        {"input": [1, 2, 3]},
        {"input": [[1, 2]]},
        {"input": ""},
        {"input": []},
        {"input": ["x"] * 5},
        {"input": "x", "encoding_format": "hex"},
        {"input": "x", "dimensions": 33},  # wider than the model's 32
        {"input": "x", "dimensions": 0},
        {"input": "x", "model": 5},
        {"input": "x", "user": 1},
        {"input": "x", "extra_field": 1},
        {"model": "m"},
        {"input": HUGE_TEXT},
        {"input": None},
    ]
    cases += [("/v1/embeddings", body, "json") for body in openai_bodies]
    qa_lists = [
        [],
        [ok] * 5,
        [ok, {"question": "x"}],
        [ok, 1],
        [[ok]],
        [ok, None],
        [{"question": "Where?", "context": CONTEXT * 4}] * 4,
    ]
    cases += [("/qa", body, "json") for body in qa_lists]
    return cases


BODY_CASES = _body_cases()


@pytest.mark.parametrize("route,body,kind", BODY_CASES, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(BODY_CASES)])
def test_hostile_body(server, route, body, kind):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        if kind == "raw":
            response = client.post(
                route,
                content=body.encode("utf-8", "surrogatepass"),
                headers={**AUTH, "content-type": "application/json"},
            )
        else:
            response = client.post(route, json=body, headers=AUTH)
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
        _check(response, client)


def test_a_lone_surrogate_is_refused_naming_the_field(server):
    """JSON can escape half a surrogate pair ("\\ud83d"): not text a tokenizer reads. The refusal names the field
    and what is wrong with it, not the tokenizer's internals."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for route, body, field in [
            ("/classify", '{"inputs": "Berlin \\ud83d x"}', "inputs is not valid Unicode"),
            ("/embed", '{"inputs": ["fine", "a \\udc00"]}', "inputs[1] is not valid Unicode"),
            ("/v1/embeddings", '{"input": "\\ud83d"}', "input is not valid Unicode"),
            ("/qa", '{"question": "who \\ud83d?", "context": "Ann did."}', "question"),
        ]:
            response = client.post(route, content=body, headers={**AUTH, "content-type": "application/json"})
            assert response.status_code == 422, (route, response.text)
            assert field in response.text and "TextInputSequence" not in response.text, (route, response.text)
            _check(response, client)
        # a whole pair is one character, and fine
        whole = client.post(
            "/classify", content='{"inputs": "ok \\ud83d\\ude00"}', headers={**AUTH, "content-type": "application/json"}
        )
        assert whole.status_code == 200, whole.text


def test_a_text_of_only_invisible_characters_is_empty(server):
    """A zero-width space, a byte-order mark or a NUL is dropped by the tokenizer: no tokens, nothing to answer
    about, so 400 empty as a blank text is (not a confident answer about nothing)."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for route, body, field in [
            ("/classify", {"inputs": "\u200b"}, "inputs is empty"),
            ("/classify", {"inputs": ["fine", "\ufeff \u0000"]}, "inputs[1] is empty"),
            ("/embed", {"inputs": "\u200b\u200d"}, "inputs is empty"),
            ("/qa", {"question": "\u200b", "context": "Ann did."}, "question is empty"),
        ]:
            response = client.post(route, json=body, headers=AUTH)
            assert response.status_code == 400, (route, response.text)
            assert response.json()["error_type"] == "empty" and field in response.text, (route, response.text)
        # visible text around them is text
        assert client.post("/classify", json={"inputs": "\u200bfine"}, headers=AUTH).status_code == 200


# ---- methods, paths, headers --------------------------------------------------------------------------
REQUEST_CASES = [
    ("GET", "/classify", {}, None, 405),
    ("PUT", "/classify", {}, b"{}", 405),
    ("DELETE", "/qa", {}, None, 405),
    ("PATCH", "/ner", {}, b"{}", 405),
    ("OPTIONS", "/classify", {}, None, 405),
    ("HEAD", "/classify", {}, None, 405),
    ("POST", "/health", {}, b"{}", 405),
    ("POST", "/metrics", {}, b"{}", 405),
    ("DELETE", "/info", {}, None, 405),
    ("POST", "/classify/", {}, b'{"inputs": "x"}', 404),
    ("POST", "//classify", {}, b'{"inputs": "x"}', 200),  # read as POST /: the Inference API's root (docs/compat.md)
    ("POST", "/classify/../qa", {}, b'{"inputs": "x"}', 422),
    ("GET", "/%00", {}, None, 404),
    ("GET", "/" + "a" * 8000, {}, None, 404),
    ("GET", "/nope", {}, None, 404),
    ("POST", "/v2/classify", {}, b"{}", 404),
    ("GET", "/classify?inputs=x", {}, None, 405),
    ("POST", "/qa/", {}, b"{}", 404),
    # auth
    ("POST", "/classify", {"authorization": ""}, b'{"inputs": "x"}', 401),
    ("POST", "/classify", {"authorization": "Bearer"}, b'{"inputs": "x"}', 401),
    ("POST", "/classify", {"authorization": "Bearer wrong"}, b'{"inputs": "x"}', 401),
    ("POST", "/classify", {"authorization": f"Basic {KEY}"}, b'{"inputs": "x"}', 401),
    ("POST", "/classify", {"authorization": f"Bearer {KEY}x"}, b'{"inputs": "x"}', 401),
    ("POST", "/classify", {"authorization": "Bearer " + "k" * 4000}, b'{"inputs": "x"}', 401),
    ("GET", "/info", {"authorization": "Bearer wrong"}, None, 401),
    ("POST", "/qa", {"authorization": "bearer wrong"}, b"{}", 401),
    # content types and sizes
    ("POST", "/classify", {"content-type": "text/plain"}, b'{"inputs": "x"}', 422),
    ("POST", "/classify", {"content-type": "application/xml"}, b"<inputs>x</inputs>", 422),
    ("POST", "/classify", {"content-type": "multipart/form-data; boundary=x"}, b"--x\r\n\r\n--x--", 422),
    (
        "POST",
        "/classify",
        {"content-type": "application/json; charset=latin-1"},
        '{"inputs": "caf\xe9"}'.encode("latin-1"),
        400,
    ),
    ("POST", "/classify", {"content-encoding": "gzip"}, b'{"inputs": "x"}', 200),
    ("POST", "/classify", {}, b'{"inputs": "' + b"x" * 300_000 + b'"}', 413),
    ("POST", "/qa", {}, json.dumps({"question": "q", "context": "c " * 120_000}).encode(), 413),
    ("POST", "/classify", {"x-request-id": "<script>" * 50}, b'{"inputs": "x"}', 200),
    ("POST", "/classify", {"accept": "text/html"}, b"{", 422),
    ("GET", "/embed", {}, None, 405),
    ("POST", "/embed/", {}, b'{"inputs": "x"}', 404),
    ("POST", "/v1/embeddings", {"authorization": "Bearer wrong"}, b'{"input": "x"}', 401),
    ("POST", "/embed", {"authorization": ""}, b'{"inputs": "x"}', 401),
    ("GET", "/v1/models", {}, None, 200),  # OpenAI's model list (docs/compat.md)
    ("GET", "/v1/files", {}, None, 404),
]


@pytest.mark.parametrize(
    "method,path,headers,content,status", REQUEST_CASES, ids=[f"{m}-{i}" for i, (m, *_) in enumerate(REQUEST_CASES)]
)
def test_hostile_request(server, method, path, headers, content, status):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        sent = {**AUTH, **headers} if "authorization" not in headers else headers
        response = client.request(method, path, headers=sent, content=content)
        assert response.status_code == status, (response.status_code, response.text[:300])
        _check(response, client)
        if path.endswith("/") and path != "/":
            assert "location" not in response.headers  # no redirect built from the Host header


# ---- broken HTTP on a raw socket ----------------------------------------------------------------------
RAW_CASES = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 70_000 + b"\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello on the plain port
]


@pytest.mark.parametrize("raw", RAW_CASES, ids=[f"raw-{i}" for i in range(len(RAW_CASES))])
def test_broken_http_gets_a_json_error(server, raw):
    status, headers, body = _raw_exchange(server.port, raw)
    assert 400 <= status < 500, (status, body)
    assert json.loads(body).keys() == {"error", "error_type"}, body
    _check_ready(server)


def test_slow_headers_are_cut_off_with_408(server):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        sock.sendall(b"X-Slow: 1\r\n")  # still no end of headers: the 1 s timeout runs from the first byte
        status, _, body = _read_response(sock)
    elapsed = time.monotonic() - started
    assert status == 408 and json.loads(body)["error_type"] == "timeout", (status, body)
    assert 0.9 < elapsed < 10, elapsed  # the 1 s timeout, with room for a busy machine
    _check_ready(server)


def _classify_request(text: str, extra_headers: bytes = b"") -> bytes:
    body = json.dumps({"inputs": text}).encode()
    return (
        b"POST /classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\n"
        + extra_headers
        + b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def test_the_next_request_on_a_kept_alive_connection_has_the_same_header_bounds(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_classify_request("a kept-alive connection"))
        assert _read_response(sock)[0] == 200
        started = time.monotonic()
        sock.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\n")  # the next request's headers never end
        status, _, body = _read_response(sock)
        assert status == 408 and json.loads(body)["error_type"] == "timeout", (status, body)
        assert 0.9 < time.monotonic() - started < 10
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_classify_request("a kept-alive connection"))
        assert _read_response(sock)[0] == 200
        sock.sendall(_classify_request("too many header bytes", b"X-Pad: " + b"a" * 70_000 + b"\r\n"))
        assert _read_response(sock)[0] == 431
    _check_ready(server)


def test_idle_connection_is_closed_after_the_header_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        status, _, _ = _read_response(sock)  # sends nothing at all
    assert status == 408


def test_slow_body_gets_408(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + KEY.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"inputs": '
        )
        status, _, body = _read_response(sock)  # the other 89 bytes never come
    assert status == 408 and json.loads(body)["error_type"] == "timeout", body
    _check_ready(server)


def test_head_and_100_continue_are_not_held_back(server):
    """A response's head waits for its body so both leave in one write; a HEAD answer (no body) and an
    interim 100 Continue must still go at once, on a connection that is kept alive."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            chunk = sock.recv(1)  # a held head would time out here
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 405"), head  # /health is GET only; the answer still comes at once
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = _read_response(sock)
        assert status == 200 and json.loads(body)["status"] == "ok", body

        payload = json.dumps({"inputs": "a fine film"}).encode()
        sock.sendall(
            b"POST /classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
        )
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            chunk = sock.recv(1)
            assert chunk, interim
            interim += chunk
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        sock.sendall(payload)
        status, _, body = _read_response(sock)
        assert status == 200 and json.loads(body)[0]["label"], body


def test_a_response_head_leaves_with_its_body():
    from serving.protocol import _OneWriteResponses

    class Recording:
        def __init__(self):
            self.writes, self.closed = [], False

        def write(self, data):
            self.writes.append(data)

        def close(self):
            self.closed = True

        def is_closing(self):
            return self.closed

    sent = Recording()
    transport = _OneWriteResponses(sent)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    transport.write(head)
    assert sent.writes == []
    transport.write(b"{}")
    assert sent.writes == [head + b"{}"]  # one write: a kill leaves nothing or all of it
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # interim: at once
    assert sent.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n"
    whole = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 2\r\n\r\n{}"  # head and body together
    transport.write(whole)
    assert sent.writes[-1] == whole
    transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert not transport.is_closing()  # passed through
    transport.close()  # a held head is written before the close
    assert sent.writes[-1] == b"HTTP/1.1 204 No Content\r\n\r\n" and sent.closed


def test_case_count():
    """The bar: at least 150 hostile cases across all routes."""
    total = len(BODY_CASES) + len(REQUEST_CASES) + len(RAW_CASES) + 3
    assert total >= 150, total


# ---- helpers ------------------------------------------------------------------------------------------
def _check(response: httpx.Response, client: httpx.Client) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400 and response.request.method != "HEAD":
        body = response.json()
        assert set(body) == {"error", "error_type"}, body
        assert body["error"] and body["error_type"]
        assert response.headers["content-type"].startswith("application/json")
    assert client.get("/ready").status_code == 200


def _check_ready(server) -> None:
    assert httpx.get(server.url + "/ready", timeout=10).status_code == 200


def _raw_exchange(port: int, raw: bytes):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        return _read_response(sock)


def _read_response(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    length = int(headers.get("content-length", headers.get("Content-Length", "0")))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body
