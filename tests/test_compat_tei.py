"""text-embeddings-inference's routes as TEI documents them, against a real server: /predict (single, pair, batch,
raw_scores), /similarity, /tokenize, /decode, TEI's fields on /embed (prompt_name from the model's
sentence-transformers prompts, truncation_direction) and /rerank, infinity's /rerank body beside TEI's, and /info with
TEI's fields (huggingface_hub's get_endpoint_info). Each answer equals what our own route answers; a body our route
takes is answered as before, and one that is neither gets our route's own error."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
from test_compat_support import compat_models  # noqa: F401 - a fixture
from test_serving_support import REPO, Server, minilm_dir

DEMO = str(REPO / "serving" / "demo_model")
TIMEOUT = 60.0
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def prompted_minilm(tmp_path_factory):
    """all-MiniLM-L6-v2 with prompts in its config_sentence_transformers.json (files linked, not copied)."""
    source = minilm_dir()
    directory = tmp_path_factory.mktemp("prompted") / "minilm"
    directory.mkdir()
    for path in source.rglob("*"):
        if path.is_file() and path.name != "config_sentence_transformers.json":
            target = directory / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    (directory / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return directory


@pytest.fixture(scope="module")
def server(compat_models, prompted_minilm):  # noqa: F811
    with Server(
        "--model", DEMO, "--embed-model", str(prompted_minilm), "--rerank-model", str(compat_models["reranker"])
    ) as running:
        yield running


def _post(server, path: str, body, status: int = 200):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    return response.json()


def test_predict_single_pair_and_batch(server):
    everything = {"top_k": None}
    single = _post(server, "/predict", {"inputs": "a fine film"})
    assert single == _post(server, "/classify", {"inputs": "a fine film", **everything})
    assert [p["score"] for p in single] == sorted((p["score"] for p in single), reverse=True)
    assert _post(server, "/predict", {"inputs": ["a fine film"]}) == single
    pair = _post(server, "/predict", {"inputs": ["A man eats.", "Someone eats."]})
    assert pair == _post(server, "/classify", {"inputs": [["A man eats.", "Someone eats."]], **everything})[0]
    batch = _post(server, "/predict", {"inputs": [["a fine film"], ["A man eats.", "Someone eats."]]})
    assert [[p["label"] for p in answer] for answer in batch] == [[p["label"] for p in a] for a in (single, pair)]
    np.testing.assert_allclose(
        [[p["score"] for p in answer] for answer in batch], [[p["score"] for p in a] for a in (single, pair)], atol=1e-6
    )  # batched beside each other: equal to float32's rounding
    raw = _post(server, "/predict", {"inputs": "a fine film", "raw_scores": True, "truncation_direction": "Right"})
    assert raw == _post(server, "/classify", {"inputs": "a fine film", "function_to_apply": "none", **everything})


def test_similarity_is_the_cosine_of_the_embeddings(server):
    body = {"inputs": {"source_sentence": "a cat sat", "sentences": ["a cat sat", "stocks fell sharply"]}}
    scores = _post(server, "/similarity", body)
    vectors = np.array(_post(server, "/embed", {"inputs": ["a cat sat", "a cat sat", "stocks fell sharply"]}))
    np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], atol=1e-6)
    prompted = _post(server, "/similarity", {**body, "parameters": {"prompt_name": "query", "truncate": None}})
    vectors = np.array(
        _post(server, "/embed", {"inputs": ["query: a cat sat", "query: a cat sat", "query: stocks fell sharply"]})
    )
    np.testing.assert_allclose(prompted, vectors[1:] @ vectors[0], atol=1e-6)


def test_tokenize_and_decode(server):
    from bert.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_dir(DEMO)
    text = "Hello, Wolfgang!"
    [tokens] = _post(server, "/tokenize", {"inputs": text})
    assert [t["id"] for t in tokens] == tokenizer.backend.encode(text).ids
    assert tokens[0] == {"id": tokenizer.cls_token_id, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [t["text"] for t in tokens[1:-1]] == [text[t["start"] : t["stop"]] for t in tokens[1:-1]]
    bare = _post(server, "/tokenize", {"inputs": [text, "b"], "add_special_tokens": False})
    assert [t["id"] for t in bare[0]] == [t["id"] for t in tokens[1:-1]] and len(bare) == 2
    ids = [t["id"] for t in tokens]
    assert _post(server, "/decode", {"ids": ids}) == [tokenizer.decode(ids)]
    assert _post(server, "/decode", {"ids": [ids, ids[:2]], "skip_special_tokens": False}) == [
        tokenizer.decode(ids, skip_special_tokens=False),
        tokenizer.decode(ids[:2], skip_special_tokens=False),
    ]


def test_embed_with_teis_fields(server):
    plain = _post(server, "/embed", {"inputs": ["query: where is Paris?"]})
    prompted = _post(
        server,
        "/embed",
        {"inputs": ["where is Paris?"], "prompt_name": "query", "truncation_direction": "right", "truncate": None},
    )
    np.testing.assert_allclose(prompted, plain, atol=1e-6)
    assert "passage" in _post(server, "/embed", {"inputs": "a", "prompt_name": "nope"}, 422)["error"]
    assert (
        "truncation_direction" in _post(server, "/embed", {"inputs": "a", "truncation_direction": "up"}, 422)["error"]
    )
    assert _post(server, "/embed", {"inputs": ["a"], "truncate": True, "truncation_direction": "left"}) == _post(
        server, "/embed", {"inputs": ["a"]}
    )


def test_embed_left_truncation_is_sentence_transformers_with_its_tokenizer_cutting_left(server, prompted_minilm):
    """TEI's truncation_direction "left": a long text's start is cut, its last tokens kept."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    text = "Paris is the capital of France. " * 60 + "Cats purr when they are content. " * 60
    model = SentenceTransformer(str(prompted_minilm), device="cpu")
    for side in ("left", "right"):
        model.tokenizer.truncation_side = side
        expected = model.encode([text], normalize_embeddings=True)
        answer = _post(server, "/embed", {"inputs": [text], "truncate": True, "truncation_direction": side})
        np.testing.assert_allclose(answer, expected, atol=1e-5)
    left, right = (
        _post(server, "/embed", {"inputs": [text], "truncate": True, "truncation_direction": side})
        for side in ("left", "right")
    )
    assert np.abs(np.array(left) - np.array(right)).max() > 1e-2  # the two ends of the text


