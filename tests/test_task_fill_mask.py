"""/fill-mask (issue 19, bar 3): a masked-LM written by transformers (BertForMaskedLM, random weights) served by
bertserve proposes the tokens transformers' fill-mask pipeline proposes, with the same scores."""

from __future__ import annotations

import httpx
import pytest
from test_serving_support import Server, minilm_dir

TEXTS = ["paris is the [MASK] of france.", "the [MASK] sat on the [MASK].", "[MASK]"]


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import torch

    directory = tmp_path_factory.mktemp("fill-mask") / "mlm"
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.transform.dense.weight.mul_(8)  # sharper than uniform, so the order means something
    model.save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir())).save_pretrained(directory)
    return directory


def _pipeline_answers(directory, text: str, top_k: int) -> list[list[dict]]:
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(directory), device="cpu")
    out = fill(text, top_k=top_k)
    return [out] if out and isinstance(out[0], dict) else out


def test_fill_mask_equals_transformers_pipeline(masked_lm):
    with Server("--model", str(masked_lm)) as server:
        assert "fill_mask" in httpx.get(server.url + "/info").json()["tasks"]
        batched = httpx.post(server.url + "/fill-mask", json={"inputs": TEXTS, "top_k": 7}).json()
        for text, ours in zip(TEXTS, batched):
            single = httpx.post(server.url + "/fill-mask", json={"inputs": text, "top_k": 7}).json()
            theirs = _pipeline_answers(masked_lm, text, 7)
            assert len(ours) == len(single) == len(theirs) == text.count("[MASK]")
            for mask_ours, mask_single, mask_theirs in zip(ours, single, theirs):
                assert [c["token"] for c in mask_ours] == [c["token"] for c in mask_theirs]
                assert [c["token"] for c in mask_single] == [c["token"] for c in mask_theirs]
                assert [c["token_str"] for c in mask_ours] == [c["token_str"] for c in mask_theirs]
                assert [c["sequence"] for c in mask_ours] == [c["sequence"] for c in mask_theirs]
                worst = max(abs(a["score"] - b["score"]) for a, b in zip(mask_ours, mask_theirs))
                assert worst <= 1e-5, worst


