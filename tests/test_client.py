"""bertserve-client against a real server process on a loopback port: no mocked transport.

By default the server is tests/fake_bertserve_app.py, a stand-in that speaks the HTTP contract
with toy answers and can be scripted to fail (429 + Retry-After, 5xx, 401, slow answers).
The same tests run against the real server:

    BERTSERVE_TEST_SERVER=real pytest tests/test_client.py    # starts `python -m serving` (demo model)
    BERTSERVE_TEST_SERVER=http://host:8000 pytest ...          # a server already running

Against a real server the tests that need scripted faults or the request log skip; the others
check the contract (shapes, offsets, batched == single, error classes), not toy values.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
try:
    import bertserve_client
except ImportError:  # not pip-installed: use the checkout's copy
    sys.path.insert(0, str(REPO / "clients"))
    import bertserve_client

from bertserve_client import (  # noqa: E402  (after the fallback above)
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

SERVER = os.environ.get("BERTSERVE_TEST_SERVER", "fake")
FAKE = SERVER == "fake"
needs_fake = pytest.mark.skipif(not FAKE, reason="scripts faults / reads the request log of the fake server")
FAKE_BATCH_LIMIT = 4
API_KEY = "test-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(command: list[str], port: int, env: dict[str, str] | None = None, ready_path: str = "/ready"):
    proc = subprocess.Popen(
        command, cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + (300 if SERVER == "real" else 30)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + ready_path, timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server on {url} not ready in time")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _launch(api_key: str | None = None, prefix: str | None = None):
    port = _free_port()
    if SERVER == "real":
        env = {"BERTSERVE_HOST": "127.0.0.1", "BERTSERVE_PORT": str(port)}
        if api_key:
            env["BERTSERVE_API_KEY"] = api_key
        return _start([sys.executable, "-m", "serving"], port, env)
    command = [
        sys.executable,
        str(REPO / "tests" / "fake_bertserve_app.py"),
        "--port",
        str(port),
        "--max-client-batch-size",
        str(FAKE_BATCH_LIMIT),
    ]
    if api_key:
        command += ["--api-key", api_key]
    if prefix:
        command += ["--prefix", prefix]
    proc, url = _start(command, port, ready_path=(prefix or "") + "/ready")
    return proc, url


@pytest.fixture(scope="module")
def server_url():
    if SERVER not in ("fake", "real"):
        yield SERVER.rstrip("/")
        return
    proc, url = _launch()
    yield url
    _stop(proc)


@pytest.fixture(scope="module")
def secured_server_url():
    if SERVER not in ("fake", "real"):
        pytest.skip("needs a server this test starts with an API key")
    proc, url = _launch(api_key=API_KEY)
    yield url
    _stop(proc)


@pytest.fixture(autouse=True)
def _clean_fake(request):
    if FAKE and "server_url" in request.fixturenames:
        httpx.post(request.getfixturevalue("server_url") + "/_fake/reset")


@pytest.fixture
def fast_backoff():
    """Clients made by `use` start their exponential schedule at 10 ms (Retry-After waits stay real), so retry tests
    take ms: the client's own `backoff` option."""
    return {"backoff": 0.01}


def script(url: str, path: str, *entries: dict) -> None:
    httpx.post(url + "/_fake/faults", json={path: list(entries)}).raise_for_status()


def request_log(url: str, path: str | None = None) -> list[dict]:
    return [r for r in httpx.get(url + "/_fake/log").json() if path is None or r["path"] == path]


@pytest.fixture(params=["sync", "async"])
def use(request, server_url):
    """use(fn, **client_options): fn(client) on a fresh Client, or awaited on a fresh AsyncClient."""

    def run(fn, url: str | None = None, **options):
        url = url or server_url
        if "fast_backoff" in request.fixturenames:
            options = {**request.getfixturevalue("fast_backoff"), **options}
        if request.param == "sync":
            with Client(url, **options) as client:
                return fn(client)

        async def main():
            async with AsyncClient(url, **options) as client:
                return await fn(client)

        return asyncio.run(main())

    run.flavour = request.param
    return run


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


