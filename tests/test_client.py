"""bertserve-client against the real server: `python -m serving` on a tiny multi-task checkpoint, on a loopback port.

Every call goes to that server. Most go through `Wire`, an `httpx.MockTransport` in front of it that logs each request
(so a test can count attempts and read what was sent) and, when a test scripts it, answers in the server's place the
way a failing server or proxy would: 429 with Retry-After, 5xx, an HTML error page, a cut-off or undecodable body, a
timeout, a dropped connection. What is not scripted reaches the real server, so a retry ends in a real answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from test_serving_support import Server, build_checkpoint, free_port

import bertserve_client
from bertserve_client import (
    Answer,
    APIConnectionError,
    APITimeoutError,
    AsyncClient,
    BertserveError,
    Client,
    Entity,
    Info,
    Label,
    NotFoundError,
    OverloadedError,
    ServerError,
    UnauthorizedError,
    ValidationError,
)

API_KEY = "s3cret"
BATCH_LIMIT = 4  # the server's --max-client-batch-size: longer lists are split by the SDK
AUTH = {"Authorization": f"Bearer {API_KEY}"}

Fault = Callable[[httpx.Request], httpx.Response]


class Wire:
    """The SDK's transport to the real server: logs every request, answers the next scripted fault for its path if
    there is one, else forwards the request (less a proxy's path prefix) to the server and hands back its answer."""

    def __init__(self, url: str):
        self.url = url
        self.prefix = ""
        self.log: list[dict] = []
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._http = httpx.Client(timeout=60)

    def reset(self) -> None:
        self.prefix = ""
        self.log.clear()
        self.faults.clear()

    def script(self, path: str, *faults: Fault) -> None:
        self.faults[path].extend(faults)

    def requests(self, path: str | None = None) -> list[dict]:
        return [r for r in self.log if path is None or r["path"] == path]

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        assert path.startswith(self.prefix), f"{path} is not under {self.prefix}"
        path = path[len(self.prefix) :]
        self.log.append(
            {
                "path": path,
                "body": request.content,
                "authorization": request.headers.get("authorization"),
                "timeout": request.extensions.get("timeout"),
                "time": time.monotonic(),
            }
        )
        if self.faults[path]:
            return self.faults[path].popleft()(request)
        drop = ("host", "content-length", "accept-encoding")
        answer = self._http.request(
            request.method,
            self.url + path,
            content=request.content,
            headers={k: v for k, v in request.headers.items() if k not in drop},
        )
        keep = [(k, v) for k, v in answer.headers.items() if k not in ("content-length", "content-encoding")]
        return httpx.Response(answer.status_code, headers=keep, content=answer.content)


def error(status: int, message: str = "scripted", error_type: str | None = "kind", retry_after: str | None = None):
    """The server's own error answer: JSON {"error", "error_type"}, Retry-After when given."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = {"error": message, "error_type": error_type}
    return lambda request: httpx.Response(status, json=body, headers=headers)


def page(status: int, body: str, content_type: str = "text/html", headers: dict | None = None):
    """An answer that is not the server's: a proxy's page, a redirect, a body in a wrong encoding."""
    return lambda request: httpx.Response(
        status, content=body.encode(), headers={"Content-Type": content_type, **(headers or {})}
    )


def raising(exc_class: type[httpx.TransportError], message: str):
    """No answer at all: what httpx raises when a connection fails or a timeout expires."""

    def fault(request: httpx.Request) -> httpx.Response:
        raise exc_class(message, request=request)

    return fault


class CutOffBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body whose connection drops after its first bytes, as h11 reports one shorter than its Content-Length."""

    def __init__(self, first: bytes, length: int):
        self.first, self.length = first, length

    def _error(self) -> httpx.RemoteProtocolError:
        return httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body:"
            f" received {len(self.first)} bytes, expected {self.length}"
        )

    def __iter__(self):
        yield self.first
        raise self._error()

    async def __aiter__(self):
        yield self.first
        raise self._error()


def cut_off(first: bytes, length: int):
    headers = {"Content-Type": "application/json", "Content-Length": str(length)}
    return lambda request: httpx.Response(200, headers=headers, stream=CutOffBody(first, length))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "multi")
    args = ("--model", str(checkpoint), "--api-key", API_KEY, "--max-client-batch-size", str(BATCH_LIMIT))
    with Server(*args, "--max-wait-ms", "2") as running:
        yield running


@pytest.fixture(scope="module")
def wire(server):
    return Wire(server.url)


@pytest.fixture
def server_url(server, wire):
    wire.reset()
    return server.url


@pytest.fixture
def fast_backoff():
    """Clients made by `use` start their exponential schedule at 10 ms (Retry-After waits stay real), so retry tests
    take ms: the client's own `backoff` option."""
    return {"backoff": 0.01}


