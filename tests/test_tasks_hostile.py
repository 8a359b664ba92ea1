"""What the served tasks answer on hostile text, decided at the codecs (no server, no model: hand-made logits on
the real MiniLM vocabulary), against transformers' pipelines' rules and the answers' invariants:

- /ner: a word holding a character the tokenizer drops (a combining accent in NFD, a soft hyphen, a zero-width
  space) is still its own word, so NFC and NFD texts get the same entities; where no character is dropped the
  served words are the pipeline's; an unknown token not named "[UNK]" is a word of its own, as in the pipeline;
- /qa: an answer never ends between a letter and its combining accent, and always indexes the context;
- /fill-mask: a [PAD] proposed for one of several masks leaves the sequence as the pipeline's does;
- every task: a text of only replacement characters (U+FFFD, which the tokenizer drops) is empty, as blank is.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest

from bert.tasks import fill_mask, ner, qa
from bert.tasks.base import EmptyInput, check_texts
from bert.tasks.common import Limits, ModelFacts
from bert.tokenizer import BertTokenizer

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
ID2LABEL = dict(enumerate(NER_LABELS))
LIMITS = Limits(max_length=64, max_sequences=16)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_dir(minilm_dir)


# ---- /ner ------------------------------------------------------------------------------------------------
def _span_logits(features: ner.NerFeatures, spans: dict[tuple[int, int], str]) -> np.ndarray:
    """Logits that label the tokens inside each character span B-/I- of its kind (decisively), the rest O."""
    logits = np.full((len(features), len(NER_LABELS)), -8.0, np.float32)
    logits[:, 0] = 8.0
    for (start, end), kind in spans.items():
        inside = [
            i
            for i, (s, e) in enumerate(features.offsets)
            if not features.special_tokens_mask[i] and start <= s and e <= end
        ]
        assert inside, (features.text[start:end], features.tokens)
        for n, i in enumerate(inside):
            logits[i] = -8.0
            logits[i, NER_LABELS.index(("B-" if n == 0 else "I-") + kind)] = 8.0
    return logits


def _served(tokenizer, text: str, spans: dict[tuple[int, int], str], aggregation: str) -> list[dict]:
    (windows,) = ner.encode_request(tokenizer, [text], LIMITS, aggregation=aggregation)
    outputs = [[{"ner": _span_logits(window, spans)} for window in windows]]
    (entities,) = ner.decode_request([text], [windows], outputs, ModelFacts(labels=ID2LABEL), aggregation=aggregation)
    return entities


CITIES = {
    "NFC": "Z\u00fcrich",
    "NFD": "Zu\u0308rich",
    "NFD Mexico": "Me\u0301xico",
    "soft hyphen": "Ham\u00adburg",
    "zero-width space": "Ber\u200blin",
}


@pytest.mark.parametrize("aggregation", ["first", "average", "max"])
@pytest.mark.parametrize("form", list(CITIES))
def test_ner_a_word_with_a_dropped_character_stays_its_own_word(tokenizer, form, aggregation):
    """The pipeline's sub-word test (a piece whose text is longer than itself continues a word) takes a whole word
    whose accent the uncased tokenizer strips, or whose soft hyphen it drops, for the rest of the word before it:
    "in Zu\u0308rich" became one word labelled as "in" (O), and the city was lost where its NFC form is found."""
    city = CITIES[form]
    text = f"Angela lives in {city} today."
    at = text.index(city)
    entities = _served(tokenizer, text, {(0, 6): "PER", (at, at + len(city)): "LOC"}, aggregation)
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in entities] == [
        ("PER", "Angela", 0, 6),
        ("LOC", city, at, at + len(city)),
    ]
    assert all(text[e["start"] : e["end"]] == e["word"] for e in entities)


ORDINARY = [
    "Hugging Face Inc. is a company based in New York City.",
    "My  name   is Wolfgang\tand I live in\nBerlin,\u00a0Germany.",
    "The unaffable Mr. O'Neill-Smith (a.k.a. \"Bob\") paid $3.50 at Z\u00fcrich's caf\u00e9 \u2603 today...",
    "\u5b89\u500d\u664b\u4e09\u5728\u4e1c\u4eac\u4f1a\u89c1\u4e86\u9a6c\u514b\u9f99\u3002 Obama \U0001f44d\U0001f3fd",
    "Schwarzenegger visited Kathmandu's Thamel district. " * 6,  # several 64-token windows
]


@pytest.mark.parametrize("aggregation", ["first", "average", "max"])
def test_ner_served_words_are_the_pipelines_where_no_character_is_dropped(tokenizer, aggregation):
    """On text the normalizer keeps whole (spaces, tabs, newlines, no-break spaces, CJK, emoji as [UNK], sub-word
    pieces, windows), the tokenizer's words are the pipeline's: the served entities are ner.decode's (the
    pipeline's, tested equal in test_tasks_ner.py) with the words as written."""
    rng = np.random.default_rng(0)
    compared = 0
    for text in ORDINARY:
        (windows,) = ner.encode_request(tokenizer, [text], LIMITS, aggregation=aggregation)
        logits = [rng.normal(scale=4.0, size=(len(w), len(NER_LABELS))).astype(np.float32) for w in windows]
        (served,) = ner.decode_request(
            [text], [windows], [[{"ner": x} for x in logits]], ModelFacts(labels=ID2LABEL), aggregation=aggregation
        )
        found = [e for w, x in zip(windows, logits) for e in ner.decode(w, x, ID2LABEL, aggregation=aggregation)]
        expected = ner.merge_windows(found) if len(windows) > 1 else found
        assert [(e["entity_group"], e["start"], e["end"], e["score"]) for e in served] == [
            (e["entity_group"], e["start"], e["end"], e["score"]) for e in expected
        ], text
        assert all(text[e["start"] : e["end"]] == e["word"] for e in served)
        compared += len(served)
    assert compared > 20


