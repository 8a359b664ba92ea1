"""Long inputs, no silent loss (issue 27, bars 1, 2 and 4), against one real server holding three models with
64-token windows (--max-input-length 64), so a CoNLL-2003 document of 400-2,000 tokens is 10-60 windows:

- /ner on whole CoNLL-2003 documents equals transformers' token-classification pipeline with the same `stride` and
  aggregation "first" (entity groups and spans equal, scores to 1e-4), and no entity comes out twice;
- /embed and /v1/embeddings with "chunking": "mean" equal the token-weighted mean of transformers' vectors of the
  same windows, computed here; /rerank and /v1/rerank score a long document as CrossEncoder.predict's best window;
- `dimensions` is the renormalised prefix, and the openai client's `dimensions=` works;
- every request's windows are bounded before any work (413 beyond), contradictions and refusals are JSON 4xx.

A few documents by default; BERTSERVE_TEST_FULL=1 compares 200.
"""

from __future__ import annotations

import collections
import os

import httpx
import numpy as np
import pytest
from test_serving_support import Server, build_checkpoint, minilm_dir

from bert.tasks.ner import read_conll
from serving.errors import error_message

WINDOW = 64  # tokens per model input: the server's --max-input-length and the pipeline's model_max_length
FULL = os.environ.get("BERTSERVE_TEST_FULL") == "1"
QUERY = "where is the eiffel tower?"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import torch

    root = tmp_path_factory.mktemp("long-inputs")
    ner = build_checkpoint(root / "ner", task="ner")
    cross_encoder = root / "cross-encoder"
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=1
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30)  # random heads give near-equal scores: spread them so the max is decisive
    model.save_pretrained(cross_encoder)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir())).save_pretrained(cross_encoder)
    return {"ner": ner, "rerank": cross_encoder, "embed": minilm_dir()}


@pytest.fixture(scope="module")
def server(models):
    args = ["--ner-model", str(models["ner"]), "--embed-model", str(models["embed"])]
    args += ["--rerank-model", str(models["rerank"]), "--max-input-length", str(WINDOW), "--api-key", "sk-test"]
    with Server(*args) as running:
        yield running


def post(server, path, body, status=200):
    response = httpx.post(server.url + path, json=body, headers={"authorization": "Bearer sk-test"}, timeout=120)
    assert response.status_code == status, (path, response.text)
    if status != 200:
        assert set(response.json()) == {"error", "error_type"}
        body = response.json()
        if path.startswith("/v1/"):  # OpenAI's error object there, so that OpenAI's clients show the message
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
            assert body["error"]["type"] == body["error_type"], body
        return {"error": error_message(body), "error_type": body["error_type"]}
    return response.json()


