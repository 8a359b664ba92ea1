"""bert.tasks.ner: encoding, label alignment, and decode == transformers' token-classification
pipeline for every aggregation strategy on the same (random, seeded) model logits."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from bert.tasks import ner, pad_batch
from bert.tasks.common import Limits, ModelFacts, whole_span
from bert.tokenizer import BertTokenizer, InputTooLong

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
ID2LABEL = dict(enumerate(LABELS))

SENTENCES = [
    "Hugging Face Inc. is a company based in New York City.",
    "Arnold Schwarzenegger met Zubkov in Kathmandu, Nepal, on 1996-08-22!",
    "EU rejects German call to boycott British lamb.",
    "The unaffable Mr. O'Neill-Smith (a.k.a. \"Bob\") paid $3.50 at Zürich's café ☃ today...",
    "Peter Blackburn",
]
CONLL_WORDS = [
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
    ["Peter", "Blackburn"],
    ["BRUSSELS", "1996-08-22"],
    ["Schwarzenegger", "visited", "Kathmandu", "'s", "Thamel", "district", "."],
]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_dir(minilm_dir)


# ---- encode & labels ----------------------------------------------------------------------------
def test_encode_offsets_words_and_specials(tokenizer):
    (features,) = ner.encode(tokenizer, ["Kathmandu, Nepal"])
    assert features.tokens[0] == "[CLS]" and features.tokens[-1] == "[SEP]"
    assert features.special_tokens_mask == [1] + [0] * (len(features) - 2) + [1]
    assert features.offsets[0] == (0, 0) and features.word_ids[0] is None
    words = [
        features.text[s:e] for (s, e), special in zip(features.offsets, features.special_tokens_mask) if not special
    ]
    assert "".join(words) == "Kathmandu,Nepal"
    assert len(set(features.word_ids[1:-1])) == 3  # kathmandu (several pieces), ",", nepal


def test_encode_words_offsets_index_the_joined_text(tokenizer):
    words = ["Schwarzenegger", "visited", "Kathmandu", "."]
    (features,) = ner.encode_words(tokenizer, [words])
    assert features.text == "Schwarzenegger visited Kathmandu ."
    for (start, end), word in zip(features.offsets, features.word_ids):
        if word is not None:
            assert features.text[start:end] in words[word]
    assert sorted({w for w in features.word_ids if w is not None}) == [0, 1, 2, 3]


def test_align_labels_first_subtoken_only():
    word_ids = [None, 0, 0, 0, 1, 2, 2, None]
    assert ner.align_labels([5, 0, 3], word_ids) == [-100, 5, -100, -100, 0, 3, -100, -100]
    assert ner.align_labels([5, 0, 3], word_ids, label_all_subtokens=True) == [-100, 5, 5, 5, 0, 3, 3, -100]
    assert ner.align_labels([1], [None, 0, None], ignore_index=-1) == [-1, 1, -1]
    # B- on a word's first sub-token, I- on the rest: "W." = "w" "." must stay one entity when served.
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    assert ner.continuation_labels(labels) == {1: 2, 3: 4}
    assert ner.align_labels(
        [1, 2, 0], [None, 0, 0, 1, 1, 2, None], label_all_subtokens=True, continuation=ner.continuation_labels(labels)
    ) == [-100, 1, 2, 2, 2, 0, -100]


def test_align_labels_on_real_conll_words(tokenizer):
    (features,) = ner.encode_words(tokenizer, [CONLL_WORDS[3]])
    word_labels = [1, 0, 5, 0, 5, 0, 0]
    labels = ner.align_labels(word_labels, features.word_ids)
    assert [label for label in labels if label != -100] == word_labels  # every word labelled once
    assert len(labels) == len(features) and labels[0] == labels[-1] == -100


def test_too_long_text_raises_or_truncates(tokenizer):
    texts = ["fine", "word " * 20]
    with pytest.raises(InputTooLong) as caught:
        ner.encode(tokenizer, texts, max_length=10)
    assert (caught.value.index, caught.value.limit) == (1, 10)
    cut = ner.encode(tokenizer, texts, max_length=10, truncate=True)
    assert [len(f) for f in cut] == [3, 10] and cut[1].tokens[-1] == "[SEP]"
    assert len(ner.encode_words(tokenizer, [["word"] * 20], max_length=10)[0]) == 10  # training: truncates


def test_decode_ignores_padding_rows(tokenizer):
    (features,) = ner.encode(tokenizer, ["Peter Blackburn"])
    logits = np.random.default_rng(0).normal(size=(len(features), len(LABELS))).astype(np.float32)
    padded = np.concatenate([logits, np.full((5, len(LABELS)), 50.0, np.float32)])
    for aggregation in ner.AGGREGATIONS:
        assert ner.decode(features, padded, ID2LABEL, aggregation=aggregation) == ner.decode(
            features, logits, ID2LABEL, aggregation=aggregation
        )


# ---- parity with the pipeline -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_ner(minilm_dir, tokenizer):
    """A random BertForTokenClassification with a real vocabulary; classifier scaled up so that
    labels change from token to token (multi-token entities, B-/I- boundaries) instead of near-ties."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        id2label=ID2LABEL,
        label2id={v: k for k, v in ID2LABEL.items()},
    )
    model = transformers.BertForTokenClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30.0)
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    return model, transformers.pipeline("token-classification", model=model, tokenizer=hf_tokenizer)