def _tokenizer_with_unk_token(unk: str) -> BertTokenizer:
    """A small uncased WordPiece tokenizer whose unknown-token is `unk` (BERT's is "[UNK]")."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    words = ["[PAD]", unk, "[CLS]", "[SEP]", "[MASK]", "angela", "met", "bob", "in", "paris", "wash", "##ington", "."]
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token=unk))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return BertTokenizer(backend, specials={"unk_token": unk})


def test_ner_unknown_token_of_another_name_is_a_word_of_its_own_as_in_the_pipeline():
    """The pipeline takes a token whose id is the tokenizer's unknown token for a whole word shown as its text; the
    decoder knew BERT's "[UNK]" alone, so with a tokenizer whose unknown token is "<unk>" a "\u2603" after "Bob" was
    joined to Bob's word (the piece "<unk>" is longer than the text it covers) and shown as "<unk>"."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    ours = _tokenizer_with_unk_token("<unk>")
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=ours.backend,
        unk_token="<unk>",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=ours.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        id2label=ID2LABEL,
        label2id={v: k for k, v in ID2LABEL.items()},
    )
    model = transformers.BertForTokenClassification(config).eval()
    text = "Angela met Bob \u2603 in Paris \u2603\u2603 Washington."
    (features,) = ner.encode(ours, [text])
    assert features.tokens.count("<unk>") == 2
    logits = _span_logits(features, {(11, 14): "PER", (15, 16): "LOC", (26, 28): "LOC"})
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=theirs)
    for aggregation in ("none", "simple", "first", "average", "max"):
        expected = pipe.postprocess(
            [
                {
                    "logits": torch.from_numpy(logits)[None],
                    "special_tokens_mask": torch.tensor([features.special_tokens_mask]),
                    "offset_mapping": torch.tensor([features.offsets]),
                    "sentence": text,
                    "is_last": True,
                    "input_ids": torch.tensor([features.input_ids]),
                }
            ],
            aggregation_strategy=transformers.pipelines.AggregationStrategy(aggregation),
        )
        got = ner.decode(features, logits, ID2LABEL, aggregation=aggregation)
        assert got == [{k: (v.item() if hasattr(v, "item") else v) for k, v in e.items()} for e in expected], (
            aggregation
        )
        assert any(e["word"] == "\u2603" for e in got), aggregation