@pytest.fixture(params=["sync", "async"])
def use(request, server_url, wire):
    """use(fn, **client_options): fn(client) on a fresh Client, or awaited on a fresh AsyncClient, whose requests go
    through `wire` to the real server with the API key; with url=, straight to that URL (no wire, no key)."""

    def run(fn, url: str | None = None, **options):
        if "fast_backoff" in request.fixturenames:
            options = {**request.getfixturevalue("fast_backoff"), **options}
        if url is None:
            url = server_url
            options.setdefault("api_key", API_KEY)
            transport = httpx.MockTransport(wire.handle)
        else:
            transport = None
        if request.param == "sync":
            http = httpx.Client(transport=transport) if transport else None
            with Client(url, http_client=http, **options) as client:
                try:
                    return fn(client)
                finally:
                    if http is not None:
                        http.close()

        async def main():
            http = httpx.AsyncClient(transport=transport) if transport else None
            async with AsyncClient(url, http_client=http, **options) as client:
                try:
                    return await fn(client)
                finally:
                    if http is not None:
                        await http.aclose()

        return asyncio.run(main())

    run.flavour = request.param
    return run


def raw(server_url: str, path: str, body):
    """The server's answer over plain HTTP, for what the SDK's results must equal."""
    response = httpx.post(server_url + path, json=body, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def dumped(result):
    if isinstance(result, list):
        return [dumped(r) for r in result]
    return result.model_dump(exclude_none=True)


def close(a, b) -> bool:
    """Equal JSON answers, scores up to float noise (batched vs single forward passes)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 if k == "score" else a[k] == b[k] for k in a)
    return a == b


def same(a, b) -> bool:
    """Equal results, scores up to float noise: a real model's batched scores differ from single
    ones in the last bits (padding changes the reduction order)."""
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    da, db = a.model_dump(), b.model_dump()
    score_a, score_b = da.pop("score"), db.pop("score")
    return da == db and math.isclose(score_a, score_b, rel_tol=1e-3, abs_tol=1e-5)


# ---------------------------------------------------------------------------------------------
# Every method, sync and async

REVIEWS = [
    "a gripping, beautifully shot film",
    "dull and far too long",
    "fine",
    "I love it",
    "the worst",
    "great fun",
    "not good",
    "so so",
    "best of the year",
    "meh",
]
NER_TEXT = "Alice moved from Paris to Berlin in 2019."
CONTEXT = "Alice lives in Paris. She works at the Louvre as a restorer of old paintings."


def test_every_response_type_is_exported():
    """What a method returns can be named from the package (`from bertserve_client import Ranked`), so every
    result model in bertserve_client.types is in __all__."""
    import pydantic

    from bertserve_client import types

    results = {
        name
        for name, value in vars(types).items()
        if isinstance(value, type)
        and issubclass(value, pydantic.BaseModel)
        and value.__module__ == types.__name__
        and not name.startswith("_")
    }
    assert {"Label", "Entity", "Answer", "Ranked", "MaskCandidate", "Info"} <= results
    assert results - set(bertserve_client.__all__) == set()
    assert all(getattr(bertserve_client, name) is getattr(types, name) for name in results)


def test_classify_single_many_and_pairs_match_the_http_api(use, server_url):
    single = use(lambda c: c.classify(REVIEWS[0]))
    assert len(single) == 1 and isinstance(single[0], Label) and 0 <= single[0].score <= 1
    assert close(dumped(single), raw(server_url, "/classify", {"inputs": REVIEWS[0]}))
    many = use(lambda c: c.classify(REVIEWS[:3], top_k=2))
    assert len(many) == 3 and all(len(labels) == 2 for labels in many)
    assert all(labels[0].score >= labels[1].score for labels in many)
    assert many[0][0].label == single[0].label
    assert close(dumped(many), raw(server_url, "/classify", {"inputs": REVIEWS[:3], "top_k": 2}))
    pairs = use(lambda c: c.classify([("a man sleeps", "a person rests"), ["it rains", "it is sunny"]]))
    assert len(pairs) == 2 and all(isinstance(labels[0], Label) for labels in pairs)
    body = {"inputs": [["a man sleeps", "a person rests"], ["it rains", "it is sunny"]]}
    assert close(dumped(pairs), raw(server_url, "/classify", body))


def test_ner_single_many_and_token_level(use, server_url):
    entities = use(lambda c: c.ner(NER_TEXT))
    assert entities and all(isinstance(e, Entity) and e.entity_group for e in entities)
    for e in entities:
        assert NER_TEXT[e.start : e.end].lower().replace(" ", "") == e.word.lower().replace(" ", "").replace("##", "")
    assert close(dumped(entities), raw(server_url, "/ner", {"inputs": NER_TEXT}))
    many = use(lambda c: c.ner([NER_TEXT, "nothing here"]))
    assert len(many) == 2 and same(many[0], entities)
    tokens = use(lambda c: c.ner(NER_TEXT, aggregation="none"))
    assert tokens and all(e.entity and e.index is not None and e.entity_group is None for e in tokens)
    assert close(dumped(tokens), raw(server_url, "/ner", {"inputs": NER_TEXT, "aggregation": "none"}))


def test_qa_single_top_k_and_many(use, server_url):
    question = "Where does Alice live?"
    answer = use(lambda c: c.qa(question, CONTEXT))
    assert isinstance(answer, Answer) and CONTEXT[answer.start : answer.end] == answer.answer
    assert close(dumped(answer), raw(server_url, "/qa", {"question": question, "context": CONTEXT}))
    top = use(lambda c: c.qa(question, CONTEXT, top_k=3))
    assert isinstance(top, list) and 1 <= len(top) <= 3 and all(isinstance(a, Answer) for a in top)
    items = [(question, CONTEXT), {"question": "What is Alice's job?", "context": CONTEXT}]
    many = use(lambda c: c.qa(items))
    assert len(many) == 2 and same(many[0], answer)
    many_top = use(lambda c: c.qa(items, top_k=2))
    assert all(isinstance(per_item, list) and len(per_item) == 2 for per_item in many_top)


def test_embed_single_many_and_unnormalised(use, server_url):
    one = use(lambda c: c.embed(REVIEWS[0]))
    assert isinstance(one, list) and all(isinstance(x, float) for x in one)
    assert abs(sum(x * x for x in one) - 1) < 1e-6
    assert one == raw(server_url, "/embed", {"inputs": REVIEWS[0]})[0]
    many = use(lambda c: c.embed(REVIEWS[:3]))
    assert len(many) == 3 and np.abs(np.asarray(many[0]) - np.asarray(one)).max() < 1e-5
    raw_vector = use(lambda c: c.embed(REVIEWS[0], normalize=False))
    assert abs(sum(x * x for x in raw_vector) - 1) > 1e-3


def test_health_ready_info(use):
    assert use(lambda c: c.health()) is True
    assert use(lambda c: c.ready()) is True
    info = use(lambda c: c.info())
    assert isinstance(info, Info) and info.model and info.version
    assert set(info.tasks) == {"classify", "ner", "qa", "embed"}
    assert info.client_batch_limit == info.max_client_batch_size == BATCH_LIMIT


def test_async_client_gives_what_the_sync_client_gives(server_url):
    async def run():
        async with AsyncClient(server_url, api_key=API_KEY) as client:
            return (
                await client.info(),
                await client.classify(REVIEWS),
                await client.ner(REVIEWS[:5]),
                await client.qa("Where does Alice live?", CONTEXT),
                await client.embed(REVIEWS),
            )

    info, labels, entities, answer, vectors = asyncio.run(run())
    with Client(server_url, api_key=API_KEY) as client:
        assert info == client.info()
        assert same(labels, client.classify(REVIEWS))
        assert same(entities, client.ner(REVIEWS[:5]))
        assert same(answer, client.qa("Where does Alice live?", CONTEXT))
        assert np.abs(np.asarray(vectors) - np.asarray(client.embed(REVIEWS))).max() < 1e-5


def test_ready_is_false_while_server_answers_503(use, wire):
    wire.script("/ready", error(503, "model loading", "unhealthy"))
    assert use(lambda c: c.ready()) is False
    assert len(wire.requests("/ready")) == 1  # probes are not retried


# ---------------------------------------------------------------------------------------------
# Batching: lists longer than max_client_batch_size


def test_long_list_split_and_reassembled_in_order(use, server_url, wire):
    singles = [use(lambda c, t=t: c.classify(t)) for t in REVIEWS]
    wire.reset()
    batched = use(lambda c: c.classify(REVIEWS))
    assert same(batched, singles)
    sizes = [len(json.loads(r["body"])["inputs"]) for r in wire.requests("/classify")]
    assert sizes == [4, 4, 2]
    assert len(wire.requests("/info")) == 1  # the limit is read once per client
    vectors = use(lambda c: c.embed(REVIEWS[:6]))  # in order across requests: each equals the server's own answer
    expected = raw(server_url, "/embed", {"inputs": REVIEWS[:4]}) + raw(server_url, "/embed", {"inputs": REVIEWS[4:6]})
    assert np.abs(np.asarray(vectors) - np.asarray(expected)).max() < 1e-5


def test_explicit_batch_size_skips_info(use, wire):
    texts = ["Alice", "Bob", "Carol went to Paris"]
    result = use(lambda c: c.ner(texts, aggregation="simple"), batch_size=1)
    assert len(result) == 3
    assert len(wire.requests("/ner")) == 3 and not wire.requests("/info")


def test_qa_list_split(use, wire):
    items = [(f"Who is number {i}?", f"Number {i} is Alice{i}") for i in range(6)]
    answers = use(lambda c: c.qa(items))
    assert len(answers) == 6 and all(isinstance(a, Answer) for a in answers)
    assert [len(json.loads(r["body"])) for r in wire.requests("/qa")] == [4, 2]


def test_error_of_a_split_list_names_the_callers_item(use):
    """The server numbers the items of the one request it got: for a list split in several, the error says which
    request failed and which of the caller's items it carried, so "inputs[1]" can be traced to item 9."""
    texts = REVIEWS[:9] + ["", "fine"]  # the empty text is item 9: request 3 of 3 carries items [8:11]
    with pytest.raises(ValidationError) as e:
        use(lambda c: c.classify(texts), batch_size=4, max_retries=0)
    err = e.value
    assert err.status_code == 400 and err.error_type == "empty" and "inputs[1] is empty" in err.message
    assert "request 3 of 3" in err.message and "items [8:11] of the 11" in err.message and "8+i" in str(err)
    assert "the answers of items [0:8] are in .partial" in err.message
    assert same(err.partial, use(lambda c: c.classify(texts[:8]), batch_size=4))  # what requests 1 and 2 answered
    with pytest.raises(ValidationError) as whole:  # a list sent in one request: the server's index is the caller's
        use(lambda c: c.classify(["good", ""]), batch_size=4, max_retries=0)
    assert whole.value.message == "inputs[1] is empty" and whole.value.partial is None
    with pytest.raises(ValidationError) as e:  # the limit read from /info, and a route whose answers are lists
        use(lambda c: c.ner(["good", "bad", "fine", "ok", "so so", ""]), max_retries=0)
    assert e.value.message == (
        "inputs[1] is empty (request 2 of 2, carrying items [4:6] of the 6 given: the server's index i is item 4+i)"
        " (the answers of items [0:4] are in .partial)"
    )
    assert len(e.value.partial) == 4 and all(isinstance(entities, list) for entities in e.value.partial)


def test_bad_list_items_fail_before_any_request_naming_the_item(use, wire):
    """A wrong item is a TypeError that names it, raised before anything is sent (not a server 422 naming the
    item's index within one of the requests a long list was split into, nor "'int' object is not iterable")."""
    texts = [f"text {i}" for i in range(9)]
    with pytest.raises(TypeError, match=r"inputs\[0\] must be a str or a \(text, text_pair\) pair"):
        use(lambda c: c.classify([1, 2]))
    with pytest.raises(TypeError, match=r"inputs\[1\].*a tuple of 3 items"):
        use(lambda c: c.classify(["ok", ("a", "b", "c")]))
    with pytest.raises(TypeError, match=r"inputs\[9\] must be a str, not NoneType"):
        use(lambda c: c.ner([*texts, None]))
    with pytest.raises(TypeError, match=r"inputs\[1\] must be a str, not bytes"):
        use(lambda c: c.embed(["ok", b"bytes"]))
    with pytest.raises(TypeError, match=r"items\[1\] must be a QAInput.*keys \['question'\]"):
        use(lambda c: c.qa([("q", "c"), {"question": "no context"}]))
    with pytest.raises(TypeError, match=r"items\[0\]: question and context must be str"):
        use(lambda c: c.qa([("q", None)]))
    assert wire.requests() == []


def test_numpy_scalars_as_options_are_sent_as_numbers(use, server_url, wire):
    """top_k=np.int64(2) (a value from numpy code) is sent as the number it holds, not refused by the JSON encoder
    ("Object of type int64 is not JSON serializable"), and the server answers as to plain numbers; a numpy array as
    `inputs` stays a TypeError."""
    many = use(lambda c: c.classify(REVIEWS[:2], top_k=np.int64(2), truncate=np.bool_(False)))
    assert len(many) == 2 and all(len(labels) == 2 for labels in many)
    assert close(dumped(many), raw(server_url, "/classify", {"inputs": REVIEWS[:2], "top_k": 2}))
    assert len(use(lambda c: c.classify(np.str_(REVIEWS[0]), top_k=np.int32(2)))) == 2
    vectors = use(lambda c: c.embed([np.str_("good"), "bad"], dimensions=np.int32(8)))
    assert vectors == raw(server_url, "/embed", {"inputs": ["good", "bad"], "dimensions": 8})
    use(lambda c: c.ner("Alice met Bob", stride=np.int64(16)))
    answers = use(lambda c: c.qa("who?", "Alice and Bob", top_k=np.int64(2), max_answer_len=np.int16(10)))
    assert isinstance(answers, list) and len(answers) == 2
    sent = [json.loads(r["body"]) for r in wire.requests() if r["path"] != "/info"]
    assert sent[0] == {"inputs": REVIEWS[:2], "top_k": 2, "truncate": False}
    assert sent[2] == {"inputs": ["good", "bad"], "normalize": True, "truncate": False, "dimensions": 8}
    assert sent[3]["stride"] == 16 and (sent[4]["top_k"], sent[4]["max_answer_len"]) == (2, 10)
    with pytest.raises(TypeError, match="not ndarray"):
        use(lambda c: c.embed(np.array(["good", "bad"])))


def test_a_lone_surrogate_fails_before_any_request_naming_the_text(use, wire):
    """A str holding a lone surrogate ("abc\\ud800": half of a cut UTF-16 pair, or bytes decoded with
    errors="surrogateescape") cannot be sent as JSON: a ValueError names the text (its index in the caller's list, however the list is split), before any
    request, instead of a UnicodeEncodeError whose position is in the request body. Every endpoint's texts."""
    texts = [f"text {i}" for i in range(9)] + ["abc\ud800"]
    lone = r"holds a lone surrogate \(U\+D800 at character 3\), which is not valid text"
    for options in ({}, {"batch_size": 4}):  # learning the limit from /info, or split by a known one
        with pytest.raises(ValueError, match=r"^inputs\[9\] " + lone):
            use(lambda c: c.ner(texts), **options)
        with pytest.raises(ValueError, match=r"^inputs\[9\] " + lone):
            use(lambda c: c.embed(texts), **options)
        with pytest.raises(ValueError, match=r"^inputs\[9\] " + lone):
            use(lambda c: c.classify(texts), **options)
        with pytest.raises(ValueError, match=r"^inputs\[5\]\[1\] " + lone):
            use(lambda c: c.classify([("a", "b")] * 5 + [("a", "abc\ud800")]), **options)
        with pytest.raises(ValueError, match=r"^items\[5\]\.context " + lone):
            use(lambda c: c.qa([("q", "c")] * 5 + [("q", "abc\ud800")]), **options)
        with pytest.raises(ValueError, match=r"^texts\[9\] " + lone):
            use(lambda c: c.rerank("query", texts), **options)
        with pytest.raises(ValueError, match=r"^inputs\[9\] " + lone):
            use(lambda c: c.fill_mask(texts), **options)
        with pytest.raises(ValueError, match=r"^inputs\[9\] " + lone):
            use(lambda c: c.zero_shot(texts, ["a", "b"]), **options)
        with pytest.raises(ValueError, match=r"^candidate_labels\[1\] " + lone):
            use(lambda c: c.zero_shot(texts[:5], ["a", "abc\ud800"]), **options)
    with pytest.raises(ValueError, match=r"^inputs " + lone):
        use(lambda c: c.classify("abc\ud800"))
    with pytest.raises(ValueError, match=r"^inputs " + lone):
        use(lambda c: c.embed("abc\ud800"))
    with pytest.raises(ValueError, match=r"^question " + lone):
        use(lambda c: c.qa("abc\ud800", "context"))
    with pytest.raises(ValueError, match=r"^context holds a lone surrogate \(U\+DC80 at character 1\)"):
        use(lambda c: c.qa("question", "é\udc80"))
    with pytest.raises(ValueError, match=r"^query " + lone):
        use(lambda c: c.rerank("abc\ud800", ["a"]))
    with pytest.raises(ValueError, match=r"^candidate_labels " + lone):
        use(lambda c: c.zero_shot("text", "abc\ud800"))
    with pytest.raises(ValueError, match=r"^inputs holds a UTF-16 surrogate pair \(U\+D83D U\+DE00 at character 2\)"):
        use(lambda c: c.ner("é \ud83d\ude00"))
    assert wire.requests() == []
    assert use(lambda c: c.ner(["Ålice in Zürich 😀", "plain"]))  # other non-ASCII text is sent as it is


# ---------------------------------------------------------------------------------------------
# Errors: one class per kind; what is and isn't retried


def test_validation_errors_are_not_retried(use, wire):
    with pytest.raises(ValidationError) as too_long:  # longer than the model accepts, no truncate
        use(lambda c: c.classify("word " * 5000), max_retries=3)
    assert too_long.value.status_code == 422 and "512" in too_long.value.message
    assert len(wire.requests("/classify")) == 1
    with pytest.raises(ValidationError) as empty:
        use(lambda c: c.classify([]))
    assert empty.value.status_code == 400
    with pytest.raises(ValidationError) as too_large:  # more inputs per request than the server takes
        use(lambda c: c.classify(["x"] * 1000), batch_size=1000)
    assert too_large.value.status_code == 413


def test_truncate_accepts_long_input(use):
    assert use(lambda c: c.classify("word " * 5000, truncate=True))[0].label in {"negative", "positive"}


def test_unauthorized(use, wire):
    with pytest.raises(UnauthorizedError) as e:
        use(lambda c: c.classify("hello"), api_key="wrong", max_retries=3)
    assert e.value.status_code == 401 and e.value.error_type == "unauthorized"
    assert len(wire.requests("/classify")) == 1
    assert use(lambda c: c.classify("hello"), api_key=API_KEY)


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, ValidationError),
        (401, UnauthorizedError),
        (404, NotFoundError),
        (408, BertserveError),
        (413, ValidationError),
        (422, ValidationError),
        (429, OverloadedError),
        (500, ServerError),
        (503, ServerError),
        (418, BertserveError),
    ],
)
def test_each_status_raises_its_class(use, wire, status, error_class):
    wire.script("/ner", error(status, f"scripted {status}"))
    with pytest.raises(error_class) as e:
        use(lambda c: c.ner("Alice"), max_retries=0)
    err = e.value
    assert type(err) is error_class and isinstance(err, BertserveError)
    assert (err.status_code, err.message, err.error_type) == (status, f"scripted {status}", "kind")
    assert isinstance(err.response, httpx.Response) and err.response.status_code == status


