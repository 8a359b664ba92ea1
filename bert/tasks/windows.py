"""Long inputs: a text longer than one model input is cut into overlapping windows, counted before any is built.

A task that answers texts longer than the model's window declares how, once (`Task.long_inputs`, a `LongInputs`):
the request field that sets how many tokens neighbouring windows share (transformers' `stride` / `doc_stride`:
shared tokens, not the step), its default, whether windows keep whole words, and how the windows' answers become
one. Every such task cuts its windows here and bounds them the same way: at most half a window is shared, so each
window advances by at least half a window and the count stays within 2x of the unshared count; the windows of all
a request's items are at most `Limits.max_sequences` (--max-request-sequences), refused (TooMuchWork, 413) after
tokenising at most what that many windows hold and before any model work. A task without a declaration refuses a
text longer than its window (422) or cuts it when the request asks (`"truncate": true`): never silently.

| task | windows | merged |
|---|---|---|
| qa | question + context piece, `doc_stride` | best spans over all windows (transformers' QA pipeline) |
| ner | text piece, `stride` (tokenizers' overflow: the token-classification pipeline's windows) | entities; where two overlap the longer is kept, then the higher score (the pipeline's rule) |
| embed | text piece, whole words, no overlap, with `"chunking": "mean"` | token-weighted mean of the windows' vectors |
| rerank | query + document piece, whole words | the best window's score (MaxP) |
"""

from __future__ import annotations

from dataclasses import dataclass

from bert.tasks.common import TooMuchWork, bounded_text


@dataclass(frozen=True)
class LongInputs:
    """How a task answers a text longer than one model input (see the module docstring)."""

    merge: str  # how the windows' answers become one answer, in words (docs and /docs)
    stride_field: str | None = None  # the request field that sets the tokens neighbours share; None: fixed
    default_stride: int = 128  # transformers' default doc_stride (at 384-token windows); capped at half a window
    whole_words: bool = False  # windows begin and end between words (each is a text that re-reads as its tokens)
    opt_in: str | None = None  # the request option that asks for windows ("chunking"); None: always windowed

    def stride(self, requested: int | None, capacity: int, window: int, where: str = "") -> int:
        """The tokens neighbouring windows share: `requested` (the request's `stride_field`), or the default, capped
        at half the `capacity` text tokens a window of `window` tokens holds. ValueError naming the field beyond."""
        limit = capacity // 2
        if requested is None:
            return min(self.default_stride, limit)
        if requested > limit:
            name = where or self.stride_field or "stride"
            raise ValueError(
                f"{name}: {requested} is more than half a window; at most {limit} with {window}-token windows"
            )
        return requested


class TooManyWindows(ValueError):
    """A text needs more windows than the caller allows; raised before any window is built."""

    def __init__(self, needed: int | None, limit: int):
        self.needed = needed  # None: more than `limit`, not counted further
        self.limit = limit
        super().__init__(
            f"the text needs {'more than ' + str(limit) if needed is None else needed} windows; the limit is {limit}"
        )


def too_much_work(needed: int | None, used: int, limit: int, window: int, what: str = "texts") -> TooMuchWork:
    """The 413 of a request whose items need more windows than --max-request-sequences allows."""
    count = "more than " + str(limit) if needed is None else str(used + needed)
    return TooMuchWork(
        f"the {what} of this request need {count} windows of {window} tokens; the limit is {limit} "
        f"(max_request_sequences): send shorter {what} or fewer items"
    )


# ---- arithmetic --------------------------------------------------------------------------------------------
def window_ranges(
    num_tokens: int, capacity: int, stride: int, word_starts: list[bool] | None = None
) -> list[tuple[int, int]]:
    """[start, stop) ranges over a text's tokens; neighbours share `stride` tokens.

    Without `word_starts` the cut of `tokenizers`' overflow (and so of transformers' pipelines): step
    capacity - stride, stop at the first window that reaches the end. With `word_starts` (per token, whether it
    begins a word) a window that would end inside a word ends before it, and the next begins at the start of the
    word `stride` tokens before that end: neighbours share at least `stride` tokens and no window holds part of a
    word, unless one word alone is longer than what a window can give it (then it is cut where it must be)."""
    if num_tokens <= capacity:
        return [(0, num_tokens)]
    if word_starts is None:
        step = capacity - stride
        ranges = []
        for start in range(0, num_tokens, step):
            stop = min(start + capacity, num_tokens)
            ranges.append((start, stop))
            if stop == num_tokens:
                break
        return ranges

    def word_start(at: int, floor: int) -> int:
        """The start of the word holding token `at`, if it lies after `floor`; else `at`."""
        back = at
        while back > floor and not word_starts[back]:
            back -= 1
        return back if back > floor else at

    ranges, start = [], 0
    while True:
        stop = min(start + capacity, num_tokens)
        if stop < num_tokens:
            snapped = word_start(stop, start)
            if snapped - start > stride:  # else the window would not advance past its shared tokens
                stop = snapped
        ranges.append((start, stop))
        if stop == num_tokens:
            return ranges
        start = word_start(stop - stride, start) if stride else stop