@pytest.fixture(scope="module")
def documents(data_dir) -> list[str]:
    """CoNLL-2003 documents (valid, then train) whose sentences, joined, are 400-2,000 tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    wanted = 200 if FULL else 3
    found = []
    for part in ("valid", "train"):
        sentences = collections.defaultdict(list)
        for sentence in read_conll(data_dir / "conll2003" / f"{part}.txt"):
            sentences[sentence.document].append(" ".join(sentence.words))
        for text in ("\n".join(s) for s in sentences.values()):
            if 400 <= len(tokenizer.encode(text).ids) <= 2000:
                found.append(text)
            if len(found) == wanted:
                return found
    return found


# ---- bar 1: /ner equals the token-classification pipeline with a stride -------------------------------------
def test_ner_windows_equal_the_pipeline_with_stride(server, models, documents):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(models["ner"]), model_max_length=WINDOW)
    model = transformers.AutoModelForTokenClassification.from_pretrained(str(models["ner"])).eval()
    pipes = {
        stride: transformers.pipeline(
            "token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="first", stride=stride
        )
        for stride in (16, 31)  # 31: the default for 64-token windows (at most half the 62 text tokens)
    }
    compared = entities = worst = 0
    for number, text in enumerate(documents):
        stride = 31 if number % 2 else 16
        body = {"inputs": text, "aggregation": "first"} | ({} if number % 2 else {"stride": stride})
        ours = post(server, "/ner", body)
        theirs = pipes[stride](text)
        windows = len(tokenizer(text, truncation=True, stride=stride, return_overflowing_tokens=True)["input_ids"])
        assert windows >= 8, windows  # the comparison is about windows
        assert [(e["entity_group"], e["start"], e["end"]) for e in ours] == [
            (e["entity_group"], e["start"], e["end"]) for e in theirs
        ], number
        error = max((abs(a["score"] - float(b["score"])) for a, b in zip(ours, theirs)), default=0.0)
        assert error <= 1e-4, (number, error)
        assert all(e["word"] == text[e["start"] : e["end"]] for e in ours)
        assert all(a["end"] <= b["start"] for a, b in zip(ours, ours[1:])), "an entity came out twice"
        compared, entities, worst = compared + 1, entities + len(ours), max(worst, error)
    print(f"bar 1: {compared} CoNLL-2003 documents, {entities} entities equal the pipeline's, max |score| {worst:.1e}")
    assert compared == (200 if FULL else 3)


def test_ner_merges_an_entity_cut_by_a_window_edge_once(server):
    """An entity whose tokens straddle two windows comes out whole, once (the longer of the two overlapping
    candidates wins)."""
    ours = post(server, "/ner", {"inputs": "Angela Merkel visited Paris . " * 40, "stride": 20})
    assert all(a["end"] <= b["start"] for a, b in zip(ours, ours[1:]))
    assert len(ours) >= 40


# ---- bar 2: /embed chunking and /rerank MaxP ---------------------------------------------------------------
def _whole_word_windows(encoding, capacity: int, stride: int) -> list[tuple[int, int]]:
    """Windows as docs/serving.md states them: the most whole words that fit, the next starting at the word
    that holds the token `stride` before the previous window's end."""
    words = encoding.word_ids()
    first_of = {}
    for position, word in enumerate(words):
        first_of.setdefault(word, position)
    windows, start = [], 0
    while True:
        stop = min(start + capacity, len(words))
        while stop < len(words) and words[stop] == words[stop - 1]:
            stop -= 1
        windows.append((start, stop))
        if stop == len(words):
            return windows
        start = first_of[words[stop - stride]] if stride else stop


def _window_texts(text: str, encoding, windows) -> list[str]:
    offsets = encoding["offset_mapping"]
    return [text[offsets[a][0] : offsets[b - 1][1]] for a, b in windows]


def test_embed_chunking_mean_equals_the_weighted_mean_of_window_vectors(server, documents):
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    model = transformers.AutoModel.from_pretrained(str(minilm_dir())).eval()
    texts = [documents[0][:3000], "A short text fits one window."]
    expected = []
    for text in texts:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        windows = _whole_word_windows(encoding, WINDOW - 2, 0)
        vectors, weights = [], []
        for (a, b), piece in zip(windows, _window_texts(text, encoding, windows)):
            ids = [tokenizer.cls_token_id, *encoding["input_ids"][a:b], tokenizer.sep_token_id]
            assert tokenizer(piece)["input_ids"] == ids  # whole words: each window is a text of its own
            with torch.no_grad():
                states = model(torch.tensor([ids])).last_hidden_state[0]
            vector = states.mean(0).numpy()  # mean pooling; one unpadded sequence
            vectors.append(vector / np.linalg.norm(vector))
            weights.append(b - a)
        mean = np.average(np.stack(vectors), axis=0, weights=weights)
        expected.append(mean / np.linalg.norm(mean))
        assert len(windows) >= (5 if text is texts[0] else 1)
    expected = np.stack(expected)
    ours = np.asarray(post(server, "/embed", {"inputs": texts, "chunking": "mean"}))
    print(f"bar 2: /embed chunking mean, max |bertserve - transformers| {np.abs(ours - expected).max():.1e}")
    assert np.abs(ours - expected).max() <= 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    openai = post(server, "/v1/embeddings", {"input": texts, "chunking": "mean", "model": "m"})
    assert np.abs(np.asarray([d["embedding"] for d in openai["data"]]) - expected).max() <= 1e-5
    post(server, "/embed", {"inputs": texts[0]}, 422)  # without chunking a long text is refused, never cut
    raw = np.asarray(post(server, "/embed", {"inputs": texts[1], "chunking": "mean", "normalize": False})[0])
    assert abs(np.linalg.norm(raw) - 1) > 1e-3  # one window, not normalised: the pooled vector as it is