def test_fill_mask_refusals(masked_lm):
    with Server("--model", str(masked_lm)) as server:
        for body, status in [
            ({"inputs": "no mask here"}, 422),
            ({"inputs": ["[MASK] ok", "none"]}, 422),
            ({"inputs": "[MASK]", "top_k": 51}, 422),
            ({"inputs": ""}, 400),
            ({"inputs": []}, 400),
            ({"inputs": "[MASK] " + "word " * 600}, 422),
            ({"inputs": "word " * 600 + "[MASK]", "truncate": True}, 422),  # truncate cut its only [MASK] off
        ]:
            response = httpx.post(server.url + "/fill-mask", json=body)
            assert response.status_code == status, (body, response.text)
            assert set(response.json()) == {"error", "error_type"}
        assert "no [MASK] token" in httpx.post(server.url + "/fill-mask", json={"inputs": "x"}).json()["error"]
        # a [MASK] written but cut off by truncate is named as such, not as a text without one
        cut = httpx.post(
            server.url + "/fill-mask", json={"inputs": ["[MASK]", "word " * 600 + "[MASK]"], "truncate": True}
        )
        assert cut.status_code == 422 and "inputs[1]: its [MASK] tokens lie past" in cut.json()["error"], cut.text
        assert httpx.get(server.url + "/ready").status_code == 200


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, data_dir):
    """The WikiText pretraining recipe's checkpoint (recipes/pretrain_wikitext.sh: its own WordPiece vocabulary,
    MLM + NSP), on the first 300 lines of WikiText-2 and a few steps: the same code path, minutes shorter."""
    import subprocess

    from test_serving_support import PYTHON, REPO

    out = tmp_path_factory.mktemp("pretrain") / "run"
    out.mkdir()
    raw = out / "wiki.raw"
    raw.write_text(
        "".join(
            (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8").splitlines(keepends=True)[:300]
        ),
        encoding="utf-8",
    )
    for command in (
        ["-m", "training.data.wikitext", str(raw), str(out / "corpus.txt")],
        [
            "-m",
            "training.pretrain",
            "--corpus",
            str(out / "corpus.txt"),
            "--vocab-size",
            "2000",
            "--preset",
            "tiny",
            "--output-dir",
            str(out),
            "--max-seq-length",
            "64",
            "--max-predictions-per-seq",
            "10",
            "--dupe-factor",
            "1",
            "--heldout-percent",
            "30",
            "--batch-size",
            "16",
            "--learning-rate",
            "1e-3",
            "--max-steps",
            "6",
            "--eval-every",
            "6",
            "--no-progress",
            "--torch-threads",
            "1",
        ],
    ):
        done = subprocess.run([PYTHON, *command], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return next(p.parent for p in sorted(out.rglob("config.json")) if (p.parent / "model.safetensors").is_file())


def test_fill_mask_on_the_pretraining_recipes_checkpoint(pretrained):
    import json

    assert json.loads((pretrained / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    texts = ["the game was [MASK] in japan .", "[MASK] is a [MASK] ."]
    with Server("--model", str(pretrained)) as server:
        ours = httpx.post(server.url + "/fill-mask", json={"inputs": texts, "top_k": 5}).json()
    for text, answer in zip(texts, ours):
        theirs = _pipeline_answers(pretrained, text, 5)
        for mask_ours, mask_theirs in zip(answer, theirs, strict=True):
            assert [c["token"] for c in mask_ours] == [c["token"] for c in mask_theirs]
            assert [c["sequence"] for c in mask_ours] == [c["sequence"] for c in mask_theirs]
            assert max(abs(a["score"] - b["score"]) for a, b in zip(mask_ours, mask_theirs)) <= 1e-5


def test_fill_mask_from_an_onnx_export(masked_lm, tmp_path):
    """The mlm head exports (its top candidates' probabilities and int64 ids are graph outputs) and the
    onnxruntime backend answers as the torch one does."""
    import subprocess

    from test_serving_support import PYTHON, REPO

    run = subprocess.run(
        [PYTHON, "-m", "export.onnx", "--ckpt", str(masked_lm), "--out", str(tmp_path / "art")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers = {}
    for model in (masked_lm, tmp_path / "art"):
        with Server("--model", str(model)) as server:
            answers[model] = httpx.post(server.url + "/fill-mask", json={"inputs": TEXTS, "top_k": 5}).json()
    torch_answers, onnx_answers = answers.values()
    for text_torch, text_onnx in zip(torch_answers, onnx_answers, strict=True):
        for mask_torch, mask_onnx in zip(text_torch, text_onnx, strict=True):
            assert [c["token"] for c in mask_torch] == [c["token"] for c in mask_onnx]
            assert max(abs(a["score"] - b["score"]) for a, b in zip(mask_torch, mask_onnx)) <= 1e-4


def test_sdk_fill_mask_gives_what_the_http_api_gives(masked_lm):
    """The SDK's fill_mask() (sync and async): one candidate list per [MASK] for a text, that per text for a
    list, as /fill-mask answers; a text without [MASK] is a ValidationError."""
    import asyncio

    from bertserve_client import AsyncClient, Client, ValidationError

    with Server("--model", str(masked_lm)) as server:
        raw = httpx.post(server.url + "/fill-mask", json={"inputs": TEXTS, "top_k": 3}).json()
        raw_one = httpx.post(server.url + "/fill-mask", json={"inputs": TEXTS[0], "top_k": 3}).json()
        with Client(server.url) as client:
            many = client.fill_mask(TEXTS, top_k=3)
            one = client.fill_mask(TEXTS[0], top_k=3)
            with pytest.raises(ValidationError):
                client.fill_mask("no mask here")

        async def run():
            async with AsyncClient(server.url) as client:
                return await client.fill_mask(TEXTS, top_k=3)

        many_async = asyncio.run(run())

    def dumped(answer):
        return [[[c.model_dump() for c in mask] for mask in text] for text in answer]

    for got in (dumped(many), dumped(many_async), dumped([one])):
        want = raw if len(got) == len(raw) else [raw_one]
        assert [[[c["token"] for c in m] for m in t] for t in got] == [
            [[c["token"] for c in m] for m in t] for t in want
        ]
        assert [[[c["sequence"] for c in m] for m in t] for t in got] == [
            [[c["sequence"] for c in m] for m in t] for t in want
        ]
        flat = [(a["score"], b["score"]) for t, u in zip(got, want) for m, n in zip(t, u) for a, b in zip(m, n)]
        assert max(abs(a - b) for a, b in flat) <= 1e-6


def test_a_special_token_proposed_shows_as_itself_in_token_str(masked_lm):
    """The pipeline's token_str is decode([token]): a candidate that is a special token ([UNK], [SEP]) reads as
    "[UNK]", never as an empty string that names no token."""
    import numpy as np
    from transformers import AutoTokenizer

    from bert.tasks.fill_mask import decode, encode
    from bert.tokenizer import BertTokenizer

    ours = BertTokenizer.from_dir(masked_lm)
    theirs = AutoTokenizer.from_pretrained(str(masked_lm))
    feature = encode(ours, ["the [MASK] sat ."])[0]
    ids = np.zeros((len(feature.input_ids), 4), dtype=np.int64)
    ids[:] = [theirs.unk_token_id, theirs.sep_token_id, theirs.convert_tokens_to_ids("cat"), 6290]  # 6290: ##zer
    scores = np.tile(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32), (len(feature.input_ids), 1))
    (candidates,) = decode(ours, feature, scores, ids, top_k=4)
    assert [c["token_str"] for c in candidates] == [theirs.decode([int(t)]) for t in ids[0]]
    assert [c["token_str"] for c in candidates] == ["[UNK]", "[SEP]", "cat", "##zer"]