def test_classify_single_and_many(use):
    single = use(lambda c: c.classify(REVIEWS[0]))
    assert len(single) == 1 and isinstance(single[0], Label) and 0 <= single[0].score <= 1
    many = use(lambda c: c.classify(REVIEWS[:3], top_k=2))
    assert len(many) == 3 and all(len(labels) == 2 for labels in many)
    assert all(labels[0].score >= labels[1].score for labels in many)
    assert many[0][0].label == single[0].label


def test_classify_text_pairs(use):
    result = use(lambda c: c.classify([("a man sleeps", "a person rests"), ["it rains", "it is sunny"]]))
    assert len(result) == 2 and all(isinstance(labels[0], Label) for labels in result)


def test_ner_single_many_and_token_level(use):
    text = "Yesterday Alice flew from Paris to Bolivia"
    entities = use(lambda c: c.ner(text))
    assert entities and all(isinstance(e, Entity) and e.entity_group for e in entities)
    for e in entities:
        assert text[e.start : e.end].lower().replace(" ", "") == e.word.lower().replace(" ", "").replace("##", "")
    many = use(lambda c: c.ner([text, "nothing here"]))
    assert len(many) == 2 and same(many[0], entities)
    tokens = use(lambda c: c.ner(text, aggregation="none"))
    assert tokens and all(e.entity and e.index is not None and e.entity_group is None for e in tokens)
    if FAKE:
        assert [(e.label, e.word) for e in entities] == [("PER", "Alice"), ("LOC", "Paris"), ("LOC", "Bolivia")]


def test_qa_single_top_k_and_many(use):
    context = "Alice lives in Paris and works as a carpenter"
    answer = use(lambda c: c.qa("Where does Alice live?", context))
    assert isinstance(answer, Answer) and context[answer.start : answer.end] == answer.answer
    top = use(lambda c: c.qa("Where does Alice live?", context, top_k=3))
    assert isinstance(top, list) and 1 <= len(top) <= 3 and all(isinstance(a, Answer) for a in top)
    items = [("Where does Alice live?", context), {"question": "What is Alice's job?", "context": context}]
    many = use(lambda c: c.qa(items))
    assert len(many) == 2 and same(many[0], answer)
    many_top = use(lambda c: c.qa(items, top_k=2))
    assert all(isinstance(per_item, list) for per_item in many_top)


def test_embed_single_many_and_unnormalised(use):
    one = use(lambda c: c.embed(REVIEWS[0]))
    assert isinstance(one, list) and all(isinstance(x, float) for x in one)
    assert abs(sum(x * x for x in one) - 1) < 1e-6
    many = use(lambda c: c.embed(REVIEWS[:3]))
    assert len(many) == 3 and many[0] == one
    raw = use(lambda c: c.embed(REVIEWS[0], normalize=False))
    assert abs(sum(x * x for x in raw) - 1) > 1e-3


def test_health_ready_info(use):
    assert use(lambda c: c.health()) is True
    assert use(lambda c: c.ready()) is True
    info = use(lambda c: c.info())
    assert isinstance(info, Info) and info.model and info.tasks and info.version
    assert info.client_batch_limit and info.client_batch_limit > 0


@needs_fake
def test_ready_is_false_while_server_answers_503(use, server_url):
    script(server_url, "/ready", {"status": 503, "error": "model loading", "error_type": "unhealthy"})
    assert use(lambda c: c.ready()) is False
    assert len(request_log(server_url, "/ready")) == 1  # probes are not retried


# ---------------------------------------------------------------------------------------------
# Batching: lists longer than max_client_batch_size