def _logits(model, features) -> np.ndarray:
    import torch

    batch = {k: torch.from_numpy(v) for k, v in pad_batch([features]).items()}
    with torch.no_grad():
        return model(**batch).logits[0].numpy()


def _plain(entities: list[dict]) -> list[dict]:
    """The pipeline's numpy scalars as python numbers, so dicts compare exactly."""
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in e.items()} for e in entities]


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
def test_decode_equals_token_classification_pipeline(tokenizer, tiny_ner, aggregation):
    model, pipe = tiny_ner
    features = ner.encode(tokenizer, SENTENCES)
    compared = 0
    for text, feature in zip(SENTENCES, features):
        expected = _plain(pipe(text, aggregation_strategy=aggregation))
        got = ner.decode(feature, _logits(model, feature), ID2LABEL, aggregation=aggregation)
        assert got == expected, text
        compared += len(expected)
    assert compared > 10  # the comparison saw entities, not empty lists


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
def test_decode_pre_split_words_equals_pipeline(tokenizer, tiny_ner, aggregation):
    model, pipe = tiny_ner
    for words, feature in zip(CONLL_WORDS, ner.encode_words(tokenizer, CONLL_WORDS)):
        (entities,) = pipe(words, aggregation_strategy=aggregation, is_split_into_words=True)  # one-item batch
        expected = _plain(entities)
        assert ner.decode(feature, _logits(model, feature), ID2LABEL, aggregation=aggregation) == expected


def test_decode_with_no_ignored_labels_equals_pipeline(tokenizer, tiny_ner):
    model, pipe = tiny_ner
    text = SENTENCES[1]
    (feature,) = ner.encode(tokenizer, [text])
    expected = _plain(pipe(text, aggregation_strategy="simple", ignore_labels=[]))
    got = ner.decode(feature, _logits(model, feature), ID2LABEL, aggregation="simple", ignore_labels=())
    assert got == expected
    # Nothing ignored: the groups cover the sentence from its first to its last character, in order.
    assert got[0]["start"] == 0 and got[-1]["end"] == len(text)
    assert all(left["end"] <= right["start"] for left, right in zip(got, got[1:]))


# ---- spans keep a letter with its combining marks -------------------------------------------------
def _entity_logits(features, labels: dict[int, str]) -> np.ndarray:
    """Logits that give token i the label labels[i] (decisively) and every other token O."""
    logits = np.full((len(features), len(LABELS)), -10.0, np.float32)
    logits[:, LABELS.index("O")] = 10.0
    for index, label in labels.items():
        logits[index] = -10.0
        logits[index, LABELS.index(label)] = 10.0
    return logits


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
def test_served_entity_ends_after_the_combining_marks_of_its_last_letter(tokenizer, aggregation):
    """José in NFD ("e" then U+0301): the uncased tokenizer strips the accent, so its piece "jose" ends before the
    mark; the served entity (decode_request: words as written) takes the mark in."""
    text = "Jose\u0301 lives in Paris"
    (windows,) = ner.encode_request(tokenizer, [text], Limits(max_length=64, max_sequences=8))
    (features,) = windows
    assert features.tokens[1] == "jose" and features.offsets[1] == (0, 4)  # the tokenizer's offsets stop short
    paris = features.tokens.index("paris")
    logits = _entity_logits(features, {1: "B-PER", paris: "B-LOC"})
    (entities,) = ner.decode_request(
        [text], [windows], [[{"ner": logits}]], ModelFacts(labels=ID2LABEL), aggregation=aggregation
    )
    assert [(e["word"], e["start"], e["end"]) for e in entities] == [("Jose\u0301", 0, 5), ("Paris", 15, 20)]
    assert all(text[e["start"] : e["end"]] == e["word"] for e in entities)


