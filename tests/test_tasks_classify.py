"""bert.tasks.classify: encoding texts and pairs, the length contract, and decode == transformers'
text-classification pipeline on the same logits."""

from __future__ import annotations

import numpy as np
import pytest

from bert.tasks import Features, classify, pad_batch, softmax
from bert.tasks.common import ModelFacts
from bert.tokenizer import BertTokenizer, InputTooLong


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_dir(minilm_dir)


# ---- encode -----------------------------------------------------------------------------------
def test_single_and_pair_layout(tokenizer):
    single, pair = classify.encode(tokenizer, ["a good film", ("a good film", "really")])
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert single.input_ids[0] == cls and single.input_ids[-1] == sep and set(single.token_type_ids) == {0}
    assert pair.input_ids == single.input_ids + tokenizer.encode_batch(["really"], add_special_tokens=False)[0].ids + [
        sep
    ]
    assert pair.token_type_ids == [0] * len(single) + [1] * (len(pair) - len(single))


def test_mixed_batch_keeps_input_order(tokenizer):
    inputs = ["first", ["second", "pair"], "third one", ("fourth", "pair two")]
    features = classify.encode(tokenizer, inputs)
    one_by_one = [classify.encode(tokenizer, [item])[0] for item in inputs]
    assert features == one_by_one
    assert [f.token_type_ids[-1] for f in features] == [0, 1, 0, 1]


def test_too_long_raises_with_the_offending_index(tokenizer):
    inputs = ["short", "short too", "word " * 20, ("x", "word " * 30)]
    with pytest.raises(InputTooLong) as caught:
        classify.encode(tokenizer, inputs, max_length=16)
    assert (caught.value.index, caught.value.length, caught.value.limit) == (2, 22, 16)
    assert "at most 16" in str(caught.value)


def test_truncate_cuts_longest_first_like_transformers(tokenizer, minilm_dir):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    a, b = "one two three four five six seven eight nine ten eleven", "alpha beta gamma"
    features = classify.encode(tokenizer, ["word " * 40, (a, b), "fits"], max_length=12, truncate=True)
    assert [len(f) for f in features] == [12, 12, 3]
    assert features[1].input_ids == theirs(a, b, truncation="longest_first", max_length=12)["input_ids"]


def test_pad_batch_shapes_and_multiple():
    features = [Features([101, 7, 102], [0, 0, 0]), Features([101, 102], [0, 0])]
    batch = pad_batch(features, pad_token_id=0, pad_to_multiple_of=8)
    assert {k: v.shape for k, v in batch.items()} == {
        k: (2, 8) for k in ("input_ids", "attention_mask", "token_type_ids")
    }
    assert all(v.dtype == np.int64 for v in batch.values())
    assert batch["attention_mask"].sum(axis=1).tolist() == [3, 2]
    assert pad_batch(features)["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]


def test_softmax_is_stable_and_keeps_dtype():
    big = np.array([[1000.0, 1001.0, 999.0]], dtype=np.float32)
    probs = softmax(big)
    assert probs.dtype == np.float32 and np.all(np.isfinite(probs))
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-6)
    assert softmax(np.zeros(4)).dtype == np.float64


# ---- decode -----------------------------------------------------------------------------------
def test_decode_hand_computed():
    logits = np.array([[0.0, np.log(3.0)], [2.0, 2.0]], dtype=np.float64)
    top = classify.decode(logits, {0: "NEG", 1: "POS"}, top_k=None)
    assert top[0] == [{"label": "POS", "score": pytest.approx(0.75)}, {"label": "NEG", "score": pytest.approx(0.25)}]
    assert [r["label"] for r in top[1]] == ["NEG", "POS"]  # a tie keeps label order
    assert classify.decode(logits, {"0": "NEG", "1": "POS"})[0] == [{"label": "POS", "score": pytest.approx(0.75)}]
    one = classify.decode(np.array([[0.0]]), {0: "LABEL_0"})
    assert one == [[{"label": "LABEL_0", "score": 0.5}]]  # one label: sigmoid
    raw = classify.decode(logits, {0: "NEG", 1: "POS"}, function="none", top_k=1)
    assert raw[0] == [{"label": "POS", "score": pytest.approx(np.log(3.0))}]
    with pytest.raises(ValueError):
        classify.decode(logits, {0: "NEG", 1: "POS"}, function="tanh")


TEXTS = ["a gripping, beautifully made film", "dull.", "It's not the worst movie I've seen, but close!"]
CASES = [  # (num_labels, problem_type, function_to_apply, top_k)
    (3, None, None, 1),
    (3, None, None, 2),
    (3, None, None, None),
    (1, None, None, 1),
    (4, "multi_label_classification", None, None),
    (2, "regression", None, 2),
    (3, None, "sigmoid", 3),
    (3, None, "none", 2),
]


