"""The SDK against the real bertserve server (`python -m serving` on a tiny multi-task checkpoint):
every method, sync and async, gives what the raw HTTP API gives, and the real server's error
answers map to the SDK's exception classes. (tests/test_client.py covers retries and scripted
faults against a stand-in server.)"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from test_serving_support import Server, build_checkpoint

from bertserve_client import AsyncClient, Client, UnauthorizedError, ValidationError

KEY = "s3cret"
HEADERS = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["A gripping, beautifully shot film.", "Alice moved from Paris to Berlin in 2019.", "dull"]
CONTEXT = "Alice lives in Paris. She works at the Louvre as a restorer of old paintings."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "multi")
    with Server("--model", str(checkpoint), "--api-key", KEY, "--max-client-batch-size", "2") as running:
        yield running


def raw(server, path: str, body: dict):
    response = httpx.post(server.url + path, json=body, headers=HEADERS, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def dumped(result):
    if isinstance(result, list):
        return [dumped(r) for r in result]
    return result.model_dump(exclude_none=True)


def close(a, b) -> bool:
    """Equal answers, scores up to float noise (batched vs single forward passes)."""
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 if k == "score" else a[k] == b[k] for k in a)
    return a == b


def test_every_sync_method_matches_the_http_api(server):
    with Client(server.url, api_key=KEY) as client:
        assert client.health() and client.ready()
        info = client.info()
        assert set(info.tasks) == {"classify", "ner", "qa", "embed"} and info.max_client_batch_size == 2
        assert close(dumped(client.classify(TEXTS[0])), raw(server, "/classify", {"inputs": TEXTS[0]}))
        # three inputs with a server limit of two: split into two requests, reassembled in order
        assert close(
            dumped(client.classify(TEXTS, top_k=2)),
            raw(server, "/classify", {"inputs": TEXTS[:2], "top_k": 2})
            + raw(server, "/classify", {"inputs": TEXTS[2:], "top_k": 2}),
        )
        assert close(
            dumped(client.classify([["a man eats", "someone eats"]])),
            raw(server, "/classify", {"inputs": [["a man eats", "someone eats"]]}),
        )
        assert client.embed(TEXTS[0]) == raw(server, "/embed", {"inputs": TEXTS[0]})[0]
        vectors = client.embed(TEXTS)  # three inputs, a limit of two: two requests, in order
        assert vectors == raw(server, "/embed", {"inputs": TEXTS[:2]}) + raw(server, "/embed", {"inputs": TEXTS[2:]})
        for aggregation in ("simple", "none"):
            assert close(
                dumped(client.ner(TEXTS[1], aggregation=aggregation)),
                raw(server, "/ner", {"inputs": TEXTS[1], "aggregation": aggregation}),
            )
        answer = client.qa("Where does Alice live?", CONTEXT)
        assert close(dumped(answer), raw(server, "/qa", {"question": "Where does Alice live?", "context": CONTEXT}))
        assert CONTEXT[answer.start : answer.end] == answer.answer
        many = client.qa([("Where does Alice live?", CONTEXT), ("Where does she work?", CONTEXT)], top_k=2)
        assert len(many) == 2 and all(len(m) == 2 for m in many)


def test_every_async_method_matches_the_sync_client(server):
    async def run():
        async with AsyncClient(server.url, api_key=KEY) as client:
            assert await client.health() and await client.ready()
            return (
                await client.info(),
                await client.classify(TEXTS),
                await client.ner(TEXTS),
                await client.qa("Where does Alice live?", CONTEXT),
                await client.embed(TEXTS),
            )

    info, labels, entities, answer, vectors = asyncio.run(run())
    with Client(server.url, api_key=KEY) as client:
        assert info == client.info()
        assert close(dumped(labels), dumped(client.classify(TEXTS)))
        assert close(dumped(entities), dumped(client.ner(TEXTS)))
        assert close(dumped(answer), dumped(client.qa("Where does Alice live?", CONTEXT)))
        assert np.abs(np.asarray(vectors) - np.asarray(client.embed(TEXTS))).max() < 1e-5


def test_numpy_scalars_as_options_give_what_plain_numbers_give(server):
    """Options computed with numpy (np.int64, np.int32, np.bool_) reach the real server as the numbers they hold."""
    with Client(server.url, api_key=KEY) as client:
        assert client.embed(TEXTS, dimensions=np.int32(8), normalize=np.bool_(True)) == raw(
            server, "/embed", {"inputs": TEXTS[:2], "dimensions": 8}
        ) + raw(server, "/embed", {"inputs": TEXTS[2:], "dimensions": 8})
        assert close(
            dumped(client.classify(TEXTS[0], top_k=np.int64(2))),
            raw(server, "/classify", {"inputs": TEXTS[0], "top_k": 2}),
        )


def test_the_real_servers_errors_map_to_sdk_exceptions(server):
    with Client(server.url, api_key="wrong", max_retries=0) as client:
        with pytest.raises(UnauthorizedError) as e:
            client.classify("hello")
        assert e.value.status_code == 401 and e.value.error_type == "unauthorized"
    with Client(server.url, api_key=KEY, max_retries=0) as client:
        with pytest.raises(ValidationError) as e:
            client.classify("word " * 2000)  # longer than the model accepts, no truncate
        assert e.value.status_code == 422 and "512" in e.value.message
        assert client.classify("word " * 2000, truncate=True)[0].label in {"negative", "positive"}
        with pytest.raises(ValidationError) as e:
            client.classify([])
        assert e.value.status_code == 400


def test_a_split_lists_error_names_the_callers_item(server):
    """The real server numbers the items of the request it got ("inputs[1]"); with a limit of two per request,
    the SDK's error says which request that was and which of the caller's items it carried, in both clients."""
    texts = ["good", "bad", "fine", ""]  # the empty one is item 3: request 2 of 2, items [2:4]

    async def run_async():
        async with AsyncClient(server.url, api_key=KEY, max_retries=0) as client:
            with pytest.raises(ValidationError) as e:
                await client.ner(texts)
            return e.value

    with Client(server.url, api_key=KEY, max_retries=0) as client:
        with pytest.raises(ValidationError) as e:
            client.ner(texts)
    for err in (e.value, asyncio.run(run_async())):
        assert err.status_code == 400 and err.error_type == "empty"
        assert err.message == (
            "inputs[1] is empty (request 2 of 2, carrying items [2:4] of the 4 given: the server's index i is item 2+i)"
            " (the answers of items [0:2] are in .partial)"
        )
        assert len(err.partial) == 2 and all(isinstance(entities, list) for entities in err.partial)  # items 0 and 1