def test_long_list_split_and_reassembled_in_order(use, server_url):
    singles = [use(lambda c, t=t: c.classify(t)) for t in REVIEWS]
    batched = use(lambda c: c.classify(REVIEWS))
    assert same(batched, singles)
    if FAKE:
        sizes = [len(json.loads(r["body"])["inputs"]) for r in request_log(server_url, "/classify")[len(REVIEWS) :]]
        assert sizes == [4, 4, 2]
        assert len(request_log(server_url, "/info")) == 1  # the limit is read once per client


def test_explicit_batch_size_skips_info(use, server_url):
    texts = ["Alice", "Bob", "Carol went to Paris"]
    result = use(lambda c: c.ner(texts, aggregation="simple"), batch_size=1)
    assert len(result) == 3
    if FAKE:
        assert len(request_log(server_url, "/ner")) == 3 and not request_log(server_url, "/info")


def test_qa_list_split(use, server_url):
    items = [(f"Who is number {i}?", f"Number {i} is Alice{i}") for i in range(6)]
    answers = use(lambda c: c.qa(items))
    assert len(answers) == 6 and all(isinstance(a, Answer) for a in answers)
    if FAKE:
        assert len(request_log(server_url, "/qa")) == 2


def test_error_of_a_split_list_names_the_callers_item(use):
    """The server numbers the items of the one request it got: for a list split in several, the error says which
    request failed and which of the caller's items it carried, so "inputs[1]" can be traced to item 9."""
    texts = REVIEWS[:9] + ["", "fine"]  # the empty text is item 9: request 3 of 3 carries items [8:11]
    with pytest.raises(ValidationError) as e:
        use(lambda c: c.classify(texts), batch_size=4, max_retries=0)
    err = e.value
    assert err.status_code == 400 and "inputs[1] is empty" in err.message
    assert "request 3 of 3" in err.message and "items [8:11] of the 11" in err.message and "8+i" in str(err)
    assert "the answers of items [0:8] are in .partial" in err.message
    assert same(err.partial, use(lambda c: c.classify(texts[:8]), batch_size=4))  # what requests 1 and 2 answered
    with pytest.raises(ValidationError) as whole:  # a list sent in one request: the server's index is the caller's
        use(lambda c: c.classify(["good", ""]), batch_size=4, max_retries=0)
    assert whole.value.message == "inputs[1] is empty" and whole.value.partial is None


def test_bad_list_items_fail_before_any_request_naming_the_item(use, server_url):
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
    if FAKE:
        assert request_log(server_url) == []


def test_numpy_scalars_as_options_are_sent_as_numbers(use, server_url):
    """top_k=np.int64(2) (a value from numpy code) is sent as the number it holds, not refused by the JSON encoder
    ("Object of type int64 is not JSON serializable"); a numpy array as `inputs` stays a TypeError."""
    np = pytest.importorskip("numpy")
    many = use(lambda c: c.classify(REVIEWS[:2], top_k=np.int64(2), truncate=np.bool_(False)))
    assert len(many) == 2 and all(len(labels) == 2 for labels in many)
    assert len(use(lambda c: c.classify(np.str_(REVIEWS[0]), top_k=np.int32(2)))) == 2
    use(lambda c: c.embed([np.str_("good"), "bad"], dimensions=np.int32(8)))
    use(lambda c: c.ner("Alice met Bob", stride=np.int64(16)))
    answers = use(lambda c: c.qa("who?", "Alice and Bob", top_k=np.int64(2), max_answer_len=np.int16(10)))
    assert isinstance(answers, list) and len(answers) == 2
    if FAKE:
        sent = [json.loads(r["body"]) for r in request_log(server_url) if r["path"] != "/info"]
        assert sent[0] == {"inputs": REVIEWS[:2], "top_k": 2, "truncate": False}
        assert sent[2] == {"inputs": ["good", "bad"], "normalize": True, "truncate": False, "dimensions": 8}
        assert sent[3]["stride"] == 16 and (sent[4]["top_k"], sent[4]["max_answer_len"]) == (2, 10)
    with pytest.raises(TypeError, match="not ndarray"):
        use(lambda c: c.embed(np.array(["good", "bad"])))


