"""The RAG frameworks' own clients against one real server, each call's answer equal to what our own route answers:
LlamaIndex's `TextEmbeddingsInference`, Haystack's Hugging Face API embedders (TEI and Inference Endpoints, at
`POST /`) and `HuggingFaceTEIRanker` (`/rerank`), LangChain's `HuggingFaceInferenceAPIEmbeddings` (`POST /`) and
`InfinityEmbeddings` (infinity's `/embeddings`), and the `openai` client's model list (`GET /v1/models`). A client
whose package is not installed is skipped, naming it."""

from __future__ import annotations

import asyncio
import os

import httpx
import numpy as np
import pytest
from test_compat_support import compat_models  # noqa: F401 - a fixture
from test_serving_support import REPO, Server, minilm_dir

# Haystack would otherwise try to send usage statistics (there is no network here, and CI should not wait on it).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

TIMEOUT = 60.0
TEXTS = ["a cat sat on the mat", "stocks fell sharply", "hello"]
QUERY = "capital of France"
DOCS = ["Paris is the capital of France.", "Berlin is in Germany.", "Cats purr."]
LONG = "word " * 2000  # past the model's 512 positions: each client's truncate asks for it to be cut


@pytest.fixture(scope="module")
def server(compat_models):  # noqa: F811
    """A server of several tasks, as a RAG stack's often is: its root answers its classifier unless a body names
    feature-extraction, so a client that sends bare `inputs` is pointed at /hf/feature-extraction."""
    with Server(
        "--model",
        str(REPO / "serving" / "demo_model"),
        "--embed-model",
        f"minilm={minilm_dir()}",
        "--rerank-model",
        str(compat_models["reranker"]),
    ) as running:
        yield running


def _post(server, path: str, body):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def _embed(server, texts: list[str], **fields) -> np.ndarray:
    """Our /embed, asked for the same texts in one request as the client asks (a batch's padding moves floats)."""
    return np.array(_post(server, "/embed", {"inputs": texts, **fields}), dtype=np.float64)


def _close(answer, expected: np.ndarray) -> None:
    answer = np.array(answer, dtype=np.float64)
    assert answer.shape == expected.shape
    np.testing.assert_allclose(answer, expected, atol=1e-6, rtol=0)


def test_llama_index_text_embeddings_inference(server):
    tei = pytest.importorskip("llama_index.embeddings.text_embeddings_inference")
    client = tei.TextEmbeddingsInference(base_url=server.url, model_name="minilm", timeout=int(TIMEOUT))
    _close(client.get_text_embedding(TEXTS[0]), _embed(server, TEXTS[:1])[0])
    _close(client.get_text_embedding_batch(TEXTS), _embed(server, TEXTS))
    _close(asyncio.run(client.aget_text_embedding(TEXTS[1])), _embed(server, TEXTS[1:2])[0])
    # truncate_text (on by default) asks the server to cut a long text rather than refuse it
    _close(client.get_text_embedding(LONG), _embed(server, [LONG], truncate=True)[0])
    prompted = tei.TextEmbeddingsInference(
        base_url=server.url, model_name="minilm", query_instruction="query: ", timeout=int(TIMEOUT)
    )
    _close(prompted.get_query_embedding(QUERY), _embed(server, [f"query: {QUERY}"])[0])
    _close(asyncio.run(prompted.aget_query_embedding(QUERY)), _embed(server, [f"query: {QUERY}"])[0])


@pytest.mark.parametrize("api_type", ["text_embeddings_inference", "inference_endpoints"])
def test_haystack_hugging_face_api_embedders(server, api_type):
    pytest.importorskip("haystack")
    embedders = pytest.importorskip("haystack_integrations.components.embedders.huggingface_api")
    from haystack import Document

    params = {"api_type": api_type, "api_params": {"url": server.url}}
    text = embedders.HuggingFaceAPITextEmbedder(**params)  # normalize=False, truncate=True by default
    _close(text.run(text=TEXTS[0])["embedding"], _embed(server, TEXTS[:1], normalize=False, truncate=True)[0])
    answer = asyncio.run(text.run_async(text=LONG))["embedding"]
    _close(answer, _embed(server, [LONG], normalize=False, truncate=True)[0])
    unit = embedders.HuggingFaceAPITextEmbedder(**params, normalize=True, prefix="query: ")
    _close(unit.run(text=QUERY)["embedding"], _embed(server, [f"query: {QUERY}"], normalize=True, truncate=True)[0])
    # without normalize and truncate the body is bare `inputs`, which names no task: the pipeline tag's URL does
    tagged = {"api_type": api_type, "api_params": {"url": server.url + "/hf/feature-extraction"}}
    bare = embedders.HuggingFaceAPITextEmbedder(**tagged, normalize=None, truncate=None)
    _close(bare.run(text=TEXTS[1])["embedding"], _embed(server, TEXTS[1:2])[0])

    documents = embedders.HuggingFaceAPIDocumentEmbedder(**params, batch_size=2, progress_bar=False)
    embedded = documents.run(documents=[Document(content=t) for t in TEXTS])["documents"]
    expected = np.concatenate([_embed(server, TEXTS[:2], normalize=False), _embed(server, TEXTS[2:], normalize=False)])
    _close([d.embedding for d in embedded], expected)
    embedded = asyncio.run(documents.run_async(documents=[Document(content=t) for t in TEXTS[:2]]))["documents"]
    _close([d.embedding for d in embedded], _embed(server, TEXTS[:2], normalize=False))


