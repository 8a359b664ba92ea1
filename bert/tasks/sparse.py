"""Sparse embeddings (SPLADE): one vocabulary-wide vector per text, from any masked-LM checkpoint.

The masked-LM logits of every real token go through log(1 + ReLU(x)) and are max-pooled over the tokens, inside
the model's graph (the head kind "splade", bert/heads.py): a backend hands back one (V,) vector per text. The vector
is sentence-transformers' `SparseEncoder` with `SpladePooling("max")` on the same weights.

Answers have text-embeddings-inference's /embed_sparse shape: per text, its nonzero entries `{index, value}` in index
order. A request may prune them (`threshold`: only values above it; `top_k`: only the largest k, still in index
order) and ask for each entry's vocabulary word (`return_tokens`: a "token" beside index and value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from bert.tasks.base import (
    MODEL,
    PROMPT_NAME,
    TEI_TRUNCATE,
    TRUNCATION_DIRECTION,
    Head,
    JobColumns,
    Param,
    Route,
    Task,
    check_inputs,
    column_of,
    declare_head_kind,
    tei_texts_of,
    texts_param,
)
from bert.tasks.common import Limits, ModelFacts
from bert.tasks.embed import encode_each

# one pooled (B, V) output per sequence, named after the task
SPLADE = declare_head_kind("splade", ("",), (2,), False)


@dataclass
class SparseValue:
    """One nonzero entry of a sparse vector (text-embeddings-inference's SparseValue), with its vocabulary word
    when the request asks for it."""

    index: int
    value: float
    token: Optional[str] = None


def entries(vector: np.ndarray, *, threshold: float = 0.0, top_k: int | None = None) -> np.ndarray:
    """The indices of a (V,) vector's entries above `threshold`, only the `top_k` largest of them when given (ties:
    the lower index), in index order."""
    kept = np.flatnonzero(vector > threshold)
    if top_k is not None and len(kept) > top_k:
        largest = np.argsort(-vector[kept], kind="stable")[:top_k]
        kept = np.sort(kept[largest])
    return kept


def decode(vector, tokenizer=None, *, threshold: float = 0.0, top_k: int | None = None) -> list[dict]:
    """A pooled (V,) vector -> its entries as {index, value} (and "token" when a tokenizer is given)."""
    vector = np.asarray(vector, dtype=np.float32)
    kept = entries(vector, threshold=threshold, top_k=top_k)
    values = vector[kept].tolist()
    if tokenizer is None:
        return [{"index": int(i), "value": v} for i, v in zip(kept.tolist(), values)]
    words = tokenizer.convert_ids_to_tokens(kept.tolist())
    return [{"index": int(i), "value": v, "token": w} for i, v, w in zip(kept.tolist(), values, words)]


def _columns(answers: list) -> dict[str, list]:
    return {
        "indices": column_of(answers, lambda a: [e["index"] for e in a]),
        "values": column_of(answers, lambda a: [e["value"] for e in a]),
    }


class SparseTask(Task):
    """SPLADE sparse embeddings over a masked-LM head (BertForMaskedLM, BertForPreTraining and the families' own
    masked-LM layouts), as text-embeddings-inference's /embed_sparse answers them."""

    name = "sparse"
    order = 65
    head = Head(SPLADE, attribute="cls", single_attribute="cls")
    architectures = ("BertForMaskedLM", "BertForPreTraining")
    graph_outputs = {"sparse_embedding": "sparse"}
    single_graph_outputs = {"sparse_embedding": "sparse"}
    routes = (
        Route(
            "/embed_sparse",
            "EmbedSparseRequest",
            list[list[SparseValue]],
            "Sparse (SPLADE) embeddings of texts (text-embeddings-inference's shape)",
            to_items=tei_texts_of,
            shape=lambda answers, body, info=None: answers,
            check=check_inputs,
            fields=(
                MODEL,
                texts_param("What is the capital of France?"),
                TEI_TRUNCATE,
                TRUNCATION_DIRECTION,
                PROMPT_NAME,
                Param(
                    "top_k",
                    Optional[int],
                    None,
                    "keep only the k largest entries of each vector (still in index order); at most the model's "
                    "vocabulary (422 beyond); default: every entry above `threshold`",
                    minimum=1,
                ),
                Param(
                    "threshold",
                    float,
                    0.0,
                    "keep only entries whose value is above this (0: every nonzero entry, as text-embeddings-inference)",
                    minimum=0.0,
                    job=True,
                ),
                Param("return_tokens", bool, False, 'give each entry its vocabulary word too ("token")'),
            ),
            doc="Per input, always a list of lists: the nonzero entries of the text's SPLADE vector (log(1 + ReLU) of "
            "the masked-LM logits, max-pooled over its tokens), as {index, value} in index order; pruned by "
            "`threshold` and `top_k`, each with its vocabulary word as `token` when `return_tokens`.",
        ),
    )
    job = JobColumns(
        inputs=("text",),
        arity=(1,),
        results=(("indices", ("list", "int32")), ("values", ("list", "float32"))),
        values=_columns,
    )

    def head_width(self, labels) -> int:
        return 0  # the tied decoder's width is the vocabulary

    def encode_request(
        self,
        tokenizer,
        items: list,
        limits: Limits,
        *,
        truncate: bool = False,
        truncation_direction: str = "right",
        top_k: int | None = None,
        **_,
    ):
        if top_k is not None and top_k > tokenizer.vocab_size:
            raise ValueError(f"top_k: {top_k} is more than this model's vocabulary ({tokenizer.vocab_size} tokens)")
        return encode_each(tokenizer, items, limits, truncate=truncate, truncation_direction=truncation_direction)

    def decode_request(
        self,
        items,
        features,
        outputs,
        facts: ModelFacts,
        *,
        threshold: float = 0.0,
        top_k: int | None = None,
        return_tokens: bool = False,
        **_,
    ):
        tokenizer = facts.tokenizer if return_tokens else None
        return [decode(o[0]["sparse"], tokenizer, threshold=threshold, top_k=top_k) for o in outputs]


TASK = SparseTask()