def test_a_lone_surrogate_fails_before_any_request_naming_the_text(use, server_url):
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
    if FAKE:
        assert request_log(server_url) == []
    assert use(lambda c: c.ner(["Ålice in Zürich 😀", "plain"]))  # other non-ASCII text is sent as it is


# ---------------------------------------------------------------------------------------------
# Errors: one class per kind; what is and isn't retried


def test_validation_errors_are_not_retried(use, server_url):
    with pytest.raises(ValidationError) as too_long:
        use(lambda c: c.classify("word " * 5000), max_retries=3)
    assert too_long.value.status_code == 422 and too_long.value.message
    if FAKE:
        assert len(request_log(server_url, "/classify")) == 1
    with pytest.raises(ValidationError) as empty:
        use(lambda c: c.classify([]))
    assert empty.value.status_code == 400
    with pytest.raises(ValidationError) as too_large:  # more inputs per request than the server takes
        use(lambda c: c.classify(["x"] * 1000), batch_size=1000)
    assert too_large.value.status_code == 413


def test_truncate_accepts_long_input(use):
    assert use(lambda c: c.classify("word " * 5000, truncate=True))


def test_unauthorized(use, secured_server_url):
    with pytest.raises(UnauthorizedError) as e:
        use(lambda c: c.classify("hello"), url=secured_server_url, api_key="wrong", max_retries=3)
    assert e.value.status_code == 401 and e.value.error_type
    assert use(lambda c: c.classify("hello"), url=secured_server_url, api_key=API_KEY)


@needs_fake
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
def test_each_status_raises_its_class(use, server_url, status, error_class):
    script(server_url, "/ner", {"status": status, "error": f"scripted {status}", "error_type": "kind"})
    with pytest.raises(error_class) as e:
        use(lambda c: c.ner("Alice"), max_retries=0)
    err = e.value
    assert type(err) is error_class and isinstance(err, BertserveError)
    assert (err.status_code, err.message, err.error_type) == (status, f"scripted {status}", "kind")
    assert isinstance(err.response, httpx.Response) and err.response.status_code == status


@needs_fake
def test_429_waits_retry_after(use, server_url):
    script(server_url, "/classify", {"status": 429, "retry_after": "1", "error_type": "overloaded"})
    started = time.monotonic()
    assert use(lambda c: c.classify("good"), max_retries=2)
    assert time.monotonic() - started >= 1.0
    attempts = request_log(server_url, "/classify")
    assert len(attempts) == 2 and attempts[1]["time"] - attempts[0]["time"] >= 1.0


@needs_fake
def test_overloaded_error_carries_retry_after_when_retries_run_out(use, server_url):
    script(server_url, "/classify", {"status": 429, "retry_after": "0"}, {"status": 429, "retry_after": "0"})
    with pytest.raises(OverloadedError) as e:
        use(lambda c: c.classify("good"), max_retries=1)
    assert e.value.retry_after == 0 and len(request_log(server_url, "/classify")) == 2


@needs_fake
def test_retry_after_beyond_cap_is_raised_not_waited(use, server_url):
    script(server_url, "/classify", {"status": 429, "retry_after": "3600"})
    started = time.monotonic()
    with pytest.raises(OverloadedError) as e:
        use(lambda c: c.classify("good"), max_retries=3)
    assert e.value.retry_after == 3600 and time.monotonic() - started < 5


