"""The codecs bound a request's cost before its work: huge texts are tokenised only as far as a limit needs,
and a QA context's window count is known from its token count before any window is built."""

from __future__ import annotations

import time

import pytest

from bert.tasks import classify, ner, qa, windows
from bert.tasks.common import CHUNK_CHARS, bounded_text
from bert.tokenizer import BertTokenizer, InputTooLong


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_dir(minilm_dir)


@pytest.mark.parametrize("capacity,stride", [(10, 0), (10, 3), (10, 5), (317, 128), (317, 158), (61, 30)])
def test_window_count_is_the_number_of_windows(capacity, stride):
    for tokens in [1, capacity - 1, capacity, capacity + 1, 2 * capacity, 7 * capacity + 3, 5000]:
        assert qa.window_count(tokens, capacity, stride) == len(qa.window_ranges(tokens, capacity, stride))
        count = qa.window_count(tokens, capacity, stride)
        assert windows.max_text_tokens(count, capacity, stride) >= tokens
        if count > 1:
            assert windows.max_text_tokens(count - 1, capacity, stride) < tokens


def test_bounded_text_keeps_the_first_tokens(tokenizer, sst2_dev):
    text = " ".join(sentence for sentence, _ in sst2_dev) * 3  # ~300 k chars of real text
    assert len(text) > 20 * CHUNK_CHARS
    prefix, cut = bounded_text(tokenizer, text, 1000)
    assert cut and len(prefix) < 3 * CHUNK_CHARS and text.startswith(prefix)
    whole = tokenizer.backend.encode(text, add_special_tokens=False)
    part = tokenizer.backend.encode(prefix, add_special_tokens=False)
    assert len(part.ids) > 1000
    assert part.ids[:1000] == whole.ids[:1000] and part.offsets[:1000] == whole.offsets[:1000]
    assert bounded_text(tokenizer, text, 10**9) == (text, False)
    assert bounded_text(tokenizer, "short text", 1) == ("short text", False)  # short: the caller counts exactly


def test_a_text_without_white_space_is_still_bounded(tokenizer):
    text = "\u4e2d" * 300_000  # CJK: one token per character, no white space anywhere
    started = time.perf_counter()
    prefix, cut = bounded_text(tokenizer, text, 512)
    assert cut and len(prefix) <= 4 * CHUNK_CHARS + CHUNK_CHARS
    assert time.perf_counter() - started < 2


def test_huge_inputs_are_refused_or_cut_at_the_cost_of_their_first_tokens(tokenizer):
    huge = "many words here " * 70_000  # 1.1 MB
    for encode in (classify.encode, ner.encode):
        started = time.perf_counter()
        with pytest.raises(InputTooLong, match="more than 512 tokens"):
            encode(tokenizer, ["fine", huge], max_length=512)
        features = encode(tokenizer, [huge], max_length=512, truncate=True)
        assert len(features[0]) == 512
        assert time.perf_counter() - started < 2
    pair = classify.encode(tokenizer, [(huge, "and a short second text")], max_length=64, truncate=True)[0]
    assert len(pair) == 64 and pair.token_type_ids[-1] == 1


def test_qa_refuses_too_many_windows_before_building_any(tokenizer):
    context = "The fox jumps over the dog. " * 40_000  # 1.1 MB, about 280 k tokens
    started = time.perf_counter()
    with pytest.raises(qa.TooManyWindows) as refused:
        qa.encode(tokenizer, "What jumps?", context, max_length=384, doc_stride=158, max_windows=256)
    assert refused.value.needed is None and time.perf_counter() - started < 2
    small = "The fox jumps over the dog. " * 100  # shorter than a chunk: its windows are counted exactly
    with pytest.raises(qa.TooManyWindows) as refused:
        qa.encode(tokenizer, "What jumps?", small, max_length=128, doc_stride=32, max_windows=3)
    windows = qa.encode(tokenizer, "What jumps?", small, max_length=128, doc_stride=32)
    assert refused.value.needed == len(windows) > 3
    assert len(
        qa.encode(tokenizer, "What jumps?", small, max_length=128, doc_stride=32, max_windows=len(windows))
    ) == len(windows)


def test_long_question_is_refused_unless_truncation_is_asked(tokenizer):
    question = "why " * 100
    with pytest.raises(qa.QuestionTooLong, match="100 tokens; at most 64"):
        qa.encode(tokenizer, question, "context", truncate_question=False)
    with pytest.raises(qa.QuestionTooLong, match="more than 64"):
        qa.encode(tokenizer, "why " * 50_000, "context", truncate_question=False)
    window = qa.encode(tokenizer, question, "context", truncate_question=True)[0]
    assert window.token_type_ids.count(0) == 64 + 2