def test_a_span_never_starts_on_a_combining_mark_and_ascii_spans_are_untouched():
    """A tokenizer that gives the mark a piece of its own ("e" + "##\u0301"): an entity of that piece alone starts
    at its letter; marks after a whole entity join it, a ZWJ and a variation selector too."""
    text = "Jose\u0301 lives \u2764\ufe0f"
    features = ner.NerFeatures(
        input_ids=[0] * 6,
        token_type_ids=[0] * 6,
        offsets=[(0, 0), (0, 4), (4, 5), (6, 11), (12, 13), (0, 0)],
        word_ids=[None, 0, 0, 1, 2, None],
        special_tokens_mask=[1, 0, 0, 0, 0, 1],
        text=text,
        tokens=["[CLS]", "jose", "##\u0301", "lives", "\u2764", "[SEP]"],
    )
    logits = _entity_logits(features, {2: "B-MISC", 4: "B-LOC"})
    entities = ner.decode(features, logits, ID2LABEL, aggregation="none", word_from_text=True)
    assert [(e["word"], e["start"], e["end"]) for e in entities] == [("e\u0301", 3, 5), ("\u2764\ufe0f", 12, 14)]
    # The pipeline's own words (word_from_text off) keep its offsets, as transformers gives them.
    assert [(e["start"], e["end"]) for e in ner.decode(features, logits, ID2LABEL, aggregation="none")] == [
        (4, 5),
        (12, 13),
    ]
    assert whole_span("Paris, France", 0, 5) == (0, 5)  # ASCII: nothing moves
    assert whole_span("a\u0301\u0327b", 0, 1) == (0, 3)  # every mark that follows
    assert whole_span("\U0001f468\u200d\U0001f469", 0, 1) == (0, 2)  # a zero-width joiner
    assert whole_span("\u0301x", 0, 2) == (0, 2)  # a mark at the very start has nothing to go back to


def test_aggregation_is_declared_once_with_the_default_the_server_serves():
    # One declaration (bert/tasks/ner.py): the codec, the request model and the batch job's option read it.
    import dataclasses
    import inspect

    from batch.options import BatchOptions
    from serving.routes import schemas

    assert ner.DEFAULT_AGGREGATION == "first"  # what /ner has always served when a request names none
    assert inspect.signature(ner.decode).parameters["aggregation"].default == ner.DEFAULT_AGGREGATION
    field = schemas.NerRequest.model_fields["aggregation"]
    assert field.default == ner.DEFAULT_AGGREGATION
    assert set(typing.get_args(field.annotation)) == set(ner.AGGREGATIONS)
    job = next(f for f in dataclasses.fields(BatchOptions) if f.name == "aggregation")
    assert job.default == ner.DEFAULT_AGGREGATION


@pytest.mark.parametrize("aggregation", ner.AGGREGATIONS)
def test_a_text_whose_margin_exceeds_twice_the_change_keeps_its_entities(tokenizer, aggregation):
    """ner.margins (what --ner-verify-margin is compared with): where no probability of a text moves by more than
    half its margin, its entities keep their labels and spans; the texts whose entities a perturbation does change
    all had margins under twice the change."""
    rng = np.random.default_rng(0)
    texts = [s for s in SENTENCES for _ in range(8)]
    features = ner.encode(tokenizer, texts)
    logits = [rng.normal(0, 2, (len(f), len(LABELS))).astype(np.float32) for f in features]
    moved = [x + rng.normal(0, 0.15, x.shape).astype(np.float32) for x in logits]
    margins = ner.margins([[f] for f in features], [[{"ner": x}] for x in logits], aggregation=aggregation)
    assert all(0 <= m <= 1 for m in margins)

    def spans(f, x):
        found = ner.decode(f, x, ID2LABEL, aggregation=aggregation, tokenizer_words=True)
        return [(e.get("entity_group", e.get("entity")), e["start"], e["end"]) for e in found]

    changed = 0
    for f, x, y, margin in zip(features, logits, moved, margins):
        change = np.abs(softmax(x) - softmax(y)).max()
        if spans(f, x) != spans(f, y):
            changed += 1
            assert margin <= 2 * change, (f.text, margin, change)
    assert changed >= 3  # the perturbation is large enough to change some texts
    assert ner.margins([], []) == []


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