def test_rerank_takes_teis_and_infinitys_bodies(server):
    docs = ["Paris is the capital of France.", "Berlin is in Germany.", "Cats purr."]
    tei = _post(server, "/rerank", {"query": "capital of France", "texts": docs, "return_text": True})
    same = _post(
        server,
        "/rerank",
        {
            "query": "capital of France",
            "texts": docs,
            "return_text": True,
            "truncation_direction": "right",
            "truncate": None,
        },
    )
    assert same == tei
    infinity = _post(
        server,
        "/rerank",
        {
            "query": "capital of France",
            "documents": docs,
            "return_documents": True,
            "top_n": 2,
            "model": "default/not-specified",
        },
    )
    assert infinity["object"] == "rerank" and infinity["usage"]["total_tokens"] > 0
    assert [(r["index"], r["relevance_score"], r["document"]) for r in infinity["results"]] == [
        (r["index"], r["score"], r["text"]) for r in tei[:2]
    ]
    raw = _post(server, "/rerank", {"query": "capital of France", "documents": docs, "raw_scores": True})
    logits = _post(server, "/rerank", {"query": "capital of France", "texts": docs, "raw_scores": True})
    assert [r["relevance_score"] for r in raw["results"]] == [r["score"] for r in logits]
    assert all(r["document"] is None for r in raw["results"])


