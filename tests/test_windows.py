"""Windows over long texts (bert/tasks/windows.py), hand-computed: the token cut of tokenizers' overflow, whole-word
windows, the stride bound, the count known before any window is built, and the pipeline's merge of overlapping
entities (bert.tasks.ner.merge_windows)."""

from __future__ import annotations

import pytest

from bert.tasks import TASKS
from bert.tasks.ner import merge_windows
from bert.tasks.windows import LongInputs, TooManyWindows, cut_texts, window_count, window_ranges, word_starts
from bert.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_dir(minilm_dir)


def test_whole_word_windows_end_between_words():
    # words of 2, 3, 1, 2, 3 tokens: 0-1 | 2-4 | 5 | 6-7 | 8-10
    starts = word_starts([0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 4])
    assert starts == [True, False, True, False, False, True, True, False, True, False, False]
    # capacity 4, no overlap: [0, 2) since token 4 is inside word 1; then [2, 6), [6, 8), [8, 11)
    assert window_ranges(11, 4, 0, starts) == [(0, 2), (2, 6), (6, 8), (8, 11)]
    # stride 1: each next window starts at the word holding the token before the previous end
    assert window_ranges(11, 5, 1, starts) == [(0, 5), (2, 6), (5, 8), (6, 11)]
    # a word longer than a window is cut where it must be, and the windows still advance
    assert window_ranges(6, 2, 0, [True, False, False, False, False, True]) == [(0, 2), (2, 4), (4, 6)]
    # without word starts: tokenizers' cut, step capacity - stride
    assert window_ranges(11, 4, 1) == [(0, 4), (3, 7), (6, 10), (9, 11)]


def test_token_windows_are_tokenizers_overflow(tokenizer):
    text = "The quick brown fox jumps over the lazy dog near the riverbank at dawn. " * 12
    ids = tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
    first = tokenizer.encode_batch([text], max_length=32, truncation=True, stride=7)[0]
    overflow = [first, *first.overflowing]
    ranges = window_ranges(len(ids), 30, 7)
    assert len(ranges) == len(overflow) == window_count(len(ids), 30, 7)
    assert [list(e.ids[1:-1]) for e in overflow] == [ids[a:b] for a, b in ranges]


def test_stride_defaults_and_bounds():
    declared = LongInputs(merge="m", stride_field="stride")
    assert declared.stride(None, 510, 512) == 128 and declared.stride(None, 62, 64) == 31
    assert declared.stride(31, 62, 64) == 31
    with pytest.raises(ValueError, match="stride: 32 is more than half a window; at most 31 with 64-token windows"):
        declared.stride(32, 62, 64)
    assert LongInputs(merge="m", default_stride=0).stride(None, 62, 64) == 0


def test_cut_texts_refuses_before_building_windows(tokenizer):
    huge = "many words here " * 70_000
    with pytest.raises(TooManyWindows) as refused:
        cut_texts(tokenizer, ["short", huge], capacity=62, stride=0, max_windows=16, whole_words=True)
    assert refused.value.needed is None  # refused on the bounded prefix: never tokenised whole
    text = "many words here " * 100  # 300 tokens: 5 windows of 62
    pieces = cut_texts(tokenizer, [text, "short"], capacity=62, stride=0, max_windows=6, whole_words=True)
    assert [len(p.ranges) for p in pieces] == [5, 1]
    assert all(b - a <= 62 for p in pieces for a, b in p.ranges)
    with pytest.raises(TooManyWindows) as refused:
        cut_texts(tokenizer, [text, "short"], capacity=62, stride=0, max_windows=5, whole_words=True)
    assert refused.value.needed == 6


def test_overlapping_entities_keep_the_longer_then_the_higher_score():
    def entity(start, end, score, group="PER"):
        return {"entity_group": group, "score": score, "word": "w", "start": start, "end": end}

    merged = merge_windows(
        [
            entity(0, 5, 0.9),  # window 1
            entity(10, 14, 0.5),  # window 1: cut by its edge
            entity(10, 20, 0.4),  # window 2: the whole entity, longer: kept
            entity(30, 35, 0.6),  # both windows, equal spans: the higher score is kept
            entity(30, 35, 0.7),
            entity(40, 42, 0.8, "LOC"),
        ]
    )
    assert [(e["start"], e["end"], e["score"]) for e in merged] == [
        (0, 5, 0.9),
        (10, 20, 0.4),
        (30, 35, 0.7),
        (40, 42, 0.8),
    ]


def test_the_tasks_that_window_long_texts():
    windowed = {name: task.long_inputs for name, task in TASKS.items() if task.long_inputs is not None}
    assert set(windowed) == {"qa", "ner", "embed", "rerank"}
    assert windowed["qa"].stride_field == "doc_stride" and windowed["ner"].stride_field == "stride"
    assert windowed["embed"].opt_in == "chunking" and windowed["embed"].default_stride == 0
    assert windowed["embed"].whole_words and windowed["rerank"].whole_words