def test_429_waits_retry_after(use, wire):
    wire.script("/classify", error(429, error_type="overloaded", retry_after="1"))
    started = time.monotonic()
    assert use(lambda c: c.classify("good"), max_retries=2)
    assert time.monotonic() - started >= 1.0
    attempts = wire.requests("/classify")
    assert len(attempts) == 2 and attempts[1]["time"] - attempts[0]["time"] >= 1.0


def test_overloaded_error_carries_retry_after_when_retries_run_out(use, wire):
    wire.script("/classify", error(429, retry_after="0"), error(429, retry_after="0"))
    with pytest.raises(OverloadedError) as e:
        use(lambda c: c.classify("good"), max_retries=1)
    assert e.value.retry_after == 0 and len(wire.requests("/classify")) == 2


def test_retry_after_beyond_cap_is_raised_not_waited(use, wire):
    wire.script("/classify", error(429, retry_after="3600"))
    started = time.monotonic()
    with pytest.raises(OverloadedError) as e:
        use(lambda c: c.classify("good"), max_retries=3)
    assert e.value.retry_after == 3600 and time.monotonic() - started < 5


def test_5xx_retried_then_succeeds_or_raises(use, wire, fast_backoff):
    wire.script("/qa", error(500), error(503))
    assert isinstance(use(lambda c: c.qa("who?", "Alice"), max_retries=2), Answer)
    assert len(wire.requests("/qa")) == 3
    wire.script("/qa", *[error(500, "backend failed")] * 3)
    with pytest.raises(ServerError, match="backend failed"):
        use(lambda c: c.qa("who?", "Alice"), max_retries=1)
    assert len(wire.requests("/qa")) == 3 + 2