def test_haystack_tei_ranker(server):
    pytest.importorskip("haystack")
    rankers = pytest.importorskip("haystack_integrations.components.rankers.huggingface_api")
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api.ranker import TruncationDirection

    documents = [Document(content=d) for d in DOCS]
    ours = _post(server, "/rerank", {"query": QUERY, "texts": DOCS})
    expected = [(DOCS[r["index"]], r["score"]) for r in ours]
    assert [score for _, score in expected] == sorted((score for _, score in expected), reverse=True)

    ranker = rankers.HuggingFaceTEIRanker(url=server.url, top_k=2, timeout=int(TIMEOUT))
    ranked = ranker.run(query=QUERY, documents=documents)["documents"]
    assert [(d.content, d.score) for d in ranked] == expected[:2]
    ranked = asyncio.run(ranker.run_async(query=QUERY, documents=documents, top_k=3))["documents"]
    assert [(d.content, d.score) for d in ranked] == expected
    ranked = ranker.run(query=QUERY, documents=documents, truncation_direction=TruncationDirection.RIGHT)["documents"]
    assert [(d.content, d.score) for d in ranked] == expected[:2]
    with pytest.raises(RuntimeError, match="truncation_direction"):  # TEI's "Left" keeps a text's end: not served
        ranker.run(query=QUERY, documents=documents, truncation_direction=TruncationDirection.LEFT)

    raw = rankers.HuggingFaceTEIRanker(url=server.url, raw_scores=True, timeout=int(TIMEOUT), max_retries=1)
    logits = _post(server, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True})
    ranked = raw.run(query=QUERY, documents=documents)["documents"]
    assert [(d.content, d.score) for d in ranked] == [(DOCS[r["index"]], r["score"]) for r in logits]
    assert [d.score for d in ranked] != [score for _, score in expected]  # raw_scores reached the server


def test_langchain_hugging_face_inference_api_embeddings(server):
    embeddings = pytest.importorskip("langchain_community.embeddings")
    # its body is bare `inputs`: at the root of a server with a classifier that is text-classification
    from langchain_core._api.deprecation import suppress_langchain_deprecation_warning

    # deprecated for langchain-huggingface's class, which cannot be installed beside this project's huggingface_hub
    with suppress_langchain_deprecation_warning():
        client = embeddings.HuggingFaceInferenceAPIEmbeddings(
            api_key="x", api_url=server.url + "/hf/feature-extraction"
        )
    _close(client.embed_documents(TEXTS), _embed(server, TEXTS))
    _close(client.embed_query(QUERY), _embed(server, [QUERY])[0])


def test_langchain_infinity_embeddings(server):
    embeddings = pytest.importorskip("langchain_community.embeddings")
    client = embeddings.InfinityEmbeddings(model="minilm", infinity_api_url=server.url)
    _close(client.embed_documents(TEXTS), _embed(server, TEXTS))
    _close(client.embed_query(QUERY), _embed(server, [QUERY])[0])
    _close(asyncio.run(client.aembed_documents(TEXTS)), _embed(server, TEXTS))
    _close(asyncio.run(client.aembed_query(QUERY)), _embed(server, [QUERY])[0])


def test_openai_models_list_and_retrieve(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=TIMEOUT, max_retries=0)
    models = list(client.models.list())
    assert sorted(m.id for m in models) == ["demo_model", "minilm", "reranker"]
    assert {m.object for m in models} == {"model"}
    assert client.models.retrieve("reranker").id == "reranker"
    with pytest.raises(openai.NotFoundError, match="minilm"):  # the 404 names the served models
        client.models.retrieve("gpt-4o")
