"""Extractive question answering: question + (long) context in, character spans of the context out.

Windows: the question is segment A (at most `max_query_length` tokens) and the context segment B,
cut into overlapping windows of at most `max_length` tokens. `doc_stride` is the number of context
tokens two neighbouring windows share (Hugging Face's meaning, not google's step size); the windows
are exactly those of BertTokenizerFast(question, context, truncation="only_second", stride=doc_stride,
return_overflowing_tokens=True). No context token is ever dropped.

Decoding reproduces transformers' QuestionAnsweringPipeline (v4): per window a softmax over the
logits with everything but [CLS] and the context masked, the start x end outer product limited to
0 <= end - start < max_answer_len, a top-k search, answers widened to whole words, identical answer
texts from different windows merged by adding their scores.
"""

from __future__ import annotations

import collections
import json
import os
import re
import string
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from pathlib import Path
from typing import Optional, Union

import numpy as np

from bert.options import flag
from bert.tasks.base import (
    MODEL,
    Head,
    JobColumns,
    Labels,
    Param,
    Route,
    Task,
    TaskOption,
    check_texts,
    column_of,
    described,
)
from bert.tasks.common import (
    CallerGone,
    DataError,
    Features,
    Limits,
    ModelFacts,
    PathLike,
    bounded_text,
    open_text,
    whole_span,
)
from bert.tasks.windows import (
    LongInputs,
    TooManyWindows,
    max_text_tokens,
    pair_template,
    too_much_work,
    window_count,
    window_ranges,
)

MASKED_LOGIT = -10000.0  # what the pipeline writes over question/special-token logits before the softmax
NO_ANSWER_SENTINEL = 1000000.0  # the pipeline's starting "minimum null score"


@dataclass
class Answer:
    """A span of the context that answers the question."""

    answer: str
    score: float
    start: int = described("character offset into the context")
    end: int


