"""/rerank and /v1/rerank (issue 19, bar 3): a cross-encoder written by transformers (a one-output
BertForSequenceClassification, random weights) served by bertserve scores every (query, text) pair as
sentence-transformers' CrossEncoder.predict does (sigmoid), from the torch backend and an ONNX fp32 export."""

from __future__ import annotations

import os
import subprocess

import httpx
import numpy as np
import pytest
from test_serving_support import PYTHON, REPO, RERANK_QUERY, RERANK_TEXTS, Server, build_cross_encoder, minilm_dir

QUERY, TEXTS = RERANK_QUERY, RERANK_TEXTS


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    return build_cross_encoder(tmp_path_factory.mktemp("rerank") / "cross-encoder")


@pytest.fixture(scope="module")
def reference(cross_encoder) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(cross_encoder), device="cpu")
    pairs = [(QUERY, t) for t in TEXTS]
    return model.predict(pairs), model.predict(pairs, activation_fn=__import__("torch").nn.Identity())


def export_rerank(ckpt, out):
    """`python -m export.onnx --task rerank` (fp32) of `ckpt` into `out`."""
    run = subprocess.run(
        [PYTHON, "-m", "export.onnx", "--ckpt", str(ckpt), "--task", "rerank", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def artifact(cross_encoder, tmp_path_factory):
    return export_rerank(cross_encoder, tmp_path_factory.mktemp("rerank-onnx") / "artifact")


@pytest.mark.parametrize("backend,tolerance", [("torch", 1e-5), ("onnx", 1e-4)])
def test_rerank_equals_cross_encoder(backend, tolerance, cross_encoder, artifact, reference):
    scores, logits = reference
    model = cross_encoder if backend == "torch" else artifact
    with Server("--model", str(model)) as server:
        info = httpx.get(server.url + "/info").json()
        assert "rerank" in info["tasks"], info
        # a CPU batch's cap is the backend's own: torch pays per batch, onnxruntime mostly pays padding
        assert info["max_batch_requests"] == {"torch": 32, "onnx": 4}[backend], info
        # and its padded tokens: 32 short pairs, not 32 long windows, for torch
        assert info["max_batch_tokens"] == {"torch": 3072, "onnx": 16384}[backend], info
        tei = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True}).json()
        raw = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True}).json()
        v1 = httpx.post(
            server.url + "/v1/rerank",
            json={"query": QUERY, "documents": TEXTS, "top_n": 3, "return_documents": True, "model": "m"},
        ).json()
        one = [
            httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": [t]}).json()[0]["score"] for t in TEXTS
        ]
    order = list(np.argsort(-scores, kind="stable"))
    assert [r["index"] for r in tei] == order
    assert [r["text"] for r in tei] == [TEXTS[i] for i in order]
    got = np.array([r["score"] for r in sorted(tei, key=lambda r: r["index"])])
    got_raw = np.array([r["score"] for r in sorted(raw, key=lambda r: r["index"])])
    print(
        f"bar 3, rerank {backend}: max |bertserve - CrossEncoder| {np.abs(got - scores).max():.2e} (sigmoid), "
        f"{np.abs(got_raw - logits).max():.2e} (raw)"
    )
    assert np.abs(got - scores).max() <= tolerance and np.abs(got_raw - logits).max() <= tolerance * 10
    assert np.abs(np.array(one) - scores).max() <= tolerance  # one pair per request = all in one
    assert [r["index"] for r in v1["results"]] == order[:3] and v1["model"] == "m"
    assert [r["document"] for r in v1["results"]] == [{"text": TEXTS[i]} for i in order[:3]]
    assert np.allclose([r["relevance_score"] for r in v1["results"]], scores[order[:3]], atol=tolerance)
    assert v1["usage"]["total_tokens"] > len(TEXTS) * 4


def test_rerank_refusals(cross_encoder):
    with Server("--model", str(cross_encoder), "--max-client-batch-size", "4") as server:
        # a checkpoint on CPU: the server says how to get the faster export (it never exports by itself)
        assert "/rerank is served from the checkpoint" in server.log() and "python -m export.onnx" in server.log()
        post = lambda path, body: httpx.post(server.url + path, json=body)  # noqa: E731
        for path, body, status in [
            ("/rerank", {"query": "q", "texts": []}, 400),
            ("/rerank", {"query": " ", "texts": ["a"]}, 400),
            ("/rerank", {"query": "q", "texts": ["a", ""]}, 400),
            ("/rerank", {"query": "q", "texts": ["a"] * 5}, 413),
            ("/rerank", {"query": "q", "texts": "a"}, 422),
            ("/rerank", {"query": "q " * 600, "texts": ["a"]}, 422),  # a long text is windowed; a query is not
            ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422),
            ("/v1/rerank", {"query": "q", "documents": ["a"] * 5}, 413),
        ]:
            response = post(path, body)
            assert response.status_code == status, (path, body, response.text)
            assert set(response.json()) == {"error", "error_type"}
        assert post("/rerank", {"query": "q", "texts": ["word " * 600], "truncate": True}).status_code == 200
        assert post("/rerank", {"query": "q", "texts": ["word " * 600]}).status_code == 200  # its best window
        assert httpx.get(server.url + "/ready").status_code == 200


