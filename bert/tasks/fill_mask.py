"""Fill-mask: the masked-LM head of a pretraining checkpoint proposes tokens for each [MASK] of a text.

Answers carry transformers' fill-mask pipeline's fields (`score`, `token`, `token_str`, `sequence`), best first,
one list per [MASK]. The model's graph hands back, for every token, the probabilities and ids of its
likeliest tokens (MLM_CANDIDATES of them, softmax over the whole vocabulary), so `top_k` is at most that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from bert.tasks import classify
from bert.tasks.base import (
    MLM_CANDIDATES,
    MODEL,
    TRUNCATE,
    Head,
    JobColumns,
    Param,
    Route,
    Task,
    TaskOption,
    check_inputs,
    described,
    texts_of,
    texts_param,
)
from bert.tasks.common import Features, Limits, ModelFacts


@dataclass
class MaskCandidate:
    """A token proposed for one [MASK] of a text."""

    score: float
    token: int
    token_str: str
    sequence: str = described("the text with this [MASK] filled")


class NoMaskToken(ValueError):
    """A fill-mask input without the mask token: nothing to fill."""


def encode(tokenizer, texts: list[str], *, max_length: int = 512, truncate: bool = False) -> list[Features]:
    """Texts -> Features ([CLS] text [SEP]); each must hold at least one mask token after tokenising (a cut
    that drops every mask is refused too)."""
    mask = tokenizer.mask_token_id
    if mask is None:
        raise NoMaskToken("this model's tokenizer has no mask token")
    features = classify.encode(tokenizer, list(texts), max_length=max_length, truncate=truncate)
    for index, feature in enumerate(features):
        if mask not in feature.input_ids:
            where = "inputs" if len(features) == 1 else f"inputs[{index}]"
            token = tokenizer.convert_ids_to_tokens(mask)[0]
            if len(feature.input_ids) >= max_length and token in texts[index]:  # written, but truncate cut it off
                raise NoMaskToken(
                    f"{where}: its {token} tokens lie past the model's {max_length} tokens, and truncate cut them "
                    f"off: nothing left to fill (put a {token} nearer the start, or send a shorter text)"
                )
            raise NoMaskToken(f"{where} has no {token} token to fill")
    return features


def decode(tokenizer, feature: Features, scores: np.ndarray, ids: np.ndarray, *, top_k: int = 5) -> list[list[dict]]:
    """One sequence's (T, K) probabilities and token ids -> per mask token, its `top_k` candidates best first.
    `sequence` is the text with that mask filled, decoded as the pipeline does: [PAD] ids left out (a [PAD]
    proposed included), special tokens skipped when the text has one mask, kept (so the other masks show) when it
    has several."""
    input_ids = np.asarray(feature.input_ids)
    pad = tokenizer.pad_token_id
    masks = np.flatnonzero(input_ids == tokenizer.mask_token_id)
    single = len(masks) == 1
    answers = []
    for position in masks:
        candidates = []
        for score, token in zip(scores[position][:top_k], ids[position][:top_k]):
            filled = input_ids.copy()
            filled[position] = int(token)
            if pad is not None:
                filled = filled[filled != pad]
            candidates.append(
                {
                    "score": float(score),
                    "token": int(token),
                    # the pipeline's decode([token]): a special token proposed ("[UNK]", "[SEP]") shows as itself,
                    # never as ""
                    "token_str": tokenizer.decode([int(token)], skip_special_tokens=False),
                    "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=single),
                }
            )
        answers.append(candidates)
    return answers


CANDIDATE_COLUMNS = (("token", "int64"), ("token_str", "string"), ("score", "float32"), ("sequence", "string"))


class FillMaskTask(Task):
    """transformers' fill-mask pipeline over a masked-LM head (BertForMaskedLM, BertForPreTraining)."""

    name = "fill_mask"
    order = 60
    head = Head("mlm", attribute="cls", single_attribute="cls")
    architectures = ("BertForMaskedLM", "BertForPreTraining")
    graph_outputs = {"fill_mask_scores": "fill_mask_scores", "fill_mask_ids": "fill_mask_ids"}
    single_graph_outputs = {"fill_mask_scores": "fill_mask_scores", "fill_mask_ids": "fill_mask_ids"}
    routes = (
        Route(
            "/fill-mask",
            "FillMaskRequest",
            # a text: one list of candidates per [MASK]; a list of texts: that, per text
            Union[list[list[MaskCandidate]], list[list[list[MaskCandidate]]]],
            "Fill the [MASK] tokens of texts",
            to_items=texts_of,
            shape=lambda answers, body, info=None: answers[0] if isinstance(body.inputs, str) else answers,
            check=check_inputs,
            fields=(
                MODEL,
                texts_param(
                    "Paris is the [MASK] of France.", help="a text or a list of texts, each with [MASK] tokens"
                ),
                Param(
                    "top_k", int, 5, "candidates per [MASK], best first", minimum=1, maximum=MLM_CANDIDATES, job=True
                ),
                TRUNCATE,
            ),
            doc="The masked-LM head's proposals for each [MASK] token, best first, with transformers' fill-mask "
            "fields {score, token, token_str, sequence}: for a text, one list per [MASK]; for a list of texts, that "
            "per text. A text without a [MASK] is a 422.",
        ),
    )
    job = JobColumns(
        inputs=("text",),
        arity=(1,),
        results=(("masks", ("list", ("list", ("struct", CANDIDATE_COLUMNS)))),),
        values=lambda answers: {"masks": answers},
    )

    def head_width(self, labels) -> int:
        return 0  # the tied decoder's width is the vocabulary

    def encode_request(self, tokenizer, items: list, limits: Limits, *, truncate: bool = False, **_):
        return [[f] for f in encode(tokenizer, items, max_length=limits.max_length, truncate=truncate)]

    def decode_request(self, items, features, outputs, facts: ModelFacts, *, top_k: int = 5, **_):
        if top_k > MLM_CANDIDATES:
            raise ValueError(f"top_k: at most {MLM_CANDIDATES}")
        return [
            decode(facts.tokenizer, f[0], o[0]["fill_mask_scores"], o[0]["fill_mask_ids"], top_k=top_k)
            for f, o in zip(features, outputs)
        ]

    def margins(self, items, features, outputs, facts: ModelFacts, **_):
        return margins(facts.tokenizer, features, outputs)

    verify_margin = TaskOption(
        "verify_margin",
        0.1,
        "recompute a text where a mask's best token's probability leads the second's by less than this (0-1)",
        minimum=0,
        maximum=1,
    )


def margins(tokenizer, features: list, outputs: list) -> list[float]:
    """Per text, how sure its best tokens are: the smallest lead, over its masks, of the best candidate's probability
    over the second's (1.0 for a text without a mask). A slightly perturbed model (int8) changes a mask's best token
    only where this is small; the engine recomputes those texts on an exact model (--fill-mask-verify-model)."""
    found = []
    for f, o in zip(features, outputs):
        masks = np.flatnonzero(np.asarray(f[0].input_ids) == tokenizer.mask_token_id)
        scores = np.asarray(o[0]["fill_mask_scores"], dtype=np.float32)[masks]
        found.append(float((scores[:, 0] - scores[:, 1]).min()) if len(masks) and scores.shape[1] > 1 else 1.0)
    return found


TASK = FillMaskTask()