@dataclass
class QaWindow(Features):
    offsets: list[tuple[int, int] | None]  # character span in the CONTEXT of each context token; None elsewhere
    token_is_max_context: list[bool]  # True where this window gives the token its widest surroundings
    window_index: int
    word_ids: list[int | None] = field(default_factory=list)  # context word of each context token; None elsewhere
    context_token_start: int = 0  # index, in the whole context's tokens, of this window's first context token

    # Computed once per window (decoding asks for them per candidate span); a window is not changed once built.
    @cached_property
    def context_positions(self) -> range:
        """Positions of the context tokens in this window's input_ids."""
        first = next((i for i, o in enumerate(self.offsets) if o is not None), len(self.offsets))
        count = len(self.offsets) - self.offsets.count(None)
        return range(first, first + count)

    @cached_property
    def word_chars(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per context word, the start character of its first token in this window and the end character of its
        last: the word as far as this window holds it."""
        positions = self.context_positions
        words = self.word_ids[positions.start : positions.stop]
        offsets = self.offsets[positions.start : positions.stop]
        # dict() keeps the last value of a repeated key: reversed, that is the word's first token
        first = dict(zip(reversed(words), map(itemgetter(0), reversed(offsets))))
        last = dict(zip(words, map(itemgetter(1), offsets)))
        return first, last


# ---- windows (their arithmetic is every long-input task's: bert/tasks/windows.py) ------------------------
class QuestionTooLong(ValueError):
    """The question has more tokens than a window keeps for it and the caller did not ask to cut it."""

    def __init__(self, length: int | None, limit: int):
        self.length = length
        self.limit = limit
        has = f"more than {limit}" if length is None else str(length)
        super().__init__(
            f'the question has {has} tokens; at most {limit} fit in a window (send "truncate": true to cut it)'
        )


def max_context_owner(ranges: list[tuple[int, int]], num_tokens: int) -> list[int]:
    """For each context token, the window where it has the most context on its shorter side.

    google-research/bert run_squad `_check_is_max_context`: score = min(tokens left, tokens right)
    + 0.01 * window length; the first window wins a tie.
    """
    owner = [0] * num_tokens
    if len(ranges) == 1:  # one window: it owns every token (most contexts; the scoring is pure Python)
        return owner
    best = [-1.0] * num_tokens
    for index, (start, stop) in enumerate(ranges):
        length = stop - start
        for position in range(start, stop):
            score = min(position - start, stop - 1 - position) + 0.01 * length
            if score > best[position]:
                best[position], owner[position] = score, index
    return owner


def _check_window_args(question_length: int, max_length: int, doc_stride: int, specials: int = 3) -> int:
    capacity = max_length - question_length - specials  # [CLS] question [SEP] context [SEP]: 3
    if capacity <= 0:
        raise ValueError(
            f"max_length {max_length} leaves no room for the context after a {question_length}-token question"
        )
    if doc_stride >= capacity:
        raise ValueError(
            f"doc_stride {doc_stride} must be smaller than the {capacity} context tokens "
            f"a window holds (max_length {max_length}, question {question_length} tokens)"
        )
    if doc_stride < 0:
        raise ValueError(f"doc_stride must be >= 0, got {doc_stride}")
    return capacity


def encode(
    tokenizer,
    question: str,
    context: str,
    *,
    max_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    truncate_question: bool = True,
    max_windows: int | None = None,
) -> list[QaWindow]:
    """One QaWindow per overlapping slice of the context: [CLS] question [SEP] slice [SEP].

    The question keeps its first `max_query_length` tokens (google's run_squad), or with
    `truncate_question=False` a longer one raises QuestionTooLong. With `max_windows`, a context needing
    more windows raises TooManyWindows after tokenising at most what that many windows hold, before any
    window is built: the cost of refusing a huge context is bounded by the limit, not by the context."""
    question, question_cut = bounded_text(tokenizer, question, max_query_length)
    question_ids = list(tokenizer.encode_batch([question], add_special_tokens=False)[0].ids)
    if len(question_ids) > max_query_length and not truncate_question:
        raise QuestionTooLong(None if question_cut else len(question_ids), max_query_length)
    question_ids = question_ids[:max_query_length]
    capacity = _check_window_args(
        len(question_ids), max_length, doc_stride, sum(len(part) for part in pair_template(tokenizer)[:3])
    )
    if max_windows is not None:
        _, context_cut = bounded_text(tokenizer, context, max_text_tokens(max_windows, capacity, doc_stride))
        if context_cut:
            raise TooManyWindows(None, max_windows)
    context_encoding = tokenizer.encode_batch([context], add_special_tokens=False)[0]
    context_ids = context_encoding.ids
    if max_windows is not None and window_count(len(context_ids), capacity, doc_stride) > max_windows:
        raise TooManyWindows(window_count(len(context_ids), capacity, doc_stride), max_windows)
    context_offsets = context_encoding.offsets  # a new list of (start, end) tuples at each read
    context_words = context_encoding.word_ids
    ranges = window_ranges(len(context_ids), capacity, doc_stride)
    owner = max_context_owner(ranges, len(context_ids))

    # [CLS] question [SEP] context [SEP] for BERT, <s> question </s></s> context </s> for RoBERTa: the template's
    before, between, after, context_type = pair_template(tokenizer)
    head = [*before, *question_ids, *between]
    windows = []
    for index, (start, stop) in enumerate(ranges):
        width = stop - start
        outside = [None] * len(head)
        tail = [None] * len(after)
        windows.append(
            QaWindow(
                input_ids=head + list(context_ids[start:stop]) + list(after),
                token_type_ids=[0] * len(head) + [context_type] * (width + len(after)),
                offsets=outside + context_offsets[start:stop] + tail,
                token_is_max_context=[False] * len(head)
                + [owner[p] == index for p in range(start, stop)]
                + [False] * len(after),
                window_index=index,
                word_ids=outside + list(context_words[start:stop]) + tail,
                context_token_start=start,
            )
        )
    return windows


def train_features(
    tokenizer,
    question: str,
    context: str,
    answer_start_char: int,
    answer_text: str,
    *,
    max_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> list[tuple[QaWindow, int, int]]:
    """Windows with the answer's start/end token positions in each; (0, 0) = [CLS] where the window
    does not hold the whole answer (the usual SQuAD v1 training target)."""
    windows = encode(
        tokenizer, question, context, max_length=max_length, doc_stride=doc_stride, max_query_length=max_query_length
    )
    answer_end_char = answer_start_char + len(answer_text)
    if not answer_text or context[answer_start_char:answer_end_char] != answer_text:
        raise ValueError(f"answer {answer_text!r} is not at character {answer_start_char} of the context")
    # The answer's first and last token, counted over the whole context.
    covering = [
        window.context_token_start + i
        for window in windows
        for i, p in enumerate(window.context_positions)
        if window.offsets[p][0] < answer_end_char and window.offsets[p][1] > answer_start_char
    ]
    if not covering:
        raise ValueError(f"answer {answer_text!r} covers no context token")
    first_token, last_token = min(covering), max(covering)
    examples = []
    for window in windows:
        positions = window.context_positions
        lo, hi = window.context_token_start, window.context_token_start + len(positions) - 1
        if lo <= first_token and last_token <= hi:
            examples.append((window, positions[first_token - lo], positions[last_token - lo]))
        else:
            examples.append((window, 0, 0))
    return examples


# ---- decoding ---------------------------------------------------------------------------------
def _probabilities(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Softmax over the allowed positions (others pushed to MASKED_LOGIT first), as the pipeline does."""
    masked = np.where(allowed, logits, MASKED_LOGIT)
    exp = np.exp(masked - masked.max(axis=-1, keepdims=True))
    return exp / exp.sum()


def best_spans(
    start_probs: np.ndarray, end_probs: np.ndarray, top_k: int, max_answer_len: int, allowed: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top_k (start, end) token pairs by start_prob * end_prob, 0 <= end - start < max_answer_len,
    keeping only pairs whose ends are both allowed. Returns starts, ends, scores (best first).

    The pipeline's answer (transformers' `decode_spans`) from the band of pairs it can pick: (T, max_answer_len)
    products instead of its T x T outer product. Where ties among the best leave its choice to the order of
    numpy's partition, its own search runs instead (`pipeline_spans`), so that the answer is always its answer."""
    found = _band_spans(start_probs, end_probs, top_k, max_answer_len)
    if found is None:
        return pipeline_spans(start_probs, end_probs, top_k, max_answer_len, allowed)
    starts, ends, scores = found
    allowed = np.asarray(allowed, dtype=bool)
    keep = allowed[starts] & allowed[ends]
    return starts[keep], ends[keep], scores[keep]


def _band_spans(
    start_probs: np.ndarray, end_probs: np.ndarray, top_k: int, max_answer_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The top_k pairs of the band 0 <= end - start < max_answer_len, best first, when they are the pipeline's
    without doubt: all positive, all different, and above every other pair (the pairs outside the band score 0).
    None otherwise (ties, NaN, no band, or fewer than top_k + 1 pairs in all)."""
    length = len(start_probs)
    if (
        length * length <= top_k
        or max_answer_len < 1
        or not (np.isfinite(start_probs).all() and np.isfinite(end_probs).all())
    ):
        return None
    width = min(max_answer_len, length)
    # band[i, d] = start_probs[i] * end_probs[i + d]; 0 past the end, as the pairs outside the band
    padded = np.concatenate([end_probs, np.zeros(width - 1, end_probs.dtype)])
    ends = np.lib.stride_tricks.as_strided(padded, (length, width), (padded.strides[0],) * 2, writeable=False)
    band = (start_probs[:, None] * ends).ravel()
    if band.size <= top_k:
        return None
    kth = band.size - top_k - 1
    best = np.argpartition(band, kth)[kth:]  # the top_k + 1 largest, in no order
    best = best[np.argsort(-band[best], kind="stable")]
    scores = band[best]
    top = scores[:top_k]
    if not (top[-1] > 0 and top[-1] > scores[top_k] and (top[:-1] > top[1:]).all()):
        return None
    starts = best[:top_k] // width
    return starts, starts + best[:top_k] % width, top


def pipeline_spans(
    start_probs: np.ndarray, end_probs: np.ndarray, top_k: int, max_answer_len: int, allowed: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """best_spans as the pipeline computes it (transformers' `decode_spans`): over the whole T x T outer product,
    its ties broken by numpy's partition and sort."""
    # (1, T, T) like the pipeline, so ties between equal scores are broken identically.
    outer = np.matmul(start_probs[None, :, None], end_probs[None, None, :])
    candidates = np.tril(np.triu(outer), max_answer_len - 1)
    flat = candidates.flatten()
    if top_k == 1:
        order = [np.argmax(flat)]
    elif len(flat) <= top_k:
        order = np.argsort(-flat)
    else:
        chosen = np.argpartition(-flat, top_k)[0:top_k]
        order = chosen[np.argsort(-flat[chosen])]
    starts, ends = np.unravel_index(order, candidates.shape)[1:]
    allowed_positions = np.flatnonzero(allowed)
    keep = np.isin(starts, allowed_positions) & np.isin(ends, allowed_positions)
    starts, ends = starts[keep], ends[keep]
    return starts, ends, candidates[0, starts, ends]


def span_to_chars(window: QaWindow, start: int, end: int) -> tuple[int, int]:
    """Token span -> character span of the context, widened to whole words.

    A span that begins at [CLS] (score 0 unless nothing better exists) keeps raw token offsets,
    [CLS] counting as (0, 0): that is the pipeline's fallback when a token has no word.
    """
    if window.word_ids[start] is None or window.word_ids[end] is None:
        raw = [o if o is not None else (0, 0) for o in (window.offsets[start], window.offsets[end])]
        return raw[0][0], raw[1][1]
    first_chars, last_chars = window.word_chars
    return first_chars[window.word_ids[start]], last_chars[window.word_ids[end]]


def decode(
    context: str,
    windows: list[QaWindow],
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    *,
    top_k: int = 1,
    max_answer_len: int = 30,
    handle_impossible_answer: bool = False,
    whole_chars: bool = False,
) -> list[dict]:
    """Best answers over all windows: [{"answer", "score", "start", "end"}] (character offsets into
    `context`), best first, at most top_k. Logits per window may be padded; rows beyond the window are ignored.

    With `whole_chars` no answer splits a character from its combining marks (`whole_span`, as /ner's entities):
    an uncased tokenizer strips the accent of an NFD "Bogota\u0301" from its piece's offsets, and the pipeline's
    answer is then "Bogota"; here it is the word as written. Answers are merged by their text after widening."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if max_answer_len < 1:
        raise ValueError(f"max_answer_len must be >= 1, got {max_answer_len}")
    if not (len(windows) == len(start_logits) == len(end_logits)):
        raise ValueError(f"{len(windows)} windows but {len(start_logits)} start and {len(end_logits)} end logits")
    # Extra candidates per window: some collapse into the same words or the same answer text.
    candidates_per_window = top_k * 2 + 10
    null_score = NO_ANSWER_SENTINEL
    answers: list[dict] = []
    by_text: dict[str, dict] = {}  # lower-cased answer text -> its (first) answer
    for window, start, end in zip(windows, start_logits, end_logits):
        allowed = np.zeros(len(window), dtype=bool)  # the context tokens (those with offsets) ...
        allowed[window.context_positions.start : window.context_positions.stop] = True
        allowed[0] = True  # ... and [CLS], whose probability is the no-answer score
        start_probs = _probabilities(_as_float(start)[: len(window)], allowed)
        end_probs = _probabilities(_as_float(end)[: len(window)], allowed)
        if handle_impossible_answer:
            null_score = min(null_score, (start_probs[0] * end_probs[0]).item())
        start_probs[0] = end_probs[0] = 0.0
        for s, e, score in zip(*best_spans(start_probs, end_probs, candidates_per_window, max_answer_len, allowed)):
            if not score > 0:  # [CLS] or a pair outside the band: the pipeline's filler when too few spans exist
                continue
            char_start, char_end = span_to_chars(window, int(s), int(e))
            if whole_chars:
                char_start, char_end = whole_span(context, char_start, char_end)
            text = context[char_start:char_end]
            same = by_text.get(text.lower())
            if same is not None:
                same["score"] += score.item()
            else:
                answers.append({"answer": text, "score": score.item(), "start": char_start, "end": char_end})
                by_text[text.lower()] = answers[-1]
    if handle_impossible_answer:
        answers.append({"answer": "", "score": null_score, "start": 0, "end": 0})
    return sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]


def _as_float(logits) -> np.ndarray:
    logits = np.asarray(logits)
    if logits.ndim == 2 and logits.shape[0] == 1:
        logits = logits[0]
    return logits if logits.dtype in (np.float32, np.float64) else logits.astype(np.float32)


# ---- serving ------------------------------------------------------------------------------------
LONG_INPUTS = LongInputs(
    merge="the best spans over all windows; the same answer text from several windows adds its scores",
    stride_field="doc_stride",
)


def window_limits(limits: Limits) -> tuple[int, int, int]:
    """(tokens per window, question tokens kept, context tokens the narrowest window holds) under these limits."""
    max_length = min(limits.qa_max_length, limits.max_length)
    max_query = min(limits.qa_max_question_length, max_length // 2)
    return max_length, max_query, max_length - max_query - 3


def encode_request(
    tokenizer, items: list[dict], limits: Limits, *, cancelled=lambda: False, **_
) -> list[list[QaWindow]]:
    """Items {question, context, doc_stride?, truncate?} -> the windows of each, at most
    limits.max_sequences in all (TooMuchWork beyond, raised before the windows are built)."""
    max_length, max_query, capacity = window_limits(limits)
    strides = [
        LONG_INPUTS.stride(
            item.get("doc_stride"), capacity, max_length, f"[{index}].doc_stride" if len(items) > 1 else "doc_stride"
        )
        for index, item in enumerate(items)
    ]
    windows, used, limit = [], 0, limits.max_sequences
    for item, stride in zip(items, strides):
        if cancelled():  # the caller has gone: stop working for it
            raise CallerGone()
        try:
            item_windows = encode(
                tokenizer,
                item["question"],
                item["context"],
                max_length=max_length,
                doc_stride=stride,
                max_query_length=max_query,
                truncate_question=bool(item.get("truncate")),
                max_windows=limit - used,
            )
        except TooManyWindows as e:
            raise too_much_work(e.needed, used, limit, max_length, "contexts") from None
        used += len(item_windows)
        windows.append(item_windows)
    return windows


def decode_request(items: list[dict], windows: list, outputs: list, facts: ModelFacts, **_) -> list[list[dict]]:
    """Per item its answers, best first (one empty answer when no span qualifies); no answer ends between a letter
    and its combining marks (decode's `whole_chars`)."""
    answers = []
    for item, item_windows, sequences in zip(items, windows, outputs):
        found = decode(
            item["context"],
            item_windows,
            [s["qa_start"] for s in sequences],
            [s["qa_end"] for s in sequences],
            top_k=item.get("top_k", 1),
            max_answer_len=item.get("max_answer_len", 30),
            whole_chars=True,
        )
        answers.append(found or [{"answer": "", "score": 0.0, "start": 0, "end": 0}])
    return answers


def margins(items: list[dict], windows: list, outputs: list, facts: ModelFacts, **_) -> list[float]:
    """Per item, how far its best answer's score leads the second best's (1.0 when nothing competes):
    how sure these logits are. A slightly perturbed model (int8) changes the answer only where this is small;
    the engine recomputes those items on an exact model (--qa-verify-model)."""
    found = []
    for item, item_windows, sequences in zip(items, windows, outputs):
        best = decode(
            item["context"],
            item_windows,
            [s["qa_start"] for s in sequences],
            [s["qa_end"] for s in sequences],
            top_k=2,
            max_answer_len=item.get("max_answer_len", 30),
            whole_chars=True,
        )
        found.append(best[0]["score"] - (best[1]["score"] if len(best) > 1 else 0.0) if best else 1.0)
    return found


def _qa_items(body) -> tuple[list, dict]:
    """One {question, context, ...} object or a list of them: one item each, its options inside it."""
    items = body if isinstance(body, list) else [body]
    return [item.model_dump() for item in items], {}


def _check_qa(body, info=None) -> None:
    single = not isinstance(body, list)
    items = [body] if single else body
    for name in ("question", "context"):
        check_texts([getattr(item, name) for item in items], name if single else "[{}]." + name)


def _shape_qa(answers: list, body, info=None):
    """An item asking for top_k 1 gets its answer, more gets the list; a single object gets its entry alone."""
    items = body if isinstance(body, list) else [body]
    shaped = [a[0] if item.top_k == 1 else a for item, a in zip(items, answers)]
    return shaped if isinstance(body, list) else shaped[0]


def _job_item(texts: list[str], options: dict) -> dict:
    """A batch job's row (question, context) as a request's item, with the job's options."""
    item = {"question": texts[0], "context": texts[1], "top_k": 1, "max_answer_len": options["max_answer_len"]}
    if options.get("doc_stride") is not None:
        item["doc_stride"] = options["doc_stride"]
    if options.get("truncate"):
        item["truncate"] = True
    return item


# SQuAD data has no dev set of its own here: qa's and rerank's readers hold out its last articles.
HELDOUT_ARTICLES = TaskOption(
    "heldout_articles",
    0,
    "qa: hold out the last N articles of the training data for evaluation (never trained on)",
    minimum=0,
    evaluate=False,  # evaluate's own --heldout-articles evaluates on that tail
)


class QATask(Task):
    """Extractive question answering: the best spans of a context, windowed with a doc stride, never cut."""

    name = "qa"
    order = 30
    head = Head("span", attribute="qa_outputs", single_attribute="qa_outputs", width=2)
    architectures = ("BertForQuestionAnswering",)
    graph_outputs = {"qa_start_logits": "qa_start", "qa_end_logits": "qa_end"}
    single_graph_outputs = {"start_logits": "qa_start", "end_logits": "qa_end"}
    routes = (
        Route(
            "/qa",
            "QARequest",
            # one item: an answer (a list of answers when top_k > 1); a list of items: one entry per item, and items
            # may mix top_k 1 and top_k > 1
            Union[Answer, list[Union[Answer, list[Answer]]]],
            "Answer questions from a context",
            to_items=_qa_items,
            shape=_shape_qa,
            check=_check_qa,
            batch_field="body",
            many=True,
            fields=(
                MODEL,
                Param("question", str, min_length=1, examples=("Where do I live?",)),
                Param("context", str, min_length=1, examples=("My name is Wolfgang and I live in Berlin.",)),
                Param("top_k", int, 1, "answers to return; more than 1 gives a list", minimum=1, maximum=100),
                Param("max_answer_len", int, 30, "longest answer in tokens", minimum=1, maximum=512, job=True),
                Param(
                    "doc_stride",
                    Optional[int],
                    None,
                    "context tokens shared by neighbouring windows of a long context (default 128, or less where "
                    "windows are narrower); at most half a window",
                    minimum=0,
                    job=True,
                ),
                Param(
                    "truncate",
                    bool,
                    False,
                    "cut a question longer than a window keeps for it instead of refusing it; contexts are never "
                    "cut, they are windowed",
                ),
            ),
            doc="One {question, context}: an answer {answer, score, start, end} (a list of answers when top_k > 1). "
            "A list of them: one entry per item, each as above. Long contexts are windowed (doc_stride), never cut.",
        ),
    )
    job = JobColumns(
        inputs=("question", "context"),
        arity=(2,),
        results=(("answer", "string"), ("score", "float32"), ("start", "int32"), ("end", "int32")),
        values=lambda answers: {
            key: column_of(answers, lambda a, key=key: a[0][key]) for key in ("answer", "score", "start", "end")
        },
        to_item=lambda texts, options: _job_item(texts, options),
        options=lambda o: {},  # each item carries its own
    )
    calibration = "question_contexts"
    long_inputs = LONG_INPUTS
    trainable = True
    main_metric = "f1"
    serve_options = (
        TaskOption("max_length", 384, "tokens per QA window (question + context piece)", minimum=16),
        TaskOption("max_question_length", 64, "question tokens kept in each QA window", minimum=1),
    )

    def serve_problems(self, values: dict) -> list[str]:
        if values["max_question_length"] + 3 >= values["max_length"]:
            return [
                f"qa_max_length ({values['max_length']}) must leave room for the context after a "
                f"{values['max_question_length']}-token question"
            ]
        return []

    def max_doc_stride(self, values: dict) -> int:
        """Half the context room of a window ([CLS] question [SEP] context [SEP]): see window_limits."""
        return (values["max_length"] - values["max_question_length"] - 3) // 2

    def encode_request(self, tokenizer, items, limits, **options):
        return encode_request(tokenizer, items, limits, **options)

    def decode_request(self, items, features, outputs, facts, **options):
        return decode_request(items, features, outputs, facts, **options)

    def decisions(self, items, answers):
        return [a[0]["answer"] for a in answers]  # the best answer's text

    def margins(self, items, features, outputs, facts, **options):
        return margins(items, features, outputs, facts, **options)

    verify_margin = TaskOption(
        "verify_margin",
        0.1,
        "recompute a question whose best answer's score leads the second's by less than this (scores are "
        "probabilities, 0-1)",
        minimum=0,
        maximum=1,
    )

    # ---- training hooks: SQuAD questions (QAExample), windowed --------------------
    train_options = (
        TaskOption("doc_stride", 128, "qa: context tokens neighbouring windows share", minimum=1),
        TaskOption("max_query_length", 64, "qa: questions are cut to this many tokens", minimum=1),
        TaskOption("max_answer_length", 30, "qa: longest predicted answer, in tokens", minimum=1),
        HELDOUT_ARTICLES,
    )
    train_max_seq_length = 384
    train_data_help = "SQuAD JSON / .gz / directory / comma-separated parts"

    def train_problems(self, cfg) -> list[str]:
        problems = []
        if not cfg.eval_data and cfg.heldout_articles <= 0:
            problems.append(f"{flag(cfg, 'eval_data')} is required (for qa, or --heldout-articles N)")
        if cfg.max_seq_length <= cfg.max_query_length + 3:
            problems.append(
                f"{flag(cfg, 'max_seq_length')} ({cfg.max_seq_length}) must exceed max_query_length + 3 "
                f"({cfg.max_query_length + 3}): [CLS] question [SEP] context [SEP] needs room"
            )
        elif cfg.doc_stride >= cfg.max_seq_length - cfg.max_query_length - 3:
            problems.append(
                f"doc_stride ({cfg.doc_stride}) must be smaller than the context room "
                f"{flag(cfg, 'max_seq_length')} - max_query_length - 3 = {cfg.max_seq_length - cfg.max_query_length - 3}"
            )
        return problems

    def read_examples(self, cfg, *, train: bool = True) -> tuple[list, list]:
        """--eval-data's questions, or those of the last --heldout-articles articles of --train-data (SQuAD v1.1
        dev is not in shared/data); training never sees a held-out article."""
        train_articles, heldout = [], []
        if train or not cfg.eval_data:
            train_articles, heldout = split_heldout(read_squad_articles(cfg.train_data), cfg.heldout_articles)
        evaluation = squad_examples(read_squad_articles(cfg.eval_data)) if cfg.eval_data else squad_examples(heldout)
        return (squad_examples(train_articles) if train else []), evaluation

    def encode_train(self, tokenizer, examples: list, labels: Labels, cfg) -> tuple[list, list]:
        return train_windows(
            tokenizer,
            examples,
            max_seq_length=cfg.max_seq_length,
            doc_stride=cfg.doc_stride,
            max_query_length=cfg.max_query_length,
        )

    def collate_targets(self, targets: list, width: int) -> dict:
        import torch

        return {
            "start_positions": torch.tensor([t[0] for t in targets], dtype=torch.long),
            "end_positions": torch.tensor([t[1] for t in targets], dtype=torch.long),
        }

    def loss(self, outputs: dict, batch: dict):
        from bert.losses import span_loss

        return span_loss(
            outputs[self.output_name("qa_start")],
            outputs[self.output_name("qa_end")],
            batch["start_positions"],
            batch["end_positions"],
        )

    def evaluate(self, model, tokenizer, examples: list, labels: Labels, cfg) -> dict:
        return evaluate_qa(
            model,
            tokenizer,
            examples,
            max_seq_length=cfg.max_seq_length,
            doc_stride=cfg.doc_stride,
            max_query_length=cfg.max_query_length,
            max_answer_length=cfg.max_answer_length,
            batch_size=cfg.eval_batch_size,
        )

    def summary(self, metrics: dict) -> str:
        return f"qa EM {metrics['exact_match']:.2f} / F1 {metrics['f1']:.2f}"

    def embed_texts(self, examples: list) -> dict[str, list[str]]:
        return {
            f"{self.name}_questions": [e.question for e in examples],
            f"{self.name}_contexts": list(dict.fromkeys(e.context for e in examples)),
        }


# ---- training: SQuAD files, windows with answer targets, evaluation and its metric (EM/F1) ----------------
@dataclass
class QAExample:
    id: str
    title: str
    question: str
    context: str
    answers: list[dict] = field(default_factory=list)  # [{"text", "answer_start"}]; empty = no answer (v2.0)
    is_impossible: bool = False


def expand_paths(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """A path, a comma-separated list, a list, or a directory (all *.json / *.json.gz in it, sorted)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [p for p in str(paths).split(",") if p]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(list(p.glob("*.json")) + list(p.glob("*.json.gz"))))
        else:
            out.append(p)
    return out


def read_squad_articles(paths: PathLike | Sequence[PathLike]) -> list[dict]:
    """The `data` articles of one or several SQuAD files (plain or .gz), in file order."""
    articles = []
    given = {str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)}
    for path in expand_paths(paths):
        with open_text(path) as f:
            try:
                blob = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} is not SQuAD JSON: {e}") from None
        if not isinstance(blob, dict) or "data" not in blob:
            if str(path) not in given and not any(str(path) in g.split(",") for g in given):
                continue  # found by listing a directory (e.g. a side file of ids): not a SQuAD file, skip
            raise DataError(f"{path} has no 'data' list; not a SQuAD file")
        articles.extend(blob["data"])
    return articles


def squad_examples(articles: Iterable[dict]) -> list[QAExample]:
    examples = []
    for article in articles:
        title = article.get("title", "")
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                examples.append(
                    QAExample(
                        id=qa["id"],
                        title=title,
                        question=qa["question"],
                        context=context,
                        answers=list(qa.get("answers", [])),
                        is_impossible=bool(qa.get("is_impossible", False)),
                    )
                )
    return examples


def read_squad(paths: PathLike | Sequence[PathLike]) -> list[QAExample]:
    return squad_examples(read_squad_articles(paths))


def split_heldout(articles: list[dict], heldout_articles: int) -> tuple[list[dict], list[dict]]:
    """Deterministic train/held-out split of SQuAD train articles: the last N articles (in file order,
    i.e. the end of part-04) are held out. Never train on them; `--heldout-articles` picks N."""
    if heldout_articles <= 0:
        return articles, []
    if heldout_articles >= len(articles):
        raise DataError(f"cannot hold out {heldout_articles} of {len(articles)} articles")
    return articles[:-heldout_articles], articles[-heldout_articles:]


def train_windows(tokenizer, examples: list[QAExample], *, max_seq_length: int, doc_stride: int, max_query_length: int):
    """Every window of every question with its (start, end) token target; (0, 0) = [CLS] when the
    window lacks the answer or the question has none (SQuAD 2.0). Uses the first gold answer."""
    features, targets, skipped = [], [], 0
    for example in examples:
        if example.is_impossible or not example.answers:
            windows = encode(
                tokenizer,
                example.question,
                example.context,
                max_length=max_seq_length,
                doc_stride=doc_stride,
                max_query_length=max_query_length,
            )
            pairs = [(w, 0, 0) for w in windows]
        else:
            answer = example.answers[0]
            try:
                pairs = train_features(
                    tokenizer,
                    example.question,
                    example.context,
                    int(answer["answer_start"]),
                    answer["text"],
                    max_length=max_seq_length,
                    doc_stride=doc_stride,
                    max_query_length=max_query_length,
                )
            except ValueError:
                skipped += 1  # answer text not at its offset: unusable as a training target
                continue
        for window, start, end in pairs:
            features.append(window)
            targets.append((start, end))
    if skipped:
        print(f"qa: skipped {skipped} training questions whose answer is not at its offset", file=sys.stderr)
    return features, targets


def predict_qa(
    model,
    tokenizer,
    examples: list[QAExample],
    *,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    max_answer_length: int,
    batch_size: int = 64,
    handle_impossible_answer: bool = False,
) -> dict[str, str]:
    from bert.running import run_model

    windows_of = [
        encode(
            tokenizer,
            e.question,
            e.context,
            max_length=max_seq_length,
            doc_stride=doc_stride,
            max_query_length=max_query_length,
        )
        for e in examples
    ]
    flat = [w for windows in windows_of for w in windows]
    outputs = run_model(
        model, flat, batch_size=batch_size, pad_token_id=tokenizer.pad_token_id, outputs=("start_logits", "end_logits")
    )
    predictions, cursor = {}, 0
    for example, windows in zip(examples, windows_of):
        mine = outputs[cursor : cursor + len(windows)]
        cursor += len(windows)
        answers = decode(
            example.context,
            windows,
            [o[0] for o in mine],
            [o[1] for o in mine],
            top_k=1,
            max_answer_len=max_answer_length,
            handle_impossible_answer=handle_impossible_answer,
        )
        predictions[example.id] = answers[0]["answer"] if answers else ""
    return predictions


def evaluate_qa(model, tokenizer, examples: list[QAExample], **settings) -> dict:
    impossible = any(e.is_impossible for e in examples)
    predictions = predict_qa(model, tokenizer, examples, handle_impossible_answer=impossible, **settings)
    gold = {e.id: [a["text"] for a in e.answers] for e in examples}
    return squad_metrics(predictions, gold)


# ---- the official SQuAD v1.1 evaluation script's EM and F1
def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official evaluate-v1.1.py)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_f1(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_exact(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def squad_metrics(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict:
    """EM and F1 in percent, each the max over the gold answers; an unanswerable question (no gold
    answers, SQuAD 2.0) counts as right only for an empty prediction."""
    exact = f1 = 0.0
    for qid, answers in gold.items():
        prediction = predictions.get(qid, "")
        if not answers:
            score = float(prediction == "")
            exact += score
            f1 += score
            continue
        exact += max(squad_exact(prediction, a) for a in answers)
        f1 += max(squad_f1(prediction, a) for a in answers)
    n = len(gold)
    return {"exact_match": 100.0 * exact / n if n else 0.0, "f1": 100.0 * f1 / n if n else 0.0, "total": n}


TASK = QATask()
