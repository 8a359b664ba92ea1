"""The two newest families (ModernBERT, DeBERTa-v3) where their long contexts and position schemes reach past
what a 512-position BERT exercises: an answer that does not depend on what a text is batched with, the packed
path's load-time probe reaching past ModernBERT's real 128-token window, and the exporter verifying a long-context
model without holding two rows of full-length attention scores at once.

Tiny random models made with transformers (initializer_range 0.2, so that inputs are told apart), compared with
transformers on the same weights.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_deberta as deberta  # noqa: E402
import test_modernbert as modernbert  # noqa: E402
from test_modernbert import batch, worst  # noqa: E402
from test_torch_packed import make_backend  # noqa: E402

from bert.checkpoint import load_for_inference  # noqa: E402


def deberta_checkpoint(directory, tokenizer_dir, **overrides):
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    return deberta.make_hf("ner", directory, tokenizer_dir, vocab, **overrides), vocab


@pytest.fixture(scope="module")
def deberta_tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deberta-tokenizer")
    deberta.train_tokenizer(directory, deberta.CORPUS + deberta.HARD_TEXTS * 2)
    return directory


# ---- a text's answer does not depend on what it is batched with -----------------------------------------------


@pytest.mark.parametrize("family", ["modernbert", "deberta"])
def test_a_short_text_answers_alike_alone_and_beside_a_long_one(family, tmp_path, deberta_tokenizer):
    """ModernBERT: a 16-token window (8 each way), short rows on either side of it beside rows far past it.
    DeBERTa-v3: 16 position buckets reaching 64, rows past both. Per-token logits of the short row alone, and of
    the same row padded beside a long one, equal transformers' (both attention implementations)."""
    if family == "modernbert":
        theirs, vocab = modernbert.make_hf("ner", tmp_path, max_position_embeddings=1024), modernbert.VOCAB
        pairs = [(7, 1000), (9, 40), (17, 300)]
    else:
        theirs, vocab = deberta_checkpoint(tmp_path, deberta_tokenizer, position_buckets=16, max_relative_positions=64)
        pairs = [(1, 512), (7, 100), (30, 300)]
    for implementation in ("sdpa", "eager"):
        model, report = load_for_inference(tmp_path)
        assert not report, report
        model.set_attention_implementation(implementation)
        for short, long in pairs:
            ids, mask = batch((short, long), seed=short, vocab=vocab)
            with torch.no_grad():
                together = model(ids, mask).outputs["ner_logits"][:1, :short]
                alone = model(ids[:1, :short], mask[:1, :short]).outputs["ner_logits"]
                expected = theirs(input_ids=ids[:1, :short], attention_mask=mask[:1, :short]).logits
            assert (together - alone).abs().max().item() <= 1e-5, (implementation, short, long)
            assert worst([alone], [expected], mask[:1, :short], per_token=True) <= 1e-5, (implementation, short)


# ---- the packed path's probe reaches past the window ---------------------------------------------------------


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A ModernBERT token classifier with the real models' window: local_attention 128 (64 each way)."""
    directory = tmp_path_factory.mktemp("modernbert-128")
    theirs = modernbert.make_hf("ner", directory, local_attention=128, max_position_embeddings=1024)
    return directory, theirs


def served_logits(backend, lengths=(300, 40)):
    ids, mask = batch(lengths)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": 0 * ids.numpy()}
    return torch.from_numpy(backend.run(feeds)["ner"]), ids, mask


def test_the_packed_path_serves_transformers_logits_past_the_window(windowed):
    directory, theirs = windowed
    backend = make_backend(directory, packed=True)
    assert backend.fast_path["packed"] is True, backend.fast_path
    got, ids, mask = served_logits(backend)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
    assert worst([got], [expected], mask, per_token=True) <= 2e-5


@pytest.mark.parametrize("misread", ["ignored", "one-short"])
def test_the_probe_turns_off_a_kernel_that_misreads_the_window(windowed, monkeypatch, misread):
    """The packed kernels bound a windowed layer's attention themselves (FlashAttention's window_size on CUDA).
    One that ignores the window, or bounds it a token short, must fail the load-time probe and leave the server
    on the padded path with transformers' answers; rows of at most 64 tokens never reach a 64-token window."""
    from runtime.backends import torch_backend

    reference = torch_backend.attention_reference

    def misreading(q, k, v, cu, max_len, cu_host=None, window=None):
        if window is not None:
            window = None if misread == "ignored" else window - 1
        return reference(q, k, v, cu, max_len, cu_host, window=window)

    misreading.__name__ = "attention_misreading"
    monkeypatch.setattr(torch_backend, "attention_reference", misreading)
    directory, theirs = windowed
    backend = make_backend(directory, packed=True)
    assert backend.fast_path["packed"] is False and backend.runner is None, backend.fast_path
    assert "attention_misreading" in backend.fast_path["notes"][0] and "differs" in backend.fast_path["notes"][0]
    got, ids, mask = served_logits(backend)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
    assert worst([got], [expected], mask, per_token=True) <= 1e-5


# ---- the exporter verifies a long-context model a row at a time ------------------------------------------------


def test_export_verifies_full_length_rows_one_at_a_time(tmp_path, monkeypatch):
    """python -m export.onnx with its default --max-seq (the model's 1,200 positions): the verification reaches
    the last position (the long row and a short row padded to it), each in a batch of its own, so that the
    unfused (batch, heads, T, T) attention scores of one row are the most it holds; the artifact's logits equal
    transformers' on a padded batch of mixed lengths."""
    import onnxruntime as ort

    from export import onnx as exporter
    from export import parity

    theirs = modernbert.make_hf("classify", tmp_path / "ckpt", max_position_embeddings=1200)
    seen = []
    for name in ("torch_outputs", "onnx_outputs"):
        original = getattr(parity, name)

        def recording(first, batches, *rest, _original=original):
            seen.extend((b["input_ids"].shape, int(b["attention_mask"].sum())) for b in batches)
            return _original(first, batches, *rest)

        monkeypatch.setattr(parity, name, recording)
    exporter.main(
        ["--ckpt", str(tmp_path / "ckpt"), "--task", "classify", "--out", str(tmp_path / "art"), "--precision", "fp32"]
    )
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["shape_range"]["max_seq"] == 1200 and manifest["parity"]["verified"] is True
    full = [(shape, tokens) for shape, tokens in seen if shape[1] == 1200]
    assert full and all(shape[0] == 1 for shape, _ in full), full
    assert {tokens == 1200 for _, tokens in full} == {True, False}  # the long row, and a short one padded to it
    assert all(shape[1] <= parity.ROW_BY_ROW_WIDTH for shape, _ in seen if shape[0] > 1)

    ids, mask = batch((1200, 300, 40))
    session = ort.InferenceSession(str(tmp_path / "art" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
    assert worst([torch.from_numpy(got[0])], [expected], mask, per_token=False) <= 1e-4