@needs_fake
def test_5xx_retried_then_succeeds_or_raises(use, server_url, fast_backoff):
    script(server_url, "/qa", {"status": 500}, {"status": 503})
    assert isinstance(use(lambda c: c.qa("who?", "Alice"), max_retries=2), Answer)
    assert len(request_log(server_url, "/qa")) == 3
    script(server_url, "/qa", *[{"status": 500, "error": "backend failed"}] * 3)
    with pytest.raises(ServerError, match="backend failed"):
        use(lambda c: c.qa("who?", "Alice"), max_retries=1)
    assert len(request_log(server_url, "/qa")) == 3 + 2


@needs_fake
def test_408_is_retried_like_429_and_5xx(use, server_url, fast_backoff):
    """The server answers 408 when a request's body arrives too slowly, before any work: safe to send again, so
    retried under the same max_retries and Retry-After rules as 429 and 5xx."""
    slow = {"status": 408, "error": "the request body did not arrive within 30 s", "error_type": "timeout"}
    script(server_url, "/embed", slow)
    assert len(use(lambda c: c.embed("good"), max_retries=1)) == 4
    assert len(request_log(server_url, "/embed")) == 2
    script(server_url, "/embed", slow, slow)
    with pytest.raises(BertserveError) as e:
        use(lambda c: c.embed("good"), max_retries=1)
    assert e.value.status_code == 408 and "gave up after 2 attempts" in e.value.message
    assert len(request_log(server_url, "/embed")) == 2 + 2
    script(server_url, "/embed", slow)
    with pytest.raises(BertserveError):
        use(lambda c: c.embed("good"), max_retries=0)
    script(server_url, "/embed", {**slow, "retry_after": "3600"})
    with pytest.raises(BertserveError, match="not retried: the server asks for 3600 s"):
        use(lambda c: c.embed("good"), max_retries=3)
    assert len(request_log(server_url, "/embed")) == 4 + 1 + 1


@needs_fake
def test_timeout_raises_then_retry_recovers(use, server_url, fast_backoff):
    # A scripted fault is taken when its request arrives, so an abandoned slow request that is
    # still sleeping on the server does not eat the next script entry.
    script(server_url, "/classify", {"delay": 2.5})
    with pytest.raises(APITimeoutError):
        use(lambda c: c.classify("good"), timeout=0.3, max_retries=0)
    script(server_url, "/classify", {"delay": 2.5})
    assert use(lambda c: c.classify("good"), timeout=1.0, max_retries=1)  # the retry is answered at once
    assert len(request_log(server_url, "/classify")) == 3


def test_connection_refused(use, fast_backoff):
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(APIConnectionError) as e:
        use(lambda c: c.classify("good"), url=url, max_retries=1)
    assert not isinstance(e.value, APITimeoutError) and e.value.status_code is None
    with pytest.raises(APIConnectionError):
        use(lambda c: c.health(), url=url)


def test_connection_errors_read_the_same_in_sync_and_async(use):
    """No answer at all: the message names the request and the system's reason, the same from both clients (the
    async one's transport says only "All connection attempts failed")."""
    port = _free_port()  # nothing listens there
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


@needs_fake
def test_timeout_says_what_timed_out_and_after_how_long(use, server_url):
    script(server_url, "/classify", {"delay": 2.5})
    with pytest.raises(APITimeoutError) as e:
        use(lambda c: c.classify("good"), timeout=0.3, max_retries=0)
    assert str(e.value) == (
        f"read timeout: no answer within 0.3 s (POST {server_url}/classify); a slow request needs a larger timeout="
    )


NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>"
    "\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)