def test_408_is_retried_like_429_and_5xx(use, wire, fast_backoff):
    """The server answers 408 when a request's body arrives too slowly, before any work: safe to send again, so
    retried under the same max_retries and Retry-After rules as 429 and 5xx."""
    slow = error(408, "the request body did not arrive within 30 s", "timeout")
    wire.script("/embed", slow)
    assert len(use(lambda c: c.embed("good"), max_retries=1)) == 32  # the tiny model's hidden size
    assert len(wire.requests("/embed")) == 2
    wire.script("/embed", slow, slow)
    with pytest.raises(BertserveError) as e:
        use(lambda c: c.embed("good"), max_retries=1)
    assert e.value.status_code == 408 and "gave up after 2 attempts" in e.value.message
    assert len(wire.requests("/embed")) == 2 + 2
    wire.script("/embed", slow)
    with pytest.raises(BertserveError):
        use(lambda c: c.embed("good"), max_retries=0)
    wire.script("/embed", error(408, "the request body did not arrive within 30 s", "timeout", retry_after="3600"))
    with pytest.raises(BertserveError, match="not retried: the server asks for 3600 s"):
        use(lambda c: c.embed("good"), max_retries=3)
    assert len(wire.requests("/embed")) == 4 + 1 + 1


def test_timeout_raises_then_retry_recovers(use, wire, fast_backoff):
    """A read timeout is APITimeoutError, retried; the client's timeout= is the one each request is sent with."""
    wire.script("/classify", raising(httpx.ReadTimeout, "timed out"))
    with pytest.raises(APITimeoutError):
        use(lambda c: c.classify("good"), timeout=0.3, max_retries=0)
    wire.script("/classify", raising(httpx.ReadTimeout, "timed out"))
    assert use(lambda c: c.classify("good"), timeout=1.0, max_retries=1)  # the retry reaches the server
    attempts = wire.requests("/classify")
    assert len(attempts) == 3
    assert [a["timeout"]["read"] for a in attempts] == [0.3, 1.0, 1.0]