def _finetune(tmp_path, *args: str) -> dict:
    import json

    out = tmp_path / "run"
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "training.finetune",
            "--task",
            "rerank",
            "--init-preset",
            "tiny",
            "--tokenizer",
            str(minilm_dir()),
            "--output-dir",
            str(out),
            "--batch-size",
            "8",
            "--max-seq-length",
            "64",
            "--no-progress",
            "--torch-threads",
            "1",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "best" / "metrics.json").read_text())
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
    return metrics


def test_finetune_rerank_on_graded_pairs(tmp_path):
    """A TSV of (query, text, label) rows with graded labels trains a one-output cross-encoder; its metrics are
    ranking metrics over each query's candidates."""
    rows = ["query\ttext\tlabel"]
    for q in range(12):
        rows += [
            f"what colour is thing {q}\tthing {q} is red\t2",
            f"what colour is thing {q}\tthe sky was grey\t0",
            f"what colour is thing {q}\tthing {q} was bought today\t1",
        ]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    metrics = _finetune(
        tmp_path,
        "--train-data",
        str(tmp_path / "pairs.tsv"),
        "--eval-data",
        str(tmp_path / "pairs.tsv"),
        "--max-steps",
        "4",
    )
    best = metrics.get("best", metrics)
    found = best.get("metrics", best)
    assert {"mrr", "recall_at_1"} <= set(str(k) for k in _flatten(found)), metrics


def _flatten(value, keys=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _flatten(v)


def _served_like_cross_encoder(model_dir, tmp_path, pairs: list[tuple[str, list[str]]]) -> dict:
    """/rerank and /v1/rerank of `model_dir` (torch) and of its ONNX fp32 export against CrossEncoder.predict on
    each (query, texts): the largest |difference| per backend."""
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(model_dir), device="cpu")
    expected = [reference.predict([(q, t) for t in texts]) for q, texts in pairs]
    out = export_rerank(model_dir, tmp_path / "artifact")
    worst = {}
    for backend, served in (("torch", model_dir), ("onnx", out)):
        diff = 0.0
        with Server("--model", str(served)) as server:
            for (query, texts), want in zip(pairs, expected):
                tei = httpx.post(server.url + "/rerank", json={"query": query, "texts": texts, "truncate": True})
                v1 = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": texts})
                assert tei.status_code == 200 and v1.status_code == 200, (tei.text, v1.text)
                got = np.array([r["score"] for r in sorted(tei.json(), key=lambda r: r["index"])])
                got_v1 = np.array(
                    [r["relevance_score"] for r in sorted(v1.json()["results"], key=lambda r: r["index"])]
                )
                assert [r["index"] for r in tei.json()] == [r["index"] for r in v1.json()["results"]]
                diff = max(diff, float(np.abs(got - want).max()), float(np.abs(got_v1 - want).max()))
        worst[backend] = diff
    return worst


def _heldout_pairs(data_dir, n: int) -> list[tuple[str, list[str]]]:
    from bert.tasks.qa import read_squad_articles, split_heldout
    from bert.tasks.rerank import squad_queries

    held = split_heldout(read_squad_articles(data_dir / "squad-train"), 1)[1]
    return [(q.query, q.texts) for q in squad_queries(held)[:n]]


