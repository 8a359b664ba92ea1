"""Tiny models for the compat tests (random-init, written by transformers): a masked LM, an NLI classifier and a
one-output cross-encoder, each with all-MiniLM-L6-v2's tokenizer. No tests here."""

from __future__ import annotations

import pytest
from test_serving_support import minilm_dir


def tiny_bert(directory, kind: str, id2label: dict | None = None, seed: int = 0, max_positions: int = 128):
    import torch
    import transformers

    labels = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        initializer_range=0.2,
        **labels,
    )
    torch.manual_seed(seed)
    getattr(transformers, kind)(config).eval().save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), model_max_length=max_positions).save_pretrained(
        directory
    )
    return directory


@pytest.fixture(scope="session")
def compat_models(tmp_path_factory):
    """{"mlm", "nli", "reranker"}: directories of tiny models."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("compat-models")
    return {
        "mlm": tiny_bert(root / "mlm", "BertForMaskedLM"),
        "nli": tiny_bert(
            root / "nli", "BertForSequenceClassification", {0: "entailment", 1: "neutral", 2: "contradiction"}
        ),
        "reranker": tiny_bert(root / "reranker", "BertForSequenceClassification", {0: "LABEL_0"}, seed=1),
    }