def test_timeout_says_what_timed_out_and_after_how_long(use, server_url, wire):
    wire.script("/classify", raising(httpx.ReadTimeout, "timed out"))
    with pytest.raises(APITimeoutError) as e:
        use(lambda c: c.classify("good"), timeout=0.3, max_retries=0)
    assert str(e.value) == (
        f"read timeout: no answer within 0.3 s (POST {server_url}/classify); a slow request needs a larger timeout="
    )


def test_a_real_read_timeout_is_raised(server_url):
    """Against the real server, no transport in between: a request that cannot be answered in time (512 tokens,
    a 1 ms budget) raises APITimeoutError, in both clients."""
    text = "word " * 400

    async def run_async():
        async with AsyncClient(server_url, api_key=API_KEY, timeout=0.001, max_retries=0) as client:
            with pytest.raises(APITimeoutError):
                await client.classify(text)

    with Client(server_url, api_key=API_KEY, timeout=0.001, max_retries=0) as client:
        with pytest.raises(APITimeoutError):
            client.classify(text)
    asyncio.run(run_async())


def test_connection_refused(use, fast_backoff):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(APIConnectionError) as e:
        use(lambda c: c.classify("good"), url=url, max_retries=1)
    assert not isinstance(e.value, APITimeoutError) and e.value.status_code is None
    with pytest.raises(APIConnectionError):
        use(lambda c: c.health(), url=url)