def test_squad_queries_hold_their_paragraph_and_the_nearest_sentences_of_other_paragraphs():
    """squad: training data: a question's candidates are its paragraph's sentences (1 on the answer's) and the
    sentences of the article's other paragraphs sharing most words with it (0); questions interleave articles."""
    from bert.tasks.rerank import ARTICLE_NEGATIVES, squad_queries

    def article(title: str, paragraphs: list[tuple[str, str, int]]) -> dict:
        return {
            "title": title,
            "paragraphs": [
                {"context": c, "qas": [{"question": q, "answers": [{"text": "x", "answer_start": at}]}]}
                for c, q, at in paragraphs
            ],
        }

    first = "Alpha one is here. The river Volga flows east."
    others = " ".join(f"Filler sentence number {k} here." for k in range(6)) + " The Volga river flows into the sea."
    articles = [
        article("a", [(first, "Where does the river Volga flow?", first.index("The river")), (others, "q2", 0)]),
        article("b", [("Beta is one. Gamma is two.", "What is gamma?", 13)]),
    ]
    queries = squad_queries(articles)
    assert [q.query for q in queries] == ["Where does the river Volga flow?", "What is gamma?", "q2"]
    volga = queries[0]
    assert volga.texts[:2] == ["Alpha one is here.", "The river Volga flows east."] and volga.labels[:2] == [0.0, 1.0]
    assert len(volga.texts) == 2 + ARTICLE_NEGATIVES and volga.labels[2:] == [0.0] * ARTICLE_NEGATIVES
    assert volga.texts[2] == "The Volga river flows into the sea."  # the most shared words first
    assert queries[1].texts == ["Beta is one.", "Gamma is two."]  # an article of one paragraph: no others
    assert len(squad_queries(articles, article_negatives=0)[0].texts) == 2


def test_a_reranker_trained_from_squad_scores_as_cross_encoder_does(tmp_path, data_dir):
    """The SQuAD recipe's reranker (finetune --task rerank --train-data squad:..., here a few steps of a tiny
    model; BERTSERVE_RERANKER=DIR checks the recipe's real output instead) is a CrossEncoder to
    sentence-transformers: /rerank and /v1/rerank give its scores on held-out questions' candidates, within 1e-5
    from the torch backend and 1e-4 from an ONNX fp32 export. Training with --heldout-articles reports ranking
    metrics (MRR, recall@1) on the held-out articles' questions."""
    trained = os.environ.get("BERTSERVE_RERANKER")
    if not trained:
        metrics = _finetune(
            tmp_path,
            "--train-data",
            f"squad:{data_dir / 'squad-train'}",
            "--heldout-articles",
            "1",
            "--max-train-examples",
            "40",
            "--max-eval-examples",
            "20",
            "--max-steps",
            "3",
        )
        assert {"mrr", "recall_at_1"} <= set(str(k) for k in _flatten(metrics)), metrics
        trained = tmp_path / "run" / "best"
    pairs = _heldout_pairs(data_dir, int(os.environ.get("BERTSERVE_RERANKER_QUESTIONS", "8")))
    worst = _served_like_cross_encoder(trained, tmp_path, pairs)
    print(f"bar 3, reranker {trained} on {len(pairs)} held-out questions: max |bertserve - CrossEncoder| {worst}")
    assert worst["torch"] <= 1e-5 and worst["onnx"] <= 1e-4, worst


def test_sdk_rerank_gives_what_the_http_api_gives(cross_encoder):
    """The SDK's rerank() (sync and async) returns /rerank's answer as Ranked objects, best first; more texts
    than the server takes per request go in several requests whose rankings merge into the one ranking."""
    import asyncio

    from bertserve_client import AsyncClient, Client, ValidationError

    with Server("--model", str(cross_encoder), "--max-client-batch-size", "3") as server:
        raw = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": TEXTS[:3], "return_text": True}).json()
        small = [httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": [t]}).json()[0] for t in TEXTS]
        with Client(server.url) as client:
            ranked = client.rerank(QUERY, TEXTS[:3], return_text=True)
            logits = client.rerank(QUERY, TEXTS[:3], raw_scores=True)
            split = client.rerank(QUERY, TEXTS)  # 5 texts, 3 per request: two requests, one ranking
            with pytest.raises(ValidationError):
                client.rerank(QUERY, [""])

        async def run():
            async with AsyncClient(server.url) as client:
                return await client.rerank(QUERY, TEXTS[:3], return_text=True)

        ranked_async = asyncio.run(run())
    for answer in (ranked, ranked_async):
        assert [r.index for r in answer] == [r["index"] for r in raw]
        assert [r.text for r in answer] == [r["text"] for r in raw]
        assert np.allclose([r.score for r in answer], [r["score"] for r in raw], atol=1e-6)
    assert [r.index for r in logits] == [r["index"] for r in raw]
    by_index = {r["index"]: r["score"] for r in raw}
    assert np.allclose([1 / (1 + np.exp(-r.score)) for r in logits], [by_index[r.index] for r in logits], atol=1e-6)
    assert [r.index for r in split] == list(np.argsort([-r["score"] for r in small], kind="stable"))
    assert np.allclose([r.score for r in split], sorted((r["score"] for r in small), reverse=True), atol=1e-6)