@needs_fake
def test_a_proxys_html_error_page_is_a_clear_error(use, server_url, fast_backoff):
    """An nginx 502 page: a ServerError, retried, whose message is the page's words, not its HTML; a 200 login
    page is a BertserveError saying it is not JSON, not retried."""
    page = {"status": 502, "body": NGINX_502, "content_type": "text/html"}
    script(server_url, "/classify", page, page)
    with pytest.raises(ServerError) as e:
        use(lambda c: c.classify("good"), max_retries=1)
    err = e.value
    assert err.status_code == 502 and err.error_type is None and len(request_log(server_url, "/classify")) == 2
    assert "<" not in err.message and "'502 Bad Gateway nginx/1.25.3'" in err.message and "text/html" in err.message
    assert err.message.endswith("(gave up after 2 attempts)")
    script(server_url, "/ner", {"status": 200, "body": "<html><body>Please sign in</body></html>"})
    with pytest.raises(BertserveError) as login:
        use(lambda c: c.ner("Alice"), max_retries=3)
    assert login.value.status_code == 200 and "not JSON" in login.value.message
    assert "'Please sign in'" in login.value.message and len(request_log(server_url, "/ner")) == 1


@needs_fake
def test_other_json_error_shapes_give_their_message(use, server_url):
    """FastAPI's own {"detail": [...]} (an app in front of bertserve) and OpenAI's error object (the server's /v1/
    paths): their message, not a dict's repr."""
    detail = '{"detail": [{"loc": ["body", "inputs", 0], "msg": "field required", "type": "missing"}]}'
    openai = '{"error": {"message": "no such model", "type": "not_found", "param": null, "code": null}}'
    script(
        server_url,
        "/classify",
        {"status": 422, "body": detail, "content_type": "application/json"},
        {"status": 404, "body": openai, "content_type": "application/json"},
    )
    with pytest.raises(ValidationError) as e:
        use(lambda c: c.classify("good"))
    assert e.value.message == "inputs.0: field required"
    with pytest.raises(NotFoundError) as e:
        use(lambda c: c.classify("good"))
    assert (e.value.message, e.value.error_type) == ("no such model", "not_found")


@needs_fake
def test_redirect_names_where_it_goes(use, server_url):
    script(server_url, "/classify", {"status": 307, "body": "", "headers": {"Location": "https://bertserve.example/"}})
    with pytest.raises(BertserveError) as e:
        use(lambda c: c.classify("good"), max_retries=3)
    assert e.value.status_code == 307 and "'https://bertserve.example/'" in e.value.message
    assert len(request_log(server_url, "/classify")) == 1


@needs_fake
def test_cut_off_answer_is_a_connection_error_and_retried(use, server_url, fast_backoff):
    """A body shorter than its Content-Length (a connection dropped mid-answer) is APIConnectionError, retried."""
    cut = {
        "status": 200,
        "body": '[{"label": "pos',
        "content_type": "application/json",
        "headers": {"Content-Length": "60"},
    }
    script(server_url, "/classify", cut, cut)
    with pytest.raises(APIConnectionError) as e:
        use(lambda c: c.classify("good"), max_retries=0)
    assert not isinstance(e.value, APITimeoutError)
    assert str(e.value).startswith(f"the connection to the server failed (POST {server_url}/classify): ")
    assert use(lambda c: c.classify("good"), max_retries=1)  # the second cut answer, then a whole one
    assert len(request_log(server_url, "/classify")) == 3


@needs_fake
def test_undecodable_answer_is_a_bertserve_error(use, server_url):
    """A body that says gzip and is not (a broken proxy): BertserveError, not httpx's DecodingError."""
    script(server_url, "/classify", {"status": 200, "body": "not gzip", "headers": {"Content-Encoding": "gzip"}})
    with pytest.raises(BertserveError, match="could not be decoded"):
        use(lambda c: c.classify("good"), max_retries=3)
    assert len(request_log(server_url, "/classify")) == 1


@needs_fake
def test_503_carries_retry_after_and_a_too_long_one_says_why_not_retried(use, server_url):
    script(
        server_url, "/embed", {"status": 503, "retry_after": "3600", "error": "warming up", "error_type": "unavailable"}
    )
    with pytest.raises(ServerError) as e:
        use(lambda c: c.embed("good"), max_retries=3)
    assert e.value.retry_after == 3600 and len(request_log(server_url, "/embed")) == 1
    assert e.value.message == (
        "warming up (not retried: the server asks for 3600 s (Retry-After), more than the 60 s this client waits"
        " (max_retry_after))"
    )