def test_connection_errors_read_the_same_in_sync_and_async(use):
    """No answer at all: the message names the request and the system's reason, the same from both clients (the
    async one's transport says only "All connection attempts failed")."""
    port = free_port()  # nothing listens there
    with pytest.raises(APIConnectionError) as refused:
        use(lambda c: c.classify("good"), url=f"http://127.0.0.1:{port}", max_retries=0)
    assert str(refused.value) == (
        f"could not connect to the server (POST http://127.0.0.1:{port}/classify): [Errno 111] Connection refused"
    )
    with pytest.raises(APIConnectionError) as unknown_host:  # .invalid never resolves (RFC 2606)
        use(lambda c: c.health(), url="http://bertserve.invalid:8000", max_retries=0)
    assert str(unknown_host.value).startswith(
        "could not connect to the server (GET http://bertserve.invalid:8000/health): [Errno "
    )


def test_a_connection_error_is_retried(use, wire, fast_backoff):
    wire.script("/embed", raising(httpx.ConnectError, "connection reset"))
    assert use(lambda c: c.embed("good"), max_retries=1)
    wire.script("/embed", raising(httpx.ConnectError, "connection reset"))
    with pytest.raises(APIConnectionError, match="could not connect to the server"):
        use(lambda c: c.embed("good"), max_retries=0)
    assert len(wire.requests("/embed")) == 3


NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>"
    "\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)


def test_a_proxys_html_error_page_is_a_clear_error(use, wire, fast_backoff):
    """An nginx 502 page: a ServerError, retried, whose message is the page's words, not its HTML; a 200 login
    page is a BertserveError saying it is not JSON, not retried."""
    wire.script("/classify", page(502, NGINX_502), page(502, NGINX_502))
    with pytest.raises(ServerError) as e:
        use(lambda c: c.classify("good"), max_retries=1)
    err = e.value
    assert err.status_code == 502 and err.error_type is None and len(wire.requests("/classify")) == 2
    assert "<" not in err.message and "'502 Bad Gateway nginx/1.25.3'" in err.message and "text/html" in err.message
    assert err.message.endswith("(gave up after 2 attempts)")
    wire.script("/ner", page(200, "<html><body>Please sign in</body></html>"))
    with pytest.raises(BertserveError) as login:
        use(lambda c: c.ner("Alice"), max_retries=3)
    assert login.value.status_code == 200 and "not JSON" in login.value.message
    assert "'Please sign in'" in login.value.message and len(wire.requests("/ner")) == 1


def test_other_json_error_shapes_give_their_message(use, wire):
    """FastAPI's own {"detail": [...]} (an app in front of bertserve) and OpenAI's error object (the server's /v1/
    paths): their message, not a dict's repr."""
    detail = '{"detail": [{"loc": ["body", "inputs", 0], "msg": "field required", "type": "missing"}]}'
    openai = '{"error": {"message": "no such model", "type": "not_found", "param": null, "code": null}}'
    wire.script("/classify", page(422, detail, "application/json"), page(404, openai, "application/json"))
    with pytest.raises(ValidationError) as e:
        use(lambda c: c.classify("good"))
    assert e.value.message == "inputs.0: field required"
    with pytest.raises(NotFoundError) as e:
        use(lambda c: c.classify("good"))
    assert (e.value.message, e.value.error_type) == ("no such model", "not_found")


def test_redirect_names_where_it_goes(use, wire):
    wire.script("/classify", page(307, "", headers={"Location": "https://bertserve.example/"}))
    with pytest.raises(BertserveError) as e:
        use(lambda c: c.classify("good"), max_retries=3)
    assert e.value.status_code == 307 and "'https://bertserve.example/'" in e.value.message
    assert len(wire.requests("/classify")) == 1


def test_cut_off_answer_is_a_connection_error_and_retried(use, server_url, wire, fast_backoff):
    """A body shorter than its Content-Length (a connection dropped mid-answer) is APIConnectionError, retried."""
    cut = cut_off(b'[{"label": "pos', 60)
    wire.script("/classify", cut, cut)
    with pytest.raises(APIConnectionError) as e:
        use(lambda c: c.classify("good"), max_retries=0)
    assert not isinstance(e.value, APITimeoutError)
    assert str(e.value).startswith(f"the connection to the server failed (POST {server_url}/classify): ")
    assert use(lambda c: c.classify("good"), max_retries=1)  # the second cut answer, then a whole one
    assert len(wire.requests("/classify")) == 3


def test_undecodable_answer_is_a_bertserve_error(use, wire):
    """A body that says gzip and is not (a broken proxy): BertserveError, not httpx's DecodingError."""
    wire.script("/classify", page(200, "not gzip", "application/json", {"Content-Encoding": "gzip"}))
    with pytest.raises(BertserveError, match="could not be decoded"):
        use(lambda c: c.classify("good"), max_retries=3)
    assert len(wire.requests("/classify")) == 1


def test_503_carries_retry_after_and_a_too_long_one_says_why_not_retried(use, wire):
    wire.script("/embed", error(503, "warming up", "unavailable", retry_after="3600"))
    with pytest.raises(ServerError) as e:
        use(lambda c: c.embed("good"), max_retries=3)
    assert e.value.retry_after == 3600 and len(wire.requests("/embed")) == 1
    assert e.value.message == (
        "warming up (not retried: the server asks for 3600 s (Retry-After), more than the 60 s this client waits"
        " (max_retry_after))"
    )


def test_the_retry_schedule_is_the_clients_to_set(use, wire):
    """max_retry_after, backoff and max_backoff are options: a Retry-After over the client's own cap is raised at
    once, naming the option; a schedule of 0 s retries at once. Out-of-range values are refused at construction."""
    wire.script("/classify", error(429, retry_after="2"))
    with pytest.raises(OverloadedError, match=r"more than the 1 s this client waits \(max_retry_after\)"):
        use(lambda c: c.classify("good"), max_retries=3, max_retry_after=1)
    wire.script("/classify", error(500), error(500))
    assert use(lambda c: c.classify("good"), max_retries=2, backoff=0, max_backoff=0)
    attempts = wire.requests("/classify")[-3:]
    waits = [later["time"] - earlier["time"] for earlier, later in zip(attempts, attempts[1:])]
    assert max(waits) < 0.3  # the default schedule waits 0.5 s, then 1 s, less up to 25 %
    for option, value in [
        ("backoff", -1),
        ("max_backoff", "8"),
        ("max_retry_after", float("nan")),
        ("max_retries", 1.5),
    ]:
        with pytest.raises(ValueError, match=f"{option} must be"):
            Client(**{option: value})