def test_rerank_scores_a_long_document_by_its_best_window(server, models, documents):
    import transformers
    from sentence_transformers import CrossEncoder

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(models["rerank"]))
    cross_encoder = CrossEncoder(str(models["rerank"]), device="cpu")
    query_tokens = len(tokenizer(QUERY, add_special_tokens=False)["input_ids"])
    capacity = WINDOW - 3 - query_tokens
    stride = min(128, capacity // 2)
    documents = [documents[1][:2500], "The Eiffel Tower is in Paris.", documents[2][:1200]]
    expected, counts = [], []
    for document in documents:
        encoding = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
        windows = _whole_word_windows(encoding, capacity, stride)
        pieces = _window_texts(document, encoding, windows)
        for (a, b), piece in zip(windows, pieces):
            assert tokenizer(piece, add_special_tokens=False)["input_ids"] == encoding["input_ids"][a:b]
        expected.append(float(cross_encoder.predict([(QUERY, piece) for piece in pieces]).max()))
        counts.append(len(windows))
    assert counts[0] >= 10 and counts[1] == 1, counts
    tei = post(server, "/rerank", {"query": QUERY, "texts": documents})
    ours = [r["score"] for r in sorted(tei, key=lambda r: r["index"])]
    v1 = post(server, "/v1/rerank", {"query": QUERY, "documents": documents})
    ours_v1 = [r["relevance_score"] for r in sorted(v1["results"], key=lambda r: r["index"])]
    print(
        f"bar 2: /rerank MaxP over {counts} windows, max |bertserve - CrossEncoder| "
        f"{np.abs(np.asarray(ours) - expected).max():.1e}"
    )
    assert np.abs(np.asarray(ours) - expected).max() <= 1e-5
    assert np.abs(np.asarray(ours_v1) - expected).max() <= 1e-5
    cut = post(server, "/rerank", {"query": QUERY, "texts": documents[:1], "truncate": True})[0]["score"]
    assert cut != ours[0]  # truncate: the document's start only, as asked


# ---- bar 4: dimensions -------------------------------------------------------------------------------------
def test_dimensions_are_the_renormalised_prefix(server):
    texts = ["The Eiffel Tower is in Paris.", "Bananas are yellow."]
    full = np.asarray(post(server, "/embed", {"inputs": texts, "normalize": False}))
    prefix = full[:, :128] / np.linalg.norm(full[:, :128], axis=1, keepdims=True)
    short = np.asarray(post(server, "/embed", {"inputs": texts, "dimensions": 128}))
    assert short.shape == (2, 128) and np.abs(short - prefix).max() <= 1e-6
    assert np.asarray(post(server, "/embed", {"inputs": texts, "dimensions": 384})).shape == (2, 384)
    raw = np.asarray(post(server, "/embed", {"inputs": texts, "dimensions": 8, "normalize": False}))
    assert np.abs(raw - full[:, :8]).max() <= 1e-6  # normalize false: the prefix as it is
    for body in ({"inputs": texts, "dimensions": 385}, {"inputs": texts, "dimensions": 0}):
        post(server, "/embed", body, 422)

    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    for wire in ({}, {"encoding_format": "float"}):  # the client's default: base64 on the wire, decoded by it
        result = client.embeddings.create(model="m", input=texts, dimensions=128, **wire)
        vectors = np.asarray([d.embedding for d in sorted(result.data, key=lambda d: d.index)])
        assert vectors.shape == (2, 128) and np.abs(vectors - prefix).max() <= 1e-6
    # OpenAI's client shows the server's reason, which it reads from OpenAI's error object
    with pytest.raises(openai.UnprocessableEntityError, match="dimensions: 385 is more than this model's 384"):
        client.embeddings.create(model="m", input=texts, dimensions=385)


# ---- cost bounded before work, refusals as JSON ----------------------------------------------------------------
def test_windows_are_bounded_and_contradictions_refused(server):
    huge = "word " * 20_000  # more windows of 64 tokens than --max-request-sequences (256) allows
    for path, body in [
        ("/ner", {"inputs": huge}),
        ("/ner", {"inputs": ["short", huge[: len(huge) // 2]], "stride": 31}),
        ("/embed", {"inputs": huge, "chunking": "mean"}),
        ("/v1/embeddings", {"input": huge, "chunking": "mean"}),
        ("/rerank", {"query": QUERY, "texts": [huge]}),
        ("/v1/rerank", {"query": QUERY, "documents": ["a", huge]}),
    ]:
        error = post(server, path, body, 413)
        assert error["error_type"] == "payload_too_large" and "max_request_sequences" in error["error"], error
    long = "word " * 300
    for path, body, mention in [
        ("/ner", {"inputs": long, "stride": 32}, "at most 31"),
        ("/ner", {"inputs": long, "stride": 8, "truncate": True}, "stride"),
        ("/ner", {"inputs": long, "aggregation": "none"}, "aggregation"),
        ("/embed", {"inputs": long, "chunking": "mean", "truncate": True}, "chunking"),
        ("/embed", {"inputs": long, "chunking": "max"}, "chunking"),
        ("/rerank", {"query": "why " * 70, "texts": ["a"]}, "the query has 73 tokens; the model accepts at most 64"),
        ("/v1/embeddings", {"input": long}, '"truncate": true'),
    ]:
        error = post(server, path, body, 422)
        assert mention in error["error"], error
    assert len(post(server, "/ner", {"inputs": long, "aggregation": "none", "truncate": True})) > 0
    # the advice /v1/embeddings gives is taken there: truncate cuts the text to the window, as /embed does
    cut = post(server, "/v1/embeddings", {"input": long, "truncate": True, "encoding_format": "float"})
    plain = post(server, "/embed", {"inputs": long, "truncate": True})
    assert np.abs(np.asarray(cut["data"][0]["embedding"]) - np.asarray(plain[0])).max() <= 1e-6


def test_the_sdk_sends_the_new_fields(server):
    from bertserve_client import Client

    long = "Angela Merkel visited Paris . " * 30
    with Client(server.url, api_key="sk-test", max_retries=0) as client:
        entities = client.ner(long, stride=20)
        vectors = client.embed(["Bananas are yellow.", long], chunking="mean", dimensions=64)
    assert [(e.start, e.end) for e in entities] == [
        (e["start"], e["end"]) for e in post(server, "/ner", {"inputs": long, "stride": 20})
    ]
    expected = post(server, "/embed", {"inputs": ["Bananas are yellow.", long], "chunking": "mean", "dimensions": 64})
    # The same answer up to float rounding: the token-budget batcher may group the long text's windows differently
    # for the two requests (a busy machine changes when a batch closes), and a window's sums depend on its batch.
    assert np.abs(np.asarray(vectors) - np.asarray(expected)).max() < 1e-6 and len(vectors[1]) == 64


def test_openai_shaped_answers_name_the_model_that_ran(server):
    """A server of several models given without names: an OpenAI-shaped answer to a request that names no model
    carries the name of the one that ran (as /info lists it), not the server's list of every model."""
    info = httpx.get(server.url + "/info", headers={"authorization": "Bearer sk-test"}, timeout=60).json()
    names = {task: models[0]["name"] for task, models in info["models"].items()}
    embedded = post(server, "/v1/embeddings", {"input": "fine"})
    reranked = post(server, "/v1/rerank", {"query": QUERY, "documents": ["a", "b"]})
    assert embedded["model"] == names["embed"] and "," not in embedded["model"], embedded["model"]
    assert reranked["model"] == names["rerank"] and "," not in reranked["model"], reranked["model"]
    assert names["embed"] != names["rerank"]