@needs_fake
def test_the_retry_schedule_is_the_clients_to_set(use, server_url):
    """max_retry_after, backoff and max_backoff are options: a Retry-After over the client's own cap is raised at
    once, naming the option; a schedule of 0 s retries at once. Out-of-range values are refused at construction."""
    script(server_url, "/classify", {"status": 429, "retry_after": "2"})
    with pytest.raises(OverloadedError, match=r"more than the 1 s this client waits \(max_retry_after\)"):
        use(lambda c: c.classify("good"), max_retries=3, max_retry_after=1)
    script(server_url, "/classify", {"status": 500}, {"status": 500})
    started = time.monotonic()
    assert use(lambda c: c.classify("good"), max_retries=2, backoff=0, max_backoff=0)
    assert time.monotonic() - started < 0.4  # the default schedule waits 0.5 s, then 1 s
    for option, value in [
        ("backoff", -1),
        ("max_backoff", "8"),
        ("max_retry_after", float("nan")),
        ("max_retries", 1.5),
    ]:
        with pytest.raises(ValueError, match=f"{option} must be"):
            Client(**{option: value})


@needs_fake
def test_failing_info_of_a_list_call_says_how_to_skip_it(use, server_url):
    script(server_url, "/info", {"status": 404, "error": "no route GET /info", "error_type": "not_found"})
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


@pytest.mark.skipif(not FAKE, reason="starts the stand-in server under a path prefix")
def test_base_url_with_a_path_prefix():
    """Behind a proxy at /bertserve/: every call, /info included, goes under the prefix."""
    proc, url = _launch(prefix="/bertserve")
    try:
        with Client(url + "/bertserve/") as client:
            assert len(client.classify(REVIEWS[:6])) == 6 and client.info().model and client.ready()
    finally:
        _stop(proc)


@needs_fake
def test_api_key_sent_as_bearer(use, server_url):
    use(lambda c: c.classify("good"), api_key="abc")
    assert request_log(server_url, "/classify")[-1]["authorization"] == "Bearer abc"


def test_bad_arguments_fail_before_any_request(use):
    with pytest.raises(ValueError):
        use(lambda c: c.ner("Alice", aggregation="bogus"))
    with pytest.raises(TypeError):
        use(lambda c: c.classify(42))
    with pytest.raises(TypeError):
        use(lambda c: c.qa("question without context"))


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
    client = AsyncClient(server_url)
    first = asyncio.run(client.classify("good"))
    assert asyncio.run(client.classify("good")) == first
    assert len(asyncio.run(client.classify(REVIEWS))) == len(REVIEWS)
    asyncio.run(client.close())
    assert client.is_closed

    http = httpx.AsyncClient()
    own = AsyncClient(server_url, http_client=http)
    asyncio.run(own.classify("good"))
    with pytest.raises(RuntimeError, match="one AsyncClient per event loop|made in this loop"):
        asyncio.run(own.classify("good"))


def test_sync_client_shared_by_threads(server_url):
    """httpx.Client is thread-safe, and so is Client: lists split and reassembled in order from 8 threads."""
    from concurrent.futures import ThreadPoolExecutor

    with Client(server_url) as client:
        expected = [client.classify(t) for t in REVIEWS]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: client.classify(REVIEWS[i:] + REVIEWS[:i]), range(8)))
    for i, result in enumerate(results):
        assert same(result, expected[i:] + expected[:i])


def test_async_calls_run_concurrently(server_url):
    async def main():
        async with AsyncClient(server_url) as client:
            return await asyncio.gather(*(client.classify(t) for t in REVIEWS))

    with Client(server_url) as client:
        singles = [client.classify(t) for t in REVIEWS]
    assert same(asyncio.run(main()), singles)