def test_failing_info_of_a_list_call_says_how_to_skip_it(use, wire):
    wire.script("/info", error(404, "no route GET /info", "not_found"))
    with pytest.raises(NotFoundError, match="batch_size=N skips it"):
        use(lambda c: c.classify(["good", "bad"]))


def test_unusable_base_url_is_refused_at_construction(monkeypatch):
    """No scheme ("localhost:8000"): every request would fail (and be retried); say so at once, naming the source."""
    for flavour in (Client, AsyncClient):
        with pytest.raises(ValueError, match="base_url must be an http:// or https:// URL.*'localhost:8000'"):
            flavour("localhost:8000")
        monkeypatch.setenv("BERTSERVE_BASE_URL", "bertserve:8000")
        with pytest.raises(ValueError, match=r"\$BERTSERVE_BASE_URL must be an http"):
            flavour()
        monkeypatch.delenv("BERTSERVE_BASE_URL")


def test_base_url_forms(server_url, monkeypatch):
    """A trailing slash, an httpx.URL and $BERTSERVE_BASE_URL all reach the same server."""
    monkeypatch.setenv("BERTSERVE_BASE_URL", server_url + "/")
    for base_url in (server_url + "/", httpx.URL(server_url), None):
        with Client(base_url) as client:
            assert client.base_url == server_url and client.health()


def test_base_url_with_a_path_prefix(server_url, wire):
    """Behind a proxy at /bertserve/: every call, /info included, goes under the prefix."""
    wire.prefix = "/bertserve"
    with httpx.Client(transport=httpx.MockTransport(wire.handle)) as http:
        with Client(server_url + "/bertserve/", api_key=API_KEY, http_client=http) as client:
            assert len(client.classify(REVIEWS[:6])) == 6 and client.info().model and client.ready()
    assert [r["path"] for r in wire.requests()] == ["/info", "/classify", "/classify", "/info", "/ready"]


def test_api_key_sent_as_bearer(use, wire):
    with pytest.raises(UnauthorizedError):
        use(lambda c: c.classify("good"), api_key="abc")
    assert wire.requests("/classify")[-1]["authorization"] == "Bearer abc"
    use(lambda c: c.classify("good"))
    assert wire.requests("/classify")[-1]["authorization"] == f"Bearer {API_KEY}"


def test_bad_arguments_fail_before_any_request(use, wire):
    with pytest.raises(ValueError):
        use(lambda c: c.ner("Alice", aggregation="bogus"))
    with pytest.raises(TypeError):
        use(lambda c: c.classify(42))
    with pytest.raises(TypeError):
        use(lambda c: c.qa("question without context"))
    assert wire.requests() == []


# ---------------------------------------------------------------------------------------------
# Lifecycle


def test_context_managers_close(server_url):
    with Client(server_url) as client:
        assert client.health() and not client.is_closed
    assert client.is_closed

    async def main():
        async with AsyncClient(server_url) as aclient:
            assert await aclient.health() and not aclient.is_closed
        return aclient

    assert asyncio.run(main()).is_closed


def test_own_http_client_left_open(server_url):
    with httpx.Client() as http:
        with Client(server_url, http_client=http) as client:
            assert client.health()
        assert not http.is_closed


def test_async_client_reused_in_a_new_event_loop(server_url):
    """One AsyncClient, several asyncio.run()s (a script's or a notebook's cells): the pool of a closed loop is
    replaced, not used to fail with "Event loop is closed"; a given http_client gets a clear error instead."""
    client = AsyncClient(server_url, api_key=API_KEY)
    first = asyncio.run(client.classify("good"))
    assert same(asyncio.run(client.classify("good")), first)
    assert len(asyncio.run(client.classify(REVIEWS))) == len(REVIEWS)
    asyncio.run(client.close())
    assert client.is_closed

    http = httpx.AsyncClient()
    own = AsyncClient(server_url, api_key=API_KEY, http_client=http)
    asyncio.run(own.classify("good"))
    with pytest.raises(RuntimeError, match="one AsyncClient per event loop|made in this loop"):
        asyncio.run(own.classify("good"))


def test_sync_client_shared_by_threads(server_url):
    """httpx.Client is thread-safe, and so is Client: lists split and reassembled in order from 8 threads."""
    from concurrent.futures import ThreadPoolExecutor

    with Client(server_url, api_key=API_KEY) as client:
        expected = [client.classify(t) for t in REVIEWS]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: client.classify(REVIEWS[i:] + REVIEWS[:i]), range(8)))
    for i, result in enumerate(results):
        assert same(result, expected[i:] + expected[:i])


def test_async_calls_run_concurrently(server_url):
    async def main():
        async with AsyncClient(server_url, api_key=API_KEY) as client:
            return await asyncio.gather(*(client.classify(t) for t in REVIEWS))

    with Client(server_url, api_key=API_KEY) as client:
        singles = [client.classify(t) for t in REVIEWS]
    assert same(asyncio.run(main()), singles)
