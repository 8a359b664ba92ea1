"""text-embeddings-inference's /embed_all (the token_embed task) against a real server on a random-init tiny BERT:
every token's vector equal to transformers' BertModel last_hidden_state, on the torch backend, on an ONNX graph
exported for the task and on an ONNX encoder graph; TEI's fields (prompt_name from the model's sentence-transformers
prompts, truncate, truncation_direction); the task served only where asked; the SDK's embed_all; a batch job's
token_embeddings column; hostile bodies."""

from __future__ import annotations

import json
import subprocess

import httpx
import numpy as np
import pytest
from test_compat_support import tiny_bert
from test_serving_support import PYTHON, REPO, Server

pytest.importorskip("transformers")

TIMEOUT = 60.0
MAX_INPUTS = 4
PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["The capital of France is Paris.", "a", "Token vectors, one per word piece; [CLS] and [SEP] too."]


def export(checkpoint, out, task: str):
    command = [PYTHON, "-m", "export.onnx", "--ckpt", str(checkpoint), "--task", task, "--precision", "fp32"]
    command += ["--max-seq", "128", "--max-batch", "4", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed-all")
    bert = tiny_bert(root / "bert", "BertModel")
    (bert / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return {
        "torch": bert,
        "onnx": export(bert, root / "onnx", "token_embed"),
        "encoder": export(bert, root / "enc", "encoder"),
    }


@pytest.fixture(scope="module")
def server(models):
    args = ["--model", str(models["torch"]), "--max-client-batch-size", str(MAX_INPUTS)]
    for name, path in models.items():
        args += ["--token-embed-model", f"{name}={path}"]
    with Server(*args) as running:
        yield running


def _post(server, body, status: int = 200, path: str = "/embed_all"):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    return response.json()


def reference(directory, texts: list[str], cut: str | None = None) -> list[np.ndarray]:
    """transformers' last hidden state of each text, its real tokens only (special tokens included); `cut`: the
    tokenizer's truncation side, the text cut to the model's 128 positions."""
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(str(directory), attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), truncation_side=cut or "right")
    found = []
    for text in texts:  # one at a time: no padding in the reference
        with torch.no_grad():
            inputs = tokenizer([text], return_tensors="pt", truncation=cut is not None, max_length=128)
            found.append(model(**inputs).last_hidden_state[0].numpy())
    return found


@pytest.mark.parametrize("name", ["torch", "onnx", "encoder"])
def test_every_token_vector_equals_the_last_hidden_state(server, models, name):
    answer = _post(server, {"inputs": TEXTS, "model": name})
    expected = reference(models["torch"], TEXTS)
    assert len(answer) == len(TEXTS)
    for vectors, states in zip(answer, expected):
        assert np.shape(vectors) == states.shape  # a vector per token, [CLS] and [SEP] included
        np.testing.assert_allclose(np.asarray(vectors), states, atol=1e-5, rtol=0)
    # a text alone is a list of one (TEI's shape); a batch answers each text as it answers it alone
    alone = _post(server, {"inputs": TEXTS[1], "model": name})
    assert len(alone) == 1
    np.testing.assert_allclose(alone[0], answer[1], atol=1e-6)


def test_prompt_name_puts_the_models_prompt_before_each_text(server, models):
    prompted = _post(server, {"inputs": TEXTS[:2], "prompt_name": "query", "truncate": None})
    assert prompted == _post(server, {"inputs": [PROMPTS["query"] + t for t in TEXTS[:2]]})
    assert prompted != _post(server, {"inputs": TEXTS[:2]})
    refused = _post(server, {"inputs": "a", "prompt_name": "nope"}, 422)["error"]
    assert "'nope'" in refused and "query" in refused and "passage" in refused, refused


@pytest.mark.parametrize("name", ["torch", "onnx"])
def test_truncate_cuts_a_texts_end_or_with_left_its_start(server, models, name):
    long = " ".join(f"w{i} paris" if i % 7 == 0 else "the cat sat" for i in range(100))  # about 240 tokens
    assert "128" in _post(server, {"inputs": long, "model": name}, 422)["error"]
    assert "128" in _post(server, {"inputs": long, "model": name, "truncate": None}, 422)["error"]  # TEI's null
    for direction in ("Right", "left"):
        cut = _post(server, {"inputs": long, "model": name, "truncate": True, "truncation_direction": direction})
        (expected,) = reference(models["torch"], [long], cut=direction.lower())
        assert np.shape(cut[0]) == expected.shape == (128, 32)
        np.testing.assert_allclose(np.asarray(cut[0]), expected, atol=1e-5, rtol=0)
    # a text that fits is not cut, whichever end a cut would keep
    assert _post(server, {"inputs": TEXTS, "truncate": True, "truncation_direction": "left"}) == _post(
        server, {"inputs": TEXTS}
    )


def test_the_sdk_embed_all_answers_the_routes_vectors(server):
    from bertserve_client import Client

    with Client(server.url) as client:
        vectors = client.embed_all(TEXTS, model="torch", prompt_name="passage")
        alone = client.embed_all(TEXTS[0])
    assert vectors == _post(server, {"inputs": TEXTS, "model": "torch", "prompt_name": "passage"})
    assert alone == _post(server, {"inputs": TEXTS[:1]})


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        ({"inputs": []}, 400, "inputs"),
        ({"inputs": ["a"] * (MAX_INPUTS + 1)}, 413, "max_client_batch_size"),
        ({"inputs": "   "}, 400, "inputs"),
        ({"inputs": ["a", "\u200b"]}, 400, "inputs[1]"),
        ({"inputs": 5}, 422, "inputs"),
        ({"inputs": [["a", "b"]]}, 422, "inputs"),
        ({"inputs": "a", "normalize": True}, 422, "normalize"),
        ({"inputs": "a", "truncate": "yes"}, 422, "truncate"),
        ({"inputs": "a", "truncation_direction": "middle"}, 422, "truncation_direction"),
        ({"inputs": "a", "prompt_name": 3}, 422, "prompt_name"),
        ({"inputs": "a", "model": "nope"}, 404, "nope"),
        ({"inputs": "\ud83d"}, 422, "surrogate"),
        ({}, 422, "inputs"),
        ([{"inputs": "a"}], 422, "body"),
    ],
)
def test_hostile_bodies_are_json_errors_and_the_server_stays_ready(server, body, status, named):
    sent = json.dumps(body)  # ASCII: a lone surrogate is sent as JSON's escape
    response = httpx.post(
        server.url + "/embed_all", content=sent, headers={"content-type": "application/json"}, timeout=TIMEOUT
    )
    assert response.status_code == status, response.text
    error = response.json()
    assert named in error["error"] and error["error_type"], error
    assert httpx.get(server.url + "/ready", timeout=TIMEOUT).status_code == 200