@pytest.mark.parametrize("num_labels,problem_type,function,top_k", CASES)
def test_decode_equals_text_classification_pipeline(tokenizer, minilm_dir, num_labels, problem_type, function, top_k):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(num_labels)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        num_labels=num_labels,
        problem_type=problem_type,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    pipe = transformers.pipeline("text-classification", model=model, tokenizer=hf_tokenizer)
    kwargs = {"top_k": top_k} | ({"function_to_apply": function} if function else {})
    expected = pipe(TEXTS, **kwargs)

    rows = []
    for feature in classify.encode(tokenizer, TEXTS):
        batch = {k: torch.from_numpy(v) for k, v in pad_batch([feature]).items()}
        with torch.no_grad():
            rows.append(model(**batch).logits[0].numpy())
    got = classify.decode(np.stack(rows), config.id2label, top_k=top_k, function=function, problem_type=problem_type)
    assert [[r["label"] for r in row] for row in got] == [[r["label"] for r in row] for row in expected]
    for got_row, expected_row in zip(got, expected):  # same float32 arithmetic: bit-identical scores
        assert [r["score"] for r in got_row] == [r["score"] for r in expected_row]


@pytest.mark.parametrize(
    "num_labels, problem_type", [(2, None), (5, None), (1, None), (4, "multi_label_classification")]
)
def test_a_text_whose_margin_exceeds_twice_the_change_keeps_its_labels(num_labels, problem_type):
    """classify.margins (what --classify-verify-margin is compared with), in the probabilities the model was trained
    for: where none moves by more than half a text's margin its label (each label's yes or no, multi-label) stays;
    every text a perturbation does change had a margin under twice the change. A regression has nothing to verify."""
    rng = np.random.default_rng(num_labels)
    logits = rng.normal(0, 2, (400, num_labels)).astype(np.float32)
    moved = logits + rng.normal(0, 0.3, logits.shape).astype(np.float32)
    facts = ModelFacts(labels={i: f"L{i}" for i in range(num_labels)}, problem_type=problem_type)
    margins = classify.margins([[{"classify": row}] for row in logits], facts)
    assert len(margins) == len(logits) and all(0 <= m <= 1 for m in margins)
    multi = problem_type is not None or num_labels == 1
    probabilities = (lambda x: 1 / (1 + np.exp(-x))) if multi else (lambda x: softmax(x, axis=-1))

    def decision(x):
        return tuple(x > 0) if multi else x.argmax()

    changed = 0
    for x, y, margin in zip(logits, moved, margins):
        if decision(x) != decision(y):
            changed += 1
            assert margin <= 2 * np.abs(probabilities(x) - probabilities(y)).max(), (x, y, margin)
    assert changed >= 5
    regression = ModelFacts(labels={0: "score"}, problem_type="regression")
    assert classify.margins([[{"classify": logits[0, :1]}]], regression) == [float("inf")]
    assert classify.margins([], facts) == []


@pytest.mark.parametrize("candidates, multi_label", [(4, False), (4, True), (1, False)])
def test_zero_shot_margins_bound_what_a_perturbation_can_change(candidates, multi_label):
    """zero_shot's margins (--zero-shot-verify-margin), in the scores it answers: a text whose best candidate (or a
    candidate's side of 0.5, multi_label) a perturbation changes had a margin under twice the largest score change."""
    from bert.tasks import TASKS
    from bert.tasks.zero_shot import scores

    task, rng = TASKS["zero_shot"], np.random.default_rng(candidates + multi_label)
    facts = ModelFacts(labels={0: "entailment", 1: "neutral", 2: "contradiction"})
    logits = rng.normal(0, 2, (300, candidates, 3)).astype(np.float32)
    moved = logits + rng.normal(0, 0.3, logits.shape).astype(np.float32)
    margins = task.margins(
        None, None, [[{"zero_shot": row} for row in text] for text in logits], facts, multi_label=multi_label
    )
    yes_no = multi_label or candidates == 1
    changed = 0
    for x, y, margin in zip(logits, moved, margins):
        a, b = scores(x, 0, multi_label=multi_label), scores(y, 0, multi_label=multi_label)
        if (tuple(a > 0.5) != tuple(b > 0.5)) if yes_no else (a.argmax() != b.argmax()):
            changed += 1
            assert margin <= 2 * np.abs(a - b).max()
    assert changed >= 5 and all(0 <= m <= 1 for m in margins)