# ---- /qa -------------------------------------------------------------------------------------------------
def test_qa_answer_keeps_the_accent_of_its_last_letter(tokenizer):
    """ "Bogota\u0301" (NFD): the uncased tokenizer's piece "bogota" ends before the accent, and the answer was
    "Bogota", a letter cut from its mark; it is the word as written, as /ner's entities are."""
    context = "Jose\u0301 lives in Bogota\u0301. He was born in Me\u0301xico."
    items = [{"question": "Where does Jose\u0301 live?", "context": context, "top_k": 3, "max_answer_len": 30}]
    (windows,) = qa.encode_request(tokenizer, items, LIMITS)
    (window,) = windows
    tokens = tokenizer.convert_ids_to_tokens(window.input_ids)
    positions = list(window.context_positions)
    start = np.zeros(len(window), np.float32)
    end = np.zeros(len(window), np.float32)
    bogota = next(p for p in positions if tokens[p] == "bogota")
    jose = next(p for p in positions if tokens[p] == "jose")
    start[bogota] = end[bogota] = 9.0
    start[jose] = end[jose] = 7.0
    outputs = [[{"qa_start": start, "qa_end": end}]]
    (answers,) = qa.decode_request(items, [windows], outputs, ModelFacts(labels={}))
    assert (answers[0]["answer"], answers[0]["start"]) == ("Bogota\u0301", context.index("Bogota"))
    assert "Jose\u0301" in [a["answer"] for a in answers]
    for answer in answers:
        assert context[answer["start"] : answer["end"]] == answer["answer"]
        assert not unicodedata.combining(context[answer["end"]]), answer  # no mark left behind


# ---- /fill-mask ------------------------------------------------------------------------------------------
def test_fill_mask_pad_proposed_for_one_of_several_masks(tokenizer, minilm_dir):
    """transformers' fill-mask pipeline drops [PAD] ids from a filled sequence before decoding it; with several
    masks (special tokens shown) a proposed [PAD] was shown as "[PAD]" in `sequence`."""
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    (feature,) = fill_mask.encode(tokenizer, ["the [MASK] sat on the [MASK] ."])
    ids = np.zeros((len(feature.input_ids), 2), dtype=np.int64)
    ids[:] = [tokenizer.pad_token_id, tokenizer.token_to_id("cat")]
    scores = np.tile(np.array([0.6, 0.4], dtype=np.float32), (len(feature.input_ids), 1))
    answers = fill_mask.decode(tokenizer, feature, scores, ids, top_k=2)
    masks = [i for i, t in enumerate(feature.input_ids) if t == tokenizer.mask_token_id]
    for position, candidates in zip(masks, answers):
        for candidate in candidates:
            filled = np.asarray(feature.input_ids)
            filled[position] = candidate["token"]
            filled = filled[filled != theirs.pad_token_id]  # the pipeline's postprocess, line for line
            assert candidate["sequence"] == theirs.decode(filled.tolist(), skip_special_tokens=False)
            assert "[PAD]" not in candidate["sequence"]
        assert candidates[0]["token_str"] == "[PAD]"


# ---- every task: nothing left to read --------------------------------------------------------------------
def test_a_text_of_replacement_characters_is_empty(tokenizer):
    """U+FFFD (what a bad decoder leaves of bytes it could not read) is dropped by BERT's normalizer as NUL is:
    such a text has no tokens, and a confident answer about nothing is what an empty text is refused to avoid."""
    assert tokenizer.backend.encode("\ufffd \ufffd\ufffd", add_special_tokens=False).ids == []
    for texts, field in [(["\ufffd"], "inputs[0]"), (["fine", "\ufffd \ufffd\u200b"], "inputs[1]")]:
        with pytest.raises(EmptyInput, match=re.escape(f"{field} is empty")):
            check_texts(texts)
    check_texts(["caf\ufffd au lait"])  # a text that keeps other characters is text
