"""The sparse (SPLADE) task against sentence-transformers' SparseEncoder (MLMTransformer + SpladePooling("max")) on
the same random-init masked LMs (BERT and ModernBERT, written by transformers, MiniLM's tokenizer): through a real
server on the torch backend, through exported ONNX graphs (fp32, int8), in a batch job and through the SDK; its
pruning options; hostile bodies."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from test_compat_support import tiny_bert
from test_serving_support import PYTHON, REPO, Server, minilm_dir

pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")

TIMEOUT = 60.0
VOCAB = 30522
PROMPTS = {"query": "query: ", "document": "document: "}
TEXTS = [
    "The capital of France is Paris.",
    "Sparse vectors weigh the words of a text",
    "a",
    "A longer sentence, with punctuation; and several clauses that make it the longest of the batch by far.",
]


def tiny_modernbert(directory):
    """A random-init ModernBERT masked LM (transformers' classes) with MiniLM's WordPiece tokenizer."""
    import torch
    import transformers

    config = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        local_attention=16,
        global_attn_every_n_layers=2,
        max_position_embeddings=128,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        cls_token_id=101,
        sep_token_id=102,
    )
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(config).eval().save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), model_max_length=128).save_pretrained(directory)
    return directory


def export(checkpoint, out, precision: str):
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "export.onnx",
            "--ckpt",
            str(checkpoint),
            "--task",
            "sparse",
            "--precision",
            precision,
            "--max-seq",
            "64",
            "--max-batch",
            "4",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    bert = tiny_bert(root / "bert", "BertForMaskedLM")
    (bert / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    modernbert = tiny_modernbert(root / "modernbert")
    return {
        "bert": bert,
        "modernbert": modernbert,
        "onnx": export(bert, root / "onnx", "fp32"),
        "modernbert_onnx": export(modernbert, root / "modernbert_onnx", "fp32"),
        "int8": export(bert, root / "int8", "int8"),
    }


@pytest.fixture(scope="module")
def reference(models):
    """name -> SparseEncoder's dense vectors of TEXTS (the torch models'), float32 (len(TEXTS), V)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    found = {}
    for name in ("bert", "modernbert"):
        encoder = SparseEncoder(
            modules=[
                MLMTransformer(str(models[name]), model_args={"attn_implementation": "eager"}),
                SpladePooling("max"),
            ],
            device="cpu",
        )
        vectors = encoder.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False)
        found[name] = vectors.float().numpy()
    return found


@pytest.fixture(scope="module")
def server(models):
    with Server(*(a for name, path in models.items() for a in ("--sparse-model", f"{name}={path}"))) as running:
        yield running


def _post(server, body, status: int = 200, path: str = "/embed_sparse"):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    return response.json()


def dense(answer: list[list[dict]]) -> np.ndarray:
    vectors = np.zeros((len(answer), VOCAB), dtype=np.float32)
    for row, entries in enumerate(answer):
        indices = [e["index"] for e in entries]
        assert indices == sorted(set(indices)), "entries in index order, each once"
        vectors[row, indices] = [e["value"] for e in entries]
    return vectors


@pytest.mark.parametrize(
    "name,tolerance", [("bert", 1e-5), ("modernbert", 1e-5), ("onnx", 1e-4), ("modernbert_onnx", 1e-4)]
)
def test_embed_sparse_equals_sparse_encoder(server, reference, name, tolerance):
    """Every nonzero entry, as TEI answers them; the torch backend within 1e-5 of SparseEncoder, the fp32 ONNX graph
    within 1e-4. A text alone is a list of one list."""
    got = dense(_post(server, {"inputs": TEXTS, "model": name}))
    want = reference["modernbert" if name.startswith("modernbert") else "bert"]
    assert np.abs(got - want).max() < tolerance
    assert ((got > 0) == (want > 0)).mean() > 0.999  # the same entries (a value at the edge of 0 may differ)
    one = _post(server, {"inputs": TEXTS[0], "model": name})
    assert len(one) == 1 and np.abs(dense(one)[0] - want[0]).max() < tolerance


def test_exported_graph_ends_in_the_pooled_vector(models):
    """The graph's one output is (batch, vocabulary): pooled inside the graph, not a row per token."""
    import onnx

    for name in ("onnx", "modernbert_onnx", "int8"):
        graph = onnx.load(str(models[name] / "model.onnx"), load_external_data=False).graph
        shapes = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
        assert shapes == {"sparse_embedding": ["batch", VOCAB]}, name
        assert json.loads((models[name] / "manifest.json").read_text())["tasks"] == ["sparse"]


def test_int8_keeps_the_top_entries(server, reference):
    """int8 quantisation moves values; the largest entries of each text mostly stay the largest (measured on these
    texts: see docs/serving.md)."""
    got = dense(_post(server, {"inputs": TEXTS, "model": "int8"}))
    want = reference["bert"]
    for ours, theirs in zip(got, want):
        top = set(np.argsort(-theirs)[:20])
        assert len(top & set(np.argsort(-ours)[:20])) >= 14