def test_a_model_is_asked_for_token_vectors_not_given_them_unasked(models):
    """Served by a model named for it (--token-embed-model) only: --model alone serves its embeddings, and
    /embed_all is a JSON 404 naming what the server serves."""
    with Server("--model", str(models["torch"])) as running:
        assert httpx.get(running.url + "/info", timeout=TIMEOUT).json()["tasks"] == ["embed"]
        refused = _post(running, {"inputs": "a"}, 404)
        assert "token_embed" in refused["error"] and "embed" in refused["error"]


def test_batch_job_writes_each_rows_token_vectors(models, tmp_path):
    import pyarrow.parquet as pq

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    command = [PYTHON, "-m", "batch", "--task", "token_embed", "--model", str(models["onnx"])]
    command += ["--input", str(source), "--output", str(tmp_path / "out"), "--keep", "id"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    table = pq.read_table(sorted((tmp_path / "out").glob("*.parquet"))).sort_by("id")
    for vectors, states in zip(table["token_embeddings"].to_pylist(), reference(models["torch"], TEXTS)):
        np.testing.assert_allclose(np.asarray(vectors), states, atol=1e-5, rtol=0)


def test_the_packed_torch_path_answers_the_same_vectors(models):
    """The torch backend's packed path (the CUDA default; here on CPU): the per-token states of a batch's packed
    tokens, unpacked per text, equal the padded path's reference."""
    with Server("--token-embed-model", str(models["torch"]), "--torch-packed", "true") as running:
        answer = _post(running, {"inputs": TEXTS})
    for vectors, states in zip(answer, reference(models["torch"], TEXTS)):
        np.testing.assert_allclose(np.asarray(vectors), states, atol=1e-5, rtol=0)


def _bpe_tokenizer(directory, corpus: list[str]):
    """A byte-level BPE tokenizer (RoBERTa's layout: a word's leading space is part of its token) saved as
    transformers saves one."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    names = dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>", unk_token="<unk>")
    transformers.RobertaTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", mask_token="<mask>", **names
    ).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("chunk", [None, 24])
@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_a_left_cut_keeps_the_tokens_transformers_keeps(models, tmp_path, monkeypatch, kind, chunk):
    """encode_cut with "left" gives the ids of transformers' tokenizer with truncation_side left, for texts short and
    far longer than the pieces a long text is tokenised in from its end; with pieces of a few words, a piece's first
    word (tokenised otherwise by a byte-level BPE without the space before it) is often among the tokens kept."""
    import random

    import transformers

    from bert.tasks import embed
    from bert.tasks.embed import encode_cut
    from bert.tokenizer import BertTokenizer

    if chunk is not None:
        monkeypatch.setattr(embed, "CHUNK_CHARS", chunk)

    rng = random.Random(0)
    words = [
        "paris",
        "the",
        "capital",
        "tokenisation",
        "of",
        "France,",
        "naïve",
        "Zürich.",
        "x",
        "antidisestablishment",
    ]
    texts = [" ".join(rng.choice(words) for _ in range(n)) for n in (1, 5, 60, 400, 1500, 4000)]
    texts.append("\n".join(texts[-2:]) + "  trailing  ")
    directory = models["torch"] if kind == "wordpiece" else _bpe_tokenizer(tmp_path / "bpe", texts * 3)
    ours = BertTokenizer.from_dir(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory), truncation_side="left")
    for max_length in (4, 16, 128, 512):
        cut = encode_cut(ours, texts, max_length=max_length, truncate=True, direction="left")
        expected = [theirs(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
        assert [f.input_ids for f in cut] == expected, max_length
        assert all(f.token_type_ids == [0] * len(f) for f in cut)