def test_info_has_teis_fields_and_get_endpoint_info_reads_them(server):
    hub = pytest.importorskip("huggingface_hub")
    info = hub.InferenceClient(model=server.url, provider="hf-inference").get_endpoint_info()
    ours = httpx.get(server.url + "/info", timeout=TIMEOUT).json()
    assert info == ours
    assert {"model", "tasks", "backend", "max_input_length", "models"} <= set(info)  # ours, as before
    assert info["model_id"] == info["model"] and info["model_dtype"] == "float32" and info["auto_truncate"] is False
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert {"model_sha", "tokenization_workers", "max_client_batch_size", "max_batch_tokens"} <= set(info)


@pytest.mark.parametrize(
    "path, body, status, named",
    [
        ("/embed", {"inputs": "a", "bogus": 1}, 422, "bogus: Extra inputs are not permitted"),  # our route's error
        ("/embed", {"inputs": 3}, 422, "inputs"),
        ("/rerank", {"query": "q"}, 422, "texts: Field required"),
        ("/rerank", {"query": "q", "documents": "x"}, 422, "documents"),
        ("/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, "top_n"),
        ("/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["x"]}, 422, "rank_fields"),
        ("/rerank", {"query": "q", "documents": []}, 400, "documents is empty"),
        ("/rerank", {"query": "q", "texts": ["a"], "truncation_direction": "left"}, 422, "truncation_direction"),
        ("/predict", {"inputs": ["a", "b", "c"]}, 422, "inputs"),
        ("/predict", {"inputs": [["a", "b", "c"]]}, 422, "inputs[0]"),
        ("/predict", {"inputs": []}, 400, "inputs"),
        ("/predict", {"inputs": "a", "raw_scores": "yes"}, 422, "raw_scores"),
        ("/predict", {"inputs": "a", "top_k": 1}, 422, "top_k"),
        ("/predict", {"inputs": ["x"] * 0 + [[str(i)] for i in range(40)]}, 413, "limit"),
        ("/similarity", {"inputs": {"source_sentence": "a"}}, 422, "inputs"),
        (
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"x": 1}},
            422,
            "parameters.x",
        ),
        ("/tokenize", {"inputs": 5}, 422, "inputs"),
        ("/tokenize", {"inputs": []}, 400, "inputs"),
        ("/tokenize", {"inputs": "a", "prompt_name": "nope"}, 422, "prompt_name"),
        ("/decode", {"ids": [10**9]}, 422, "ids[0]"),
        ("/decode", {"ids": [[1], "x"]}, 422, "ids"),
        ("/decode", {"ids": []}, 400, "ids"),
        ("/decode", {"ids": [1, True]}, 422, "ids[1]"),
        ("/predict", "just a string", 422, "body"),
    ],
)
def test_bad_bodies_are_json_4xx_naming_the_field(server, path, body, status, named):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "error_type"} and named in response.json()["error"]
    assert httpx.get(server.url + "/ready", timeout=TIMEOUT).status_code == 200


def test_decode_runs_off_the_event_loop():
    """/decode checks and decodes its ids in a worker thread, as /tokenize encodes: a body of many ids never holds
    the event loop (in the thread that decodes there is no running loop)."""
    from fastapi.testclient import TestClient

    from serving.app import create_app
    from serving.settings import Settings

    with TestClient(create_app(Settings(model=DEMO))) as client:
        deadline = time.monotonic() + TIMEOUT
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        engine = client.app.state.engine
        tokenizer = engine.unit(engine.tasks[0]).tokenizer
        decode, on_loop = tokenizer.decode, []

        def watched(*args, **kwargs):
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:
                on_loop.append(False)
            return decode(*args, **kwargs)

        tokenizer.decode = watched
        try:
            ids = [[101, 7592, 2088, 102]] * 8
            answer = client.post("/decode", json={"ids": ids})
        finally:
            del tokenizer.decode
    assert answer.status_code == 200, answer.text
    assert answer.json() == [decode(ids[0])] * 8
    assert on_loop == [False] * 8