def test_top_k_threshold_and_tokens(server, reference):
    want = reference["bert"]
    answer = _post(server, {"inputs": TEXTS, "model": "bert", "top_k": 5, "return_tokens": True})
    for entries, vector in zip(answer, want):
        assert len(entries) == 5
        assert [e["index"] for e in entries] == sorted(np.argsort(-vector, kind="stable")[:5].tolist())
        assert all(set(e) == {"index", "value", "token"} for e in entries)
    words = [line.rstrip("\n") for line in (minilm_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    assert all(e["token"] == words[e["index"]] for entries in answer for e in entries)
    threshold = float(np.median(want[want > 0]))
    pruned = _post(server, {"inputs": TEXTS, "model": "bert", "threshold": threshold})
    for entries, vector in zip(pruned, want):
        assert {e["index"] for e in entries} == set(np.flatnonzero(vector > threshold + 1e-5)) | (
            {e["index"] for e in entries} & set(np.flatnonzero(np.abs(vector - threshold) <= 1e-5))
        )
        assert all("token" not in e for e in entries)
    # TEI's nulls and spellings
    same = _post(server, {"inputs": TEXTS[:1], "model": "bert", "truncate": None, "truncation_direction": "Right"})
    assert np.abs(dense(same)[0] - want[0]).max() < 1e-5


def test_prompt_name_puts_the_models_prompt_before_each_text(server):
    """TEI's prompt_name: the model's prompt of that name (config_sentence_transformers.json) before each text, as
    /embed does; a model without prompts names none."""
    prompted = _post(server, {"inputs": TEXTS[:2], "model": "bert", "prompt_name": "query"})
    assert prompted == _post(server, {"inputs": [PROMPTS["query"] + t for t in TEXTS[:2]], "model": "bert"})
    assert prompted != _post(server, {"inputs": TEXTS[:2], "model": "bert"})
    refused = _post(server, {"inputs": "a", "model": "modernbert", "prompt_name": "query"}, 422)["error"]
    assert "'query'" in refused and "none" in refused, refused


def test_left_truncation_keeps_a_texts_end_as_sparse_encoder_does(server, models):
    """TEI's truncation_direction "left": a long text's start is cut and its last tokens kept, equal to
    SparseEncoder with its tokenizer cutting on the left; "right" (the default) keeps its start."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    long = " ".join("the cat sat" if i % 5 else f"w{i} paris" for i in range(300))  # about 700 tokens
    encoder = SparseEncoder(
        modules=[
            MLMTransformer(str(models["bert"]), model_args={"attn_implementation": "eager"}),
            SpladePooling("max"),
        ],
        device="cpu",
    )
    encoder.max_seq_length = 128
    expected = {}
    for side in ("left", "right"):
        encoder.tokenizer.truncation_side = side
        expected[side] = encoder.encode([long], convert_to_tensor=True, convert_to_sparse_tensor=False).float().numpy()
    body = {"inputs": long, "model": "bert", "truncate": True}
    left = dense(_post(server, {**body, "truncation_direction": "Left"}))
    right = dense(_post(server, {**body, "truncation_direction": "right"}))
    assert np.abs(left - expected["left"]).max() < 1e-5
    assert np.abs(right - expected["right"]).max() < 1e-5
    assert np.abs(left - right).max() > 1e-3  # the two cuts keep different tokens
    short = {"inputs": TEXTS[:2], "model": "bert", "truncate": True}
    assert _post(server, {**short, "truncation_direction": "left"}) == _post(server, short)  # nothing cut: the same


HOSTILE = [
    ({"inputs": 5}, 422, "inputs"),
    ({"inputs": ["a", 5]}, 422, "inputs"),
    ({"inputs": []}, 400, "inputs"),
    ({"inputs": ""}, 400, "inputs"),
    ({"inputs": ["a"] * 1000}, 413, "limit"),
    ({"inputs": "a", "top_k": 0}, 422, "top_k"),
    ({"inputs": "a", "top_k": 10**9}, 422, "top_k"),
    ({"inputs": "a", "top_k": "5"}, 422, "top_k"),
    ({"inputs": "a", "threshold": -1}, 422, "threshold"),
    ({"inputs": "a", "threshold": "high"}, 422, "threshold"),
    ({"inputs": "a", "return_tokens": "yes"}, 422, "return_tokens"),
    ({"inputs": "a", "pruning": 3}, 422, "pruning"),
    ({"inputs": "a", "prompt_name": "nope"}, 422, "'nope' is not a prompt of this model; its prompts: query, document"),
    ({"inputs": "a", "prompt_name": 3}, 422, "prompt_name"),
    ({"inputs": "a", "truncation_direction": "middle"}, 422, "truncation_direction"),
    ({"inputs": "word " * 500}, 422, "token"),
    ({"inputs": "a", "model": "nope"}, 404, "nope"),
    (["a"], 422, "body"),
]


@pytest.mark.parametrize("body,status,named", HOSTILE)
def test_hostile_bodies_are_json_4xx_naming_the_field(server, body, status, named):
    answer = _post(server, {**body, "model": body.get("model", "bert")} if isinstance(body, dict) else body, status)
    assert set(answer) == {"error", "error_type"} and named in answer["error"], answer
    assert httpx.get(server.url + "/ready", timeout=TIMEOUT).status_code == 200


def test_sdk_embed_sparse_sync_and_async(server, reference):
    import asyncio

    from bertserve_client import AsyncClient, Client, types

    with Client(server.url) as client:
        one = client.embed_sparse(TEXTS[0], model="bert", top_k=3, return_tokens=True)
        many = client.embed_sparse(TEXTS, model="bert")
    assert len(one) == 1 and len(one[0]) == 3 and all(isinstance(e, types.SparseValue) and e.token for e in one[0])
    got = dense([[e.model_dump(exclude_none=True) for e in entries] for entries in many])
    assert np.abs(got - reference["bert"]).max() < 1e-5

    async def run():
        async with AsyncClient(server.url) as client:
            return await client.embed_sparse(TEXTS[1:3], model="bert", threshold=0.5)

    pruned = asyncio.run(run())
    assert [[e.index for e in entries] for entries in pruned] == [
        np.flatnonzero(v > 0.5).tolist() for v in reference["bert"][1:3]
    ]


def test_haystack_tei_sparse_embedders(server):
    """Haystack's TEI sparse embedders (huggingface-api-haystack), pointed at the server's root, get /embed_sparse's
    entries of the default model, sync and async."""
    import asyncio

    embedders = pytest.importorskip(
        "haystack_integrations.components.embedders.huggingface_api", reason="needs huggingface-api-haystack (dev)"
    )
    from haystack import Document

    ours = _post(server, {"inputs": TEXTS})
    expected = [([e["index"] for e in entries], [e["value"] for e in entries]) for entries in ours]
    text = embedders.HuggingFaceTEISparseTextEmbedder(api_base_url=server.url)
    got = text.run(TEXTS[0])["sparse_embedding"]
    assert (got.indices, got.values) == expected[0]
    got = asyncio.run(text.run_async(TEXTS[1]))["sparse_embedding"]
    assert (got.indices, got.values) == expected[1]
    documents = embedders.HuggingFaceTEISparseDocumentEmbedder(
        api_base_url=server.url, batch_size=2, progress_bar=False
    ).run([Document(content=t) for t in TEXTS])["documents"]
    assert [(d.sparse_embedding.indices, d.sparse_embedding.values) for d in documents] == expected


def test_batch_job_writes_indices_and_values(models, reference, tmp_path):
    import pyarrow.parquet as pq

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "batch",
            "--task",
            "sparse",
            "--model",
            str(models["bert"]),
            "--input",
            str(source),
            "--output",
            str(tmp_path / "out"),
            "--keep",
            "id",
            "--threshold",
            "0.25",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = pq.read_table(sorted((tmp_path / "out").glob("*.parquet"))).sort_by("id")
    assert str(table.schema.field("indices").type) == "list<element: int32>"
    assert str(table.schema.field("values").type) == "list<element: float>"
    for indices, values, vector in zip(table["indices"].to_pylist(), table["values"].to_pylist(), reference["bert"]):
        assert indices == np.flatnonzero(vector > 0.25).tolist()
        assert np.abs(np.asarray(values) - vector[indices]).max() < 1e-5


def test_a_masked_lm_serving_both_kinds_runs_its_decoder_once_per_batch(models):
    """fill_mask and sparse read one masked-LM module: its (B, T, V) logits are computed once per forward, not once
    per kind, and each kind's outputs are what it computes alone."""
    import torch

    from bert.checkpoint import load_for_inference

    model, _ = load_for_inference(models["bert"])
    assert {"fill_mask", "sparse"} <= set(model.heads), model.heads
    calls = []
    model.cls.predictions.register_forward_hook(lambda module, args, output: calls.append(output.shape))
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 7592, 102, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        both = model(ids, mask, torch.zeros_like(ids)).outputs
    assert len(calls) == 1, calls
    alone = {}
    for task in ("fill_mask", "sparse"):
        single, _ = load_for_inference(models["bert"])
        single.heads = {task: single.heads[task]}
        with torch.no_grad():
            alone.update(single(ids, mask, torch.zeros_like(ids)).outputs)
    assert set(alone) == set(both)
    for name, value in alone.items():
        assert torch.equal(value, both[name]), name
