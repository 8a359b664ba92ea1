"""Pieces every task codec shares: one unpadded model input, batching it, a stable softmax, and OpenAI's usage
object that the answers of OpenAI-shaped routes carry."""

from __future__ import annotations

import os
import re
import time
import unicodedata
from dataclasses import dataclass

import numpy as np

from bert.tokenizer import InputTooLong


@dataclass
class Features:
    """One model input sequence, unpadded: ids and segment (token type) ids of equal length."""

    input_ids: list[int]
    token_type_ids: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class OpenAIUsage:
    """The input tokens a request cost, as OpenAI's APIs count them (no output tokens: an encoder generates none)."""

    prompt_tokens: int
    total_tokens: int


def pad_batch(
    features: list[Features], pad_token_id: int = 0, pad_to_multiple_of: int | None = None
) -> dict[str, np.ndarray]:
    """Right-pad to the longest sequence (rounded up to `pad_to_multiple_of`): int64 arrays of shape (B, T)."""
    width = max((len(f) for f in features), default=0)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = np.full((len(features), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(features), width), dtype=np.int64)
    token_type_ids = np.zeros((len(features), width), dtype=np.int64)
    for row, feature in enumerate(features):
        n = len(feature)
        input_ids[row, :n] = feature.input_ids
        attention_mask[row, :n] = 1
        token_type_ids[row, :n] = feature.token_type_ids
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def softmax(x, axis: int = -1) -> np.ndarray:
    """Softmax that cannot overflow (max subtracted first); float32 in, float32 out."""
    # The array's own methods and an in-place divide: on the few logits of a served request numpy's per-call
    # overhead is the whole cost (same arithmetic, same result to the bit).
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    # The ufuncs' reduce, which ndarray.max and .sum call through a Python wrapper each
    shifted = np.exp(x - np.maximum.reduce(x, axis=axis, keepdims=True))
    shifted /= np.add.reduce(shifted, axis=axis, keepdims=True)
    return shifted


def sigmoid(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x))


def decision_leads(probabilities, independent: bool = False) -> np.ndarray:
    """How far each row's decision over the last axis is from another (what --TASK-verify-margin is compared
    with): one choice among them, the best probability's lead over the second's (1.0 with a single choice); each a
    yes or no (`independent`: sigmoid scores), the smallest lead of a score's more likely side, |2p - 1|."""
    p = np.asarray(probabilities, dtype=np.float32)
    if independent:
        return np.abs(2 * p - 1).min(axis=-1)
    if p.shape[-1] < 2:
        return np.ones(p.shape[:-1], dtype=np.float32)
    top = np.partition(p, -2, axis=-1)[..., -2:]
    return top[..., 1] - top[..., 0]


def check_length(index: int, length: int, limit: int) -> None:
    """Refuse an input the model cannot take whole (the caller may ask to truncate instead)."""
    if length > limit:
        raise InputTooLong(index, length, limit)


# Texts longer than this are tokenised piece by piece when only their first tokens matter, so that refusing or
# truncating a huge input costs what its first tokens cost, not a whole encoding's time and memory.
# Each piece goes through `encode_batch`, which tokenises without the GIL (`encode` holds it), and a GIL
# hand-over between pieces: the event loop and the short requests keep running. Measured: docs/serving.md,
# "Why it is built this way".
CHUNK_CHARS = 4096
_WHITESPACE = re.compile(r"\s")


def bounded_text(tokenizer, text: str, max_tokens: int) -> tuple[str, bool]:
    """(`text`, False) when it holds at most `max_tokens` tokens (specials not counted), else (a prefix of it
    that holds more than `max_tokens` of the same first tokens, True). The prefix ends after white space, where
    BERT's pre-tokenizer splits anyway, so tokenising it gives the text's own first tokens. Costs about
    `max_tokens` tokens of work however long `text` is."""
    if len(text) <= CHUNK_CHARS:
        return text, False  # short enough to tokenise whole: the caller counts exactly
    backend = getattr(tokenizer, "backend", tokenizer)
    counted = position = 0
    while position < len(text):
        stop = _cut_after(text, position + CHUNK_CHARS)
        counted += len(backend.encode_batch([text[position:stop]], add_special_tokens=False)[0].ids)
        position = stop
        time.sleep(0)  # hand the GIL over
        if counted > max_tokens:
            return text[:position], position < len(text)
    return text, False


def _cut_after(text: str, at: int) -> int:
    """A cut at the first white space at or after `at` (or `at` itself in a run of 4 chunks without any)."""
    if at >= len(text):
        return len(text)
    found = _WHITESPACE.search(text, at, min(len(text), at + 4 * CHUNK_CHARS))
    return found.end() if found else at


# ---- character spans that keep a character whole -------------------------------------------------
def _extends(ch: str) -> bool:
    """Whether `ch` belongs to the character before it: a combining mark (e.g. U+0301 in NFD "é"), a zero-width
    joiner, a variation selector or an emoji skin-tone modifier."""
    return (
        unicodedata.combining(ch) != 0
        or unicodedata.category(ch)[0] == "M"
        or ch == "\u200d"
        or "\ufe00" <= ch <= "\ufe0f"
        or "\U000e0100" <= ch <= "\U000e01ef"
        or "\U0001f3fb" <= ch <= "\U0001f3ff"
    )


def whole_span(text: str, start: int, end: int) -> tuple[int, int]:
    """`text[start:end]` widened so as not to split a character from its marks: `end` goes past the marks that
    follow it (a tokenizer that strips accents, or gives a mark a piece of its own, ends a word before them) and
    `start`, on a mark, goes back to the character the mark belongs to. An ASCII neighbour costs one comparison."""
    size = len(text)
    if end < size and text[end] >= "\x80":
        while end < size and _extends(text[end]):
            end += 1
    if 0 < start < size and text[start] >= "\x80":
        while start > 0 and _extends(text[start]):
            start -= 1
    return start, end


# ---- what the server's one inference path gives every task (bert.tasks.base.Task) -----------------
@dataclass(frozen=True)
class Limits:
    """What one request may cost, fixed by the server's settings and the model."""

    max_length: int  # tokens in one model input
    max_sequences: int  # model inputs one request may need (QA: windows over all its contexts)
    qa_max_length: int = 384  # tokens in one QA window
    qa_max_question_length: int = 64  # question tokens a window keeps


@dataclass(frozen=True)
class ModelFacts:
    """What decoding needs to know about the model serving a task."""

    labels: dict  # output index -> label name (empty for tasks without labels)
    problem_type: str | None = None
    pooling: object = None  # bert.tasks.embed.Pooling for the embed task
    tokenizer: object = None  # the served model's tokenizer, for tasks that answer in tokens (fill-mask)


class TooMuchWork(ValueError):
    """A request that needs more model inputs than Limits.max_sequences allows: refused before the work."""


class CallerGone(Exception):
    """Raised by a codec working for a request whose caller has hung up; nobody reads it."""


# ---- reading data files (the tasks' training readers) --------------------------------------------
PathLike = str | os.PathLike


class DataError(ValueError):
    """A data file that cannot be read as the format it claims to be."""


def open_text(path: PathLike):
    """Open a text file, gzip or not, decoding UTF-8 with or without a BOM; newlines normalised."""
    import gzip
    from pathlib import Path

    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=None)
    return open(path, encoding="utf-8-sig", newline=None)