def window_count(num_tokens: int, capacity: int, stride: int) -> int:
    """len(window_ranges(num_tokens, capacity, stride)), by arithmetic: what a text costs, known before a single
    window is built (a lower bound of the count with whole words, which can only advance less)."""
    if num_tokens <= capacity:
        return 1
    step = capacity - stride
    return 1 + -(-(num_tokens - capacity) // step)


def max_text_tokens(windows: int, capacity: int, stride: int) -> int:
    """The most text tokens `windows` windows can hold (the inverse of window_count)."""
    return capacity + (windows - 1) * (capacity - stride)


def word_starts(word_ids: list[int | None]) -> list[bool]:
    """Per token, whether it begins a word (a token without a word counts as one)."""
    return [i == 0 or w is None or w != word_ids[i - 1] for i, w in enumerate(word_ids)]


# ---- templates ---------------------------------------------------------------------------------------------
def single_template(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts around one text: ([CLS], [SEP]) for BERT, (<s>, </s>) for RoBERTa."""
    backend = getattr(tokenizer, "backend", tokenizer)
    encoding = backend.encode(["a"], is_pretokenized=True)
    sequence = encoding.sequence_ids
    first = sequence.index(0)
    last = len(sequence) - 1 - sequence[::-1].index(0)
    return list(encoding.ids[:first]), list(encoding.ids[last + 1 :])


def pair_template(tokenizer) -> tuple[list[int], list[int], list[int], int]:
    """The tokenizer's pair template (bert.tokenizer.BertTokenizer.pair_template), BERT's for one without it."""
    template = getattr(tokenizer, "pair_template", None)
    return (
        template
        if template is not None
        else ([tokenizer.cls_token_id], [tokenizer.sep_token_id], [tokenizer.sep_token_id], 1)
    )


# ---- cutting ------------------------------------------------------------------------------------------------
@dataclass
class TextPieces:
    """A text's tokens (no special tokens) and the windows they are cut into."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    ranges: list[tuple[int, int]]


def cut_texts(
    tokenizer,
    texts: list[str],
    *,
    capacity: int,
    stride: int,
    max_windows: int,
    whole_words: bool = False,
) -> list[TextPieces]:
    """Each text's tokens and windows of at most `capacity` tokens, `stride` shared, all of them together at most
    `max_windows` (TooManyWindows beyond, after tokenising at most what that many windows hold: a huge text costs
    what its first windows cost). One tokenizer call for all texts."""
    each = max_text_tokens(max(max_windows - len(texts) + 1, 1), capacity, stride)  # the others need one window each
    bounded = [bounded_text(tokenizer, text, each) for text in texts]
    if any(cut for _, cut in bounded):
        raise TooManyWindows(None, max_windows)
    encodings = tokenizer.encode_batch([text for text, _ in bounded], add_special_tokens=False)
    if sum(window_count(len(e.ids), capacity, stride) for e in encodings) > max_windows:
        raise TooManyWindows(sum(window_count(len(e.ids), capacity, stride) for e in encodings), max_windows)
    pieces = []
    for encoding in encodings:
        word_ids = list(encoding.word_ids)
        starts = word_starts(word_ids) if whole_words else None
        pieces.append(
            TextPieces(
                list(encoding.ids),
                [tuple(o) for o in encoding.offsets],
                word_ids,
                window_ranges(len(encoding.ids), capacity, stride, starts),
            )
        )
    needed = sum(len(p.ranges) for p in pieces)
    if needed > max_windows:  # whole words advance less than the arithmetic count
        raise TooManyWindows(needed, max_windows)
    return pieces
