"""bert.tasks.qa: windows, max-context ownership, training targets, and decode == transformers'
question-answering pipeline on the same logits.

transformers 5 removed QuestionAnsweringPipeline. Where it exists (transformers 4.x) the test runs
the real pipeline; otherwise it runs `pipeline_reference`, a line-by-line transcription of the
v4.57 pipeline's preprocess/postprocess that uses transformers' own tokenizer, its own
`select_starts_ends` (still shipped in transformers.pipelines.document_question_answering) and
tokenizers' `token_to_word` / `word_to_chars`, i.e. none of the code under test.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bert.tasks import pad_batch, qa
from bert.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_dir(minilm_dir)


@pytest.fixture(scope="module")
def squad(data_dir) -> list[dict]:
    """The first 1,000 SQuAD train paragraphs: context, first question, its answer."""
    with gzip.open(data_dir / "squad-train" / "train-v1.1.part-01.json.gz", "rt", encoding="utf-8") as f:
        articles = json.load(f)["data"]
    examples = []
    for article in articles:
        for paragraph in article["paragraphs"]:
            qa_item = paragraph["qas"][0]
            answer = qa_item["answers"][0]
            examples.append(
                {
                    "context": paragraph["context"],
                    "question": qa_item["question"],
                    "answer_start": answer["answer_start"],
                    "answer_text": answer["text"],
                }
            )
    return examples[:1000]


# ---- windows ----------------------------------------------------------------------------------
def test_window_ranges_overlap_by_stride_and_cover_everything():
    assert qa.window_ranges(5, capacity=10, stride=3) == [(0, 5)]
    assert qa.window_ranges(10, capacity=4, stride=1) == [(0, 4), (3, 7), (6, 10)]
    assert qa.window_ranges(11, capacity=4, stride=2) == [(0, 4), (2, 6), (4, 8), (6, 10), (8, 11)]
    assert qa.window_ranges(0, capacity=4, stride=2) == [(0, 0)]


def test_max_context_owner_hand_computed():
    # Windows [0,4) [2,6) [4,8) over 8 tokens (google's example: a token in several windows
    # belongs to the one where min(left, right) context is largest, the first one on a tie).
    ranges = [(0, 4), (2, 6), (4, 8)]
    #   token:  0  1  2  3  4  5  6  7
    # window0:  0  1  1  0           scores min(left, right)
    # window1:        0  1  1  0
    # window2:              0  1  1  0
    assert qa.max_context_owner(ranges, 8) == [0, 0, 0, 1, 1, 2, 2, 2]
    # The 0.01 * length term breaks ties towards the longer window.
    assert qa.max_context_owner([(0, 3), (1, 6)], 6) == [0, 0, 1, 1, 1, 1]


def test_encode_layout_and_ownership(tokenizer):
    context = " ".join(f"word{i}" for i in range(60))
    windows = qa.encode(tokenizer, "Which word?", context, max_length=48, doc_stride=12)
    assert len(windows) > 2 and [w.window_index for w in windows] == list(range(len(windows)))
    n_question = len(tokenizer.encode_batch(["Which word?"], add_special_tokens=False)[0].ids)
    context_tokens = tokenizer.encode_batch([context], add_special_tokens=False)[0]
    owned = []
    for w in windows:
        positions = w.context_positions
        assert len(w) <= 48 and w.input_ids[0] == tokenizer.cls_token_id and w.input_ids[-1] == tokenizer.sep_token_id
        assert positions.start == n_question + 2 and positions.stop == len(w) - 1
        assert w.token_type_ids == [0] * (n_question + 2) + [1] * (len(positions) + 1)
        assert all(w.offsets[p] is None for p in range(len(w)) if p not in positions)
        assert [w.offsets[p] for p in positions] == [
            tuple(o) for o in context_tokens.offsets[w.context_token_start : w.context_token_start + len(positions)]
        ]
        owned += [w.context_token_start + i for i, p in enumerate(positions) if w.token_is_max_context[p]]
    assert sorted(owned) == list(range(len(context_tokens.ids)))  # every context token owned exactly once


def test_long_question_is_cut_to_max_query_length(tokenizer):
    question = "why " * 100
    windows = qa.encode(tokenizer, question, "short context", max_length=64, doc_stride=8, max_query_length=20)
    assert windows[0].input_ids[1:21] == [tokenizer.token_to_id("why")] * 20
    assert windows[0].input_ids[21] == tokenizer.sep_token_id


def test_impossible_window_settings_are_refused(tokenizer):
    with pytest.raises(ValueError, match="doc_stride"):
        qa.encode(tokenizer, "q?", "a context " * 50, max_length=32, doc_stride=30)
    with pytest.raises(ValueError, match="no room"):
        qa.encode(tokenizer, "a long question " * 10, "context", max_length=16, doc_stride=2)


def test_windows_identical_to_transformers_overflow(tokenizer, minilm_dir, squad):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    questions = [e["question"] for e in squad]
    contexts = [e["context"] for e in squad]
    expected = theirs(
        questions,
        contexts,
        truncation="only_second",
        max_length=384,
        stride=128,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    ours = [w for q, c in zip(questions, contexts) for w in qa.encode(tokenizer, q, c)]
    assert len(ours) == len(expected["input_ids"]) > len(contexts)
    for i, window in enumerate(ours):
        assert window.input_ids == expected["input_ids"][i]
        assert window.token_type_ids == expected["token_type_ids"][i]
        sequence_ids = expected.sequence_ids(i)
        assert window.offsets == [
            tuple(o) if s == 1 else None for o, s in zip(expected["offset_mapping"][i], sequence_ids)
        ]


def test_train_features_point_at_the_answer(tokenizer, squad):
    found = 0
    for example in squad[:300]:
        features = qa.train_features(
            tokenizer,
            example["question"],
            example["context"],
            example["answer_start"],
            example["answer_text"],
            max_length=128,
            doc_stride=32,
            max_query_length=64,
        )
        answer_end = example["answer_start"] + len(example["answer_text"])
        for window, start, end in features:
            if start == end == 0:
                continue
            found += 1
            assert window.offsets[start][0] <= example["answer_start"] < window.offsets[start][1]
            assert window.offsets[end][0] < answer_end <= window.offsets[end][1]
        assert any(start for _, start, _ in features), example["answer_text"]  # some window holds it
    assert found >= 300


def test_train_features_rejects_a_misplaced_answer(tokenizer):
    with pytest.raises(ValueError, match="not at character"):
        qa.train_features(tokenizer, "q?", "Paris is big.", 3, "Paris")


# ---- decoding: hand-made logits -----------------------------------------------------------------
def test_decode_picks_the_best_span_and_widens_to_words(tokenizer):
    context = "The Schwarzenegger museum opened in 1998."
    (window,) = qa.encode(tokenizer, "What opened?", context)
    positions = list(window.context_positions)
    tokens = tokenizer.convert_ids_to_tokens(window.input_ids)
    start_logits = np.zeros(len(window), np.float32)
    end_logits = np.zeros(len(window), np.float32)
    # start on the second piece of "schwarzenegger", end on "museum": the answer is whole words.
    second_piece = next(p for p in positions if tokens[p].startswith("##"))
    museum = next(p for p in positions if tokens[p] == "museum")
    start_logits[second_piece] = end_logits[museum] = 12.0
    start_logits[1] = end_logits[1] = 50.0  # a question token never wins, whatever its logit
    (best,) = qa.decode(context, [window], [start_logits], [end_logits], max_answer_len=30)
    assert (best["answer"], best["start"], best["end"]) == ("Schwarzenegger museum", 4, 25)
    assert 0.9 < best["score"] <= 1.0


def test_decode_respects_max_answer_len_and_top_k(tokenizer):
    context = "alpha beta gamma delta epsilon"
    (window,) = qa.encode(tokenizer, "Which?", context)
    first, last = window.context_positions[0], window.context_positions[-1]
    start_logits = np.zeros(len(window), np.float32)
    end_logits = np.zeros(len(window), np.float32)
    start_logits[first] = end_logits[last] = 10.0
    assert qa.decode(context, [window], [start_logits], [end_logits], max_answer_len=5)[0]["answer"] == context
    shorter = qa.decode(context, [window], [start_logits], [end_logits], max_answer_len=2, top_k=3)
    assert len(shorter) == 3 and all(len(a["answer"].split()) <= 2 for a in shorter)
    assert [a["score"] for a in shorter] == sorted((a["score"] for a in shorter), reverse=True)


# ---- decoding: parity with the pipeline ---------------------------------------------------------
def pipeline_reference(
    transformers,
    model,
    hf_tokenizer,
    question,
    context,
    *,
    max_seq_len,
    doc_stride,
    top_k,
    max_answer_len,
    handle_impossible_answer,
):
    """QuestionAnsweringPipeline(question=..., context=...) as a list of answers: the real one when
    this transformers has it (`model` a torch model), else its v4.57 preprocess + postprocess
    transcribed (fast tokenizer, padding_side right, align_to_words=True; `model` maps numpy inputs
    to (start, end) logits)."""
    if hasattr(transformers, "QuestionAnsweringPipeline"):
        pipe = transformers.pipeline("question-answering", model=model, tokenizer=hf_tokenizer)
        out = pipe(
            question=question,
            context=context,
            top_k=top_k,
            max_answer_len=max_answer_len,
            max_seq_len=max_seq_len,
            doc_stride=doc_stride,
            handle_impossible_answer=handle_impossible_answer,
        )
        return out if isinstance(out, list) else [out]

    from transformers.pipelines.document_question_answering import select_starts_ends

    encoded = hf_tokenizer(
        text=question,
        text_pair=context,
        padding="do_not_pad",
        truncation="only_second",
        max_length=max_seq_len,
        stride=doc_stride,
        return_token_type_ids=True,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    min_null_score = 1000000
    answers = []
    for span in range(len(encoded["input_ids"])):
        input_ids = encoded["input_ids"][span]
        p_mask = [tok != 1 for tok in encoded.sequence_ids(span)]
        for cls_index in np.nonzero(np.array(input_ids) == hf_tokenizer.cls_token_id)[0]:
            p_mask[cls_index] = 0
        inputs = {k: np.array([encoded[k][span]]) for k in ("input_ids", "token_type_ids", "attention_mask")}
        start_logits, end_logits = model(**inputs)
        starts, ends, scores, min_null_score = select_starts_ends(
            start_logits,
            end_logits,
            np.array([p_mask]),
            inputs["attention_mask"],
            min_null_score,
            top_k * 2 + 10,
            handle_impossible_answer,
            max_answer_len,
        )
        enc = encoded[span]
        for s, e, score in zip(starts, ends, scores):
            try:
                start_index = enc.word_to_chars(enc.token_to_word(s), sequence_index=1)[0]
                end_index = enc.word_to_chars(enc.token_to_word(e), sequence_index=1)[1]
            except Exception:
                start_index, end_index = enc.offsets[s][0], enc.offsets[e][1]
            target = context[start_index:end_index]
            same = next((a for a in answers if a["answer"].lower() == target.lower()), None)
            if same:
                same["score"] += score.item()
            else:
                answers.append({"score": score.item(), "start": start_index, "end": end_index, "answer": target})
    if handle_impossible_answer:
        answers.append({"score": min_null_score, "start": 0, "end": 0, "answer": ""})
    return sorted(answers, key=lambda x: x["score"], reverse=True)[:top_k]


class CachedLogits:
    """model(input_ids, token_type_ids, attention_mask) -> (start, end) logits as numpy (1, T) arrays,
    each distinct sequence run once: both sides of the comparison see the very same numbers."""

    def __init__(self, torch, model):
        self.torch, self.model, self.cache = torch, model, {}

    def __call__(self, input_ids, token_type_ids, attention_mask):
        key = (tuple(input_ids[0]), tuple(token_type_ids[0]))
        if key not in self.cache:
            inputs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
            with self.torch.no_grad():
                output = self.model(**{k: self.torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})
            self.cache[key] = (output.start_logits.numpy(), output.end_logits.numpy())
        return self.cache[key]

    def windows(self, windows):
        logits = [self(**pad_batch([window])) for window in windows]
        return [start[0] for start, _ in logits], [end[0] for _, end in logits]


@pytest.fixture(scope="module")
def tiny_qa(minilm_dir, tokenizer):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
    )
    model = transformers.BertForQuestionAnswering(config).eval()
    with torch.no_grad():
        model.qa_outputs.weight.mul_(20.0)  # peaked, not flat, start/end distributions
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 32-wide model gains nothing from threads on a shared machine
    yield transformers, model, CachedLogits(torch, model), hf_tokenizer
    torch.set_num_threads(threads)


SETTINGS = [  # (top_k, max_answer_len, handle_impossible_answer)
    (1, 30, False),
    (3, 30, False),
    (3, 5, False),
    (1, 15, True),
    (5, 1, True),
]


@pytest.mark.parametrize("top_k,max_answer_len,handle_impossible_answer", SETTINGS)
def test_decode_equals_question_answering_pipeline(
    tokenizer, tiny_qa, squad, top_k, max_answer_len, handle_impossible_answer
):
    transformers, model, logits, hf_tokenizer = tiny_qa
    examples = [(e["question"], e["context"]) for e in squad[:4]]
    examples += [("Who?", "Zubkov met Schwarzenegger."), ("Where is it?", "Kathmandu")]  # tiny contexts
    windows_seen = 0
    for question, context in examples:
        windows = qa.encode(tokenizer, question, context, max_length=64, doc_stride=16)
        windows_seen += len(windows)
        got = qa.decode(
            context,
            windows,
            *logits.windows(windows),
            top_k=top_k,
            max_answer_len=max_answer_len,
            handle_impossible_answer=handle_impossible_answer,
        )
        reference_model = model if hasattr(transformers, "QuestionAnsweringPipeline") else logits
        expected = pipeline_reference(
            transformers,
            reference_model,
            hf_tokenizer,
            question,
            context,
            max_seq_len=64,
            doc_stride=16,
            top_k=top_k,
            max_answer_len=max_answer_len,
            handle_impossible_answer=handle_impossible_answer,
        )
        # the pipeline pads a short list with score-0 filler ([CLS] spans, pairs longer than max_answer_len); we
        # return only real answers
        real = [a for a in expected if a["score"] > 0]
        assert got == real, question
        assert all(a["end"] - a["start"] <= len(context) and a["answer"] == context[a["start"] : a["end"]] for a in got)
    assert windows_seen > 20  # long contexts really were split into many windows


# ---- decoding: the span search over the band equals the pipeline's over the outer product -----------------
def _random_logits(rng, length: int, kind: str) -> np.ndarray:
    """Continuous logits (no ties), logits on a coarse grid (many exact ties) or all equal."""
    if kind == "equal":
        return np.zeros(length, np.float32)
    logits = rng.standard_normal(length) * 3
    return (np.round(logits) if kind == "grid" else logits).astype(rng.choice([np.float32, np.float64]))


def test_best_spans_equal_the_pipelines_decode_spans_on_random_logits():
    """qa.best_spans against transformers' own decode_spans (the pipeline's search, not our code): the same
    starts, ends and scores in the same order, over ties, masked positions, answer-length limits down to 0 and
    beyond the window, and top_k from 1 to more pairs than there are."""
    decode_spans = pytest.importorskip("transformers.pipelines.document_question_answering").decode_spans
    rng = np.random.default_rng(0)
    searched = {"band": 0, "pipeline": 0}
    for trial in range(600):
        length = int(rng.integers(2, 90))
        kind = ("continuous", "continuous", "grid", "equal")[trial % 4]
        allowed = np.ones(length, bool)
        question = int(rng.integers(0, length // 2 + 1))
        allowed[1 : 1 + question] = False  # [CLS] question [SEP]: only [CLS] and the context join the softmax
        allowed[length - 1] = trial % 3 == 0  # a trailing [SEP] (masked) or a context token
        start = qa._probabilities(_random_logits(rng, length, kind), allowed)
        end = qa._probabilities(_random_logits(rng, length, kind), allowed)
        start[0] = end[0] = 0.0  # as decode: [CLS] is the no-answer score, not a span
        top_k = int(rng.choice([1, 2, 3, 12, 22, length * length + 1]))
        max_answer_len = int(rng.choice([0, 1, 2, 5, 30, length + 3]))
        got = qa.best_spans(start, end, top_k, max_answer_len, allowed)
        expected = decode_spans(start, end, top_k, max_answer_len, allowed.astype(int))
        for name, mine, theirs in zip(("starts", "ends", "scores"), got, expected):
            assert np.array_equal(mine, theirs) and mine.dtype == theirs.dtype, (trial, name, mine, theirs)
        searched["pipeline" if qa._band_spans(start, end, top_k, max_answer_len) is None else "band"] += 1
    assert searched["band"] > 200 and searched["pipeline"] > 100  # both searches were compared


def _hashed_logits(kind: str):
    """model(input_ids, token_type_ids, attention_mask) -> (start, end) logits of shape (1, T): a fixed function of
    each token and its position (the no-op backend's), on a coarse grid for "grid" (ties)."""
    from bench.noop_backend import qa_logits

    def model(input_ids, token_type_ids, attention_mask):
        start, end = qa_logits(np.asarray(input_ids))
        return (np.round(start), np.round(end)) if kind == "grid" else (start, end)

    return model


@pytest.mark.parametrize("kind", ["continuous", "grid"])
@pytest.mark.parametrize("top_k,max_answer_len", [(1, 30), (3, 4), (5, 1)])
def test_decode_equals_the_pipeline_over_many_windows(tokenizer, minilm_dir, squad, kind, top_k, max_answer_len):
    """decode (band search, words from the window's word table, answers merged by text) == the pipeline's
    postprocess transcribed, on long contexts cut into many windows, with logits that tie or not."""
    transformers = pytest.importorskip("transformers")
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    model = _hashed_logits(kind)
    windows_seen = 0
    for example in squad[10:16]:
        question, context = example["question"], example["context"]
        windows = qa.encode(tokenizer, question, context, max_length=48, doc_stride=12)
        windows_seen += len(windows)
        logits = [model(**pad_batch([window])) for window in windows]
        got = qa.decode(
            context,
            windows,
            [start[0] for start, _ in logits],
            [end[0] for _, end in logits],
            top_k=top_k,
            max_answer_len=max_answer_len,
        )
        expected = pipeline_reference(
            transformers,
            model,
            hf_tokenizer,
            question,
            context,
            max_seq_len=48,
            doc_stride=12,
            top_k=top_k,
            max_answer_len=max_answer_len,
            handle_impossible_answer=False,
        )
        assert got == expected, question
    assert windows_seen > 30
