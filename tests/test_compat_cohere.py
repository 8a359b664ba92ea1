"""Cohere's SDK (v1 and v2 clients), infinity's /embeddings and OpenAI's model list against a real server: rerank with
documents as strings and as {"text"} objects, embed in every embedding type (sentence-transformers'
quantize_embeddings with the ranges of a unit vector), each answer equal to our own route's."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from test_compat_support import compat_models  # noqa: F401 - a fixture
from test_serving_support import Server, minilm_dir

cohere = pytest.importorskip("cohere")
TIMEOUT = 60.0
DOCS = ["Paris is the capital of France.", "Berlin is in Germany.", "Cats purr."]
QUERY = "capital of France"


@pytest.fixture(scope="module")
def server(compat_models):  # noqa: F811
    with Server("--embed-model", f"minilm={minilm_dir()}", "--rerank-model", str(compat_models["reranker"])) as running:
        yield running


def _post(server, path: str, body, status: int = 200):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    return response.json()


def test_cohere_rerank_v1_and_v2(server):
    ours = _post(server, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True})
    v1 = cohere.Client(base_url=server.url, api_key="x", timeout=TIMEOUT)
    answer = v1.rerank(query=QUERY, documents=[{"text": d} for d in DOCS], top_n=2, return_documents=True)
    assert [(r.index, r.relevance_score, r.document.text) for r in answer.results] == [
        (r["index"], r["score"], r["text"]) for r in ours[:2]
    ]
    plain = v1.rerank(query=QUERY, documents=DOCS)
    assert [(r.index, r.relevance_score) for r in plain.results] == [(r["index"], r["score"]) for r in ours]
    # plain-string documents asked back: Cohere's client reads document.text there too
    plain = v1.rerank(query=QUERY, documents=DOCS, top_n=2, return_documents=True)
    assert [(r.index, r.document.text) for r in plain.results] == [(r["index"], r["text"]) for r in ours[:2]]
    v2 = cohere.ClientV2(base_url=server.url, api_key="x", timeout=TIMEOUT)
    answer = v2.rerank(model="reranker", query=QUERY, documents=DOCS, top_n=1)
    assert [(r.index, r.relevance_score) for r in answer.results] == [(ours[0]["index"], ours[0]["score"])]


def test_cohere_embed_in_every_type(server):
    from sentence_transformers.quantization import quantize_embeddings

    texts = ["a cat sat on the mat", "stocks fell sharply", "hello"]
    vectors = np.array(_post(server, "/embed", {"inputs": texts}), dtype=np.float32)
    v1 = cohere.Client(base_url=server.url, api_key="x", timeout=TIMEOUT)
    floats = v1.embed(texts=texts, model="minilm", input_type="search_document")
    np.testing.assert_allclose(floats.embeddings, vectors, atol=1e-6)
    kinds = ["float", "int8", "uint8", "binary", "ubinary"]
    v2 = cohere.ClientV2(base_url=server.url, api_key="x", timeout=TIMEOUT)
    for client in (v1, v2):
        answer = client.embed(texts=texts, model="minilm", input_type="search_query", embedding_types=kinds)
        ranges = np.array([[-1.0] * vectors.shape[1], [1.0] * vectors.shape[1]], dtype=np.float32)
        np.testing.assert_allclose(answer.embeddings.float_, vectors, atol=1e-6)
        for kind in kinds[1:]:
            expected = quantize_embeddings(vectors, precision=kind, ranges=ranges)
            assert np.array_equal(np.array(getattr(answer.embeddings, kind)), expected), kind
    short = v2.embed(
        texts=texts[:1], model="minilm", input_type="classification", embedding_types=["float"], output_dimension=64
    )
    assert len(short.embeddings.float_[0]) == 64


def test_infinity_embeddings_and_openai_models(server):
    openai = pytest.importorskip("openai")
    body = {"input": ["a", "b"], "model": "default/not-specified", "encoding_format": "float", "modality": "text"}
    infinity = _post(server, "/embeddings", body)
    ours = _post(server, "/v1/embeddings", {"input": ["a", "b"], "encoding_format": "float"})
    assert [d["embedding"] for d in infinity["data"]] == [d["embedding"] for d in ours["data"]]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=TIMEOUT)
    assert sorted(m.id for m in client.models.list()) == ["minilm", "reranker"]
    assert client.models.retrieve("minilm").id == "minilm"


@pytest.mark.parametrize(
    "path, body, status, named",
    [
        ("/v1/rerank", {"query": "q", "documents": [{"text": "a", "title": "t"}]}, 422, "documents[0]"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["title"]}, 422, "rank_fields"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "max_chunks_per_doc": 3}, 422, "max_chunks_per_doc"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "bogus": 1}, 422, "bogus"),  # our route's own refusal
        ("/v2/rerank", {"query": "q", "documents": []}, 400, "documents is empty"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, 422, "top_n"),
        ("/v2/rerank", {"query": "q", "documents": [""]}, 400, "documents[0]"),
        ("/v2/embed", {"texts": ["a"], "embedding_types": ["base64"]}, 422, "embedding_types"),
        ("/v2/embed", {"texts": ["a"], "truncate": "START"}, 422, "truncate"),
        ("/v2/embed", {"texts": ["a"], "images": ["data:"]}, 422, "images"),
        ("/v2/embed", {"texts": "a"}, 422, "texts"),
        ("/v1/embed", {"texts": []}, 400, "texts"),
        ("/v1/embed", {"texts": ["a"] * 40}, 413, "limit"),
        ("/embeddings", {"input": "a", "modality": "image"}, 422, "modality"),
        ("/embeddings", {"input": "a", "nope": 1}, 422, "nope"),
    ],
)
def test_bad_bodies_are_json_4xx_naming_the_field(server, path, body, status, named):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert named in (error["message"] if isinstance(error, dict) else error)
    assert httpx.get(server.url + "/ready", timeout=TIMEOUT).status_code == 200
