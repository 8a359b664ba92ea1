"""Token classification (NER): text in, labelled character spans out.

`decode` reproduces transformers' TokenClassificationPipeline postprocessing (softmax per token,
the "is this a sub-word" test, word aggregation none/simple/first/average/max, B-/I- grouping),
so a served model answers exactly what the pipeline would for the same logits.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

import numpy as np
from tokenizers import decoders

from bert.tasks.base import (
    MODEL,
    Head,
    JobColumns,
    Labels,
    Param,
    Route,
    Task,
    TaskOption,
    check_inputs,
    column_of,
    described,
    one_or_list,
    texts_of,
    texts_param,
)
from bert.tasks.common import (
    DataError,
    Features,
    Limits,
    ModelFacts,
    PathLike,
    bounded_text,
    check_length,
    decision_leads,
    open_text,
    softmax,
    whole_span,
)
from bert.tasks.windows import LongInputs, max_text_tokens, single_template, too_much_work, window_count
from bert.tokenizer import UNK, InputTooLong

# transformers' aggregation strategies; the default, "first", labels whole words by their first piece, so an entity is
# never a fragment of a word
AGGREGATIONS = ("first", "simple", "average", "max", "none")
DEFAULT_AGGREGATION = "first"
# Joins word pieces back into text ("new", "##castle" -> "newcastle"), as BertTokenizerFast does.
_PIECES_TO_TEXT = decoders.WordPiece(prefix="##")


@dataclass(kw_only=True)
class Entity:
    """An entity found in a text (with aggregation "none": one token and its label)."""

    entity_group: Optional[str] = described("the entity type (aggregation other than none)", None)
    entity: Optional[str] = described("the token's label (aggregation none)", None)
    index: Optional[int] = described("token position (aggregation none)", None)
    score: float
    word: str
    start: int = described("character offset of the first character")
    end: int = described("character offset one past the last character")


@dataclass
class NerFeatures(Features):
    offsets: list[tuple[int, int]]  # character span of each token in `text`; (0, 0) for special tokens
    word_ids: list[int | None]  # index of the word each token belongs to; None for special tokens
    special_tokens_mask: list[int]  # 1 for [CLS]/[SEP]
    text: str  # the text the offsets index (for pre-split words: the words joined by single spaces)
    tokens: list[str] = field(default_factory=list)  # the word pieces, so decoding needs no tokenizer
    # Whether the tokenizer marks a word's continuing pieces (WordPiece's "##"); byte-level BPE and Unigram do
    # not, and a piece then continues a word when no space precedes it (transformers' pipeline rule for them).
    marks_subwords: bool = True
    unk_token: str = UNK  # the tokenizer's unknown token ("[UNK]", "<unk>"): a word of its own, shown as its text


# ---- encoding -----------------------------------------------------------------------------
def _marks_subwords(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend", None)
    return (
        bool(getattr(getattr(backend, "model", None), "continuing_subword_prefix", None))
        if backend is not None
        else True
    )


def _unk_token(tokenizer) -> str:
    return getattr(tokenizer, "unk_token", None) or UNK


def _features(
    encoding, text: str, char_shift: list[int] | None = None, marks_subwords: bool = True, unk_token: str = UNK
) -> NerFeatures:
    word_ids = list(encoding.word_ids)
    offsets = [tuple(o) for o in encoding.offsets]
    if char_shift is not None:  # pre-split words: offsets are relative to each word
        offsets = [
            (s + char_shift[w], e + char_shift[w]) if w is not None else (s, e) for (s, e), w in zip(offsets, word_ids)
        ]
    return NerFeatures(
        input_ids=list(encoding.ids),
        token_type_ids=list(encoding.type_ids),
        offsets=offsets,
        word_ids=word_ids,
        special_tokens_mask=list(encoding.special_tokens_mask),
        text=text,
        tokens=list(encoding.tokens),
        marks_subwords=marks_subwords,
        unk_token=unk_token,
    )


def _encode_checked(tokenizer, inputs, *, max_length: int, truncate: bool, is_split_into_words: bool = False):
    if not is_split_into_words:  # a huge text is refused (or cut) at the cost of its first tokens
        bounded = [bounded_text(tokenizer, text, max_length) for text in inputs]
        cut = [i for i, (_, was_cut) in enumerate(bounded) if was_cut]
        if cut and not truncate:
            raise InputTooLong(cut[0], None, max_length)
        inputs = [text for text, _ in bounded]
    encodings = list(tokenizer.encode_batch(inputs, is_split_into_words=is_split_into_words))
    too_long = [i for i, e in enumerate(encodings) if len(e.ids) > max_length]
    if too_long and not truncate:
        check_length(too_long[0], len(encodings[too_long[0]].ids), max_length)
    if too_long:
        cut = tokenizer.encode_batch(
            [inputs[i] for i in too_long],
            max_length=max_length,
            truncation=True,
            is_split_into_words=is_split_into_words,
        )
        for i, encoding in zip(too_long, cut):
            encodings[i] = encoding
    return encodings


def encode(tokenizer, texts: list[str], *, max_length: int = 512, truncate: bool = False) -> list[NerFeatures]:
    """Texts -> NerFeatures. Longer than max_length: InputTooLong, or with `truncate` the tail is cut."""
    encodings = _encode_checked(tokenizer, list(texts), max_length=max_length, truncate=truncate)
    marks, unk = _marks_subwords(tokenizer), _unk_token(tokenizer)
    return [_features(encoding, text, marks_subwords=marks, unk_token=unk) for encoding, text in zip(encodings, texts)]


def encode_words(
    tokenizer, words: list[list[str]], *, max_length: int = 512, truncate: bool = True
) -> list[NerFeatures]:
    """Pre-split words (CoNLL) -> NerFeatures; word_ids index the given words, offsets index " ".join(words).

    Truncates by default (training data); pass truncate=False to get InputTooLong instead.
    """
    words = [list(w) for w in words]
    encodings = _encode_checked(tokenizer, words, max_length=max_length, truncate=truncate, is_split_into_words=True)
    features = []
    for sentence, encoding in zip(words, encodings):
        starts = np.cumsum([0] + [len(w) + 1 for w in sentence[:-1]]).tolist()
        features.append(
            _features(
                encoding,
                " ".join(sentence),
                char_shift=starts,
                marks_subwords=_marks_subwords(tokenizer),
                unk_token=_unk_token(tokenizer),
            )
        )
    return features


def align_labels(
    word_labels: list[int],
    word_ids: list[int | None],
    *,
    label_all_subtokens: bool = False,
    continuation: dict[int, int] | None = None,
    ignore_index: int = -100,
) -> list[int]:
    """Per-token training labels: a word's label on its first sub-token, ignore_index on the rest
    (or, with label_all_subtokens, a label on every sub-token: the word's, mapped through
    `continuation` (e.g. B-PER -> I-PER) after the first) and ignore_index on special tokens.

    Labelling every sub-token matters when text is served: the server's words are the tokenizer's
    (punctuation splits "W." into "w" and "."), so a sub-token the model was never taught to label
    would break "W. Athey" into two entities."""
    continuation = continuation or {}
    labels, previous = [], None
    for word in word_ids:
        if word is None:
            labels.append(ignore_index)
        elif word != previous:
            labels.append(word_labels[word])
        elif label_all_subtokens:
            labels.append(continuation.get(word_labels[word], word_labels[word]))
        else:
            labels.append(ignore_index)
        previous = word
    return labels


def continuation_labels(labels: list[str]) -> dict[int, int]:
    """Label index of each B-X -> that of I-X, for the sub-tokens after a word's first (IOB2 labels)."""
    index = {label: i for i, label in enumerate(labels)}
    return {
        i: index["I-" + label[2:]]
        for i, label in enumerate(labels)
        if label.startswith("B-") and "I-" + label[2:] in index
    }


# ---- decoding -----------------------------------------------------------------------------
def _label(id2label: dict, index) -> str:
    index = int(index)
    return id2label[index] if index in id2label else id2label[str(index)]


def _pieces_to_text(pieces: list[str]) -> str:
    return _PIECES_TO_TEXT.decode(pieces)


def _pre_entities(
    features: NerFeatures, tokens: list[str], scores: np.ndarray, tokenizer_words: bool = False
) -> list[dict]:
    """One record per non-special token: its piece, scores, span, and whether it continues a word (see decode's
    `tokenizer_words`)."""
    records = []
    for index, token_scores in enumerate(scores):
        if features.special_tokens_mask[index]:
            continue
        piece = tokens[index]
        start, end = features.offsets[index]
        original = features.text[start:end]
        if features.marks_subwords and tokenizer_words:
            word = features.word_ids[index]
            is_subword = index > 0 and word is not None and word == features.word_ids[index - 1]
        elif features.marks_subwords:
            # transformers' test: a "##piece" is longer than the text it covers, a whole word is not.
            is_subword = len(piece) != len(original)
        else:
            is_subword = start > 0 and " " not in features.text[start - 1 : start + 1]
        if piece == features.unk_token:  # show the text, not "[UNK]"
            piece, is_subword = original, False
        records.append(
            {
                "word": piece,
                "scores": token_scores,
                "start": int(start),
                "end": int(end),
                "index": index,
                "is_subword": is_subword,
            }
        )
    return records


def _token_entities(records: list[dict], id2label: dict) -> list[dict]:
    entities = []
    for record in records:
        best = record["scores"].argmax()
        entities.append(
            {
                "entity": _label(id2label, best),
                "score": record["scores"][best],
                "index": record["index"],
                "word": record["word"],
                "start": record["start"],
                "end": record["end"],
            }
        )
    return entities


def _word_entity(pieces: list[dict], aggregation: str, id2label: dict) -> dict:
    """One label for a whole word from its sub-token records."""
    if aggregation == "first":
        scores = pieces[0]["scores"]
    elif aggregation == "max":
        scores = max(pieces, key=lambda p: p["scores"].max())["scores"]
    elif aggregation == "average":
        scores = np.nanmean(np.stack([p["scores"] for p in pieces]), axis=0)
    else:
        raise ValueError(f"not a word aggregation: {aggregation!r}")
    best = scores.argmax()
    return {
        "entity": _label(id2label, best),
        "score": scores[best],
        "word": _pieces_to_text([p["word"] for p in pieces]),
        "start": pieces[0]["start"],
        "end": pieces[-1]["end"],
    }


def _words(records: list[dict]) -> list[list[dict]]:
    """Token records grouped into words (a sub-word record joins the word before it)."""
    words: list[list[dict]] = []
    for record in records:
        if words and record["is_subword"]:
            words[-1].append(record)
        else:
            words.append([record])
    return words


def _word_entities(records: list[dict], aggregation: str, id2label: dict) -> list[dict]:
    return [_word_entity(pieces, aggregation, id2label) for pieces in _words(records)]


def _lead(scores: np.ndarray) -> float:
    """The best label's probability less the second best's."""
    return float(decision_leads(scores))


def _word_lead(pieces: list[dict], aggregation: str) -> float:
    """How far the scores that label this word (as `_word_entity` takes them) are from labelling it otherwise."""
    if aggregation == "first":
        return _lead(pieces[0]["scores"])
    if aggregation == "average":
        return _lead(np.nanmean(np.stack([p["scores"] for p in pieces]), axis=0))
    # max: the piece with the highest probability labels the word; another piece of another label could overtake it
    chosen = max(pieces, key=lambda p: p["scores"].max())
    lead = _lead(chosen["scores"])
    for piece in pieces:
        if piece is not chosen and piece["scores"].argmax() != chosen["scores"].argmax():
            lead = min(lead, float(chosen["scores"].max() - piece["scores"].max()))
    return lead


def margins(features: list, outputs: list, *, aggregation: str = DEFAULT_AGGREGATION, **_) -> list[float]:
    """Per text, how sure its entities are: the smallest lead, over the scores that label a token (aggregation none
    or simple) or a word (first, average, max: as that aggregation takes its pieces), of the best label's
    probability over the second's (1.0 for a text with nothing to label). A slightly perturbed model (int8)
    changes an entity only where a lead is small; the engine recomputes those texts on an exact model
    (--ner-verify-model)."""
    found = []
    for windows, sequences in zip(features, outputs):
        lead = 1.0
        for window, sequence in zip(windows, sequences):
            logits = np.asarray(sequence["ner"])[: len(window)].astype(np.float32)
            records = _pre_entities(window, window.tokens, softmax(logits, axis=-1), tokenizer_words=True)
            groups = [[r] for r in records] if aggregation in ("none", "simple") else _words(records)
            for pieces in groups:
                lead = min(lead, _word_lead(pieces, "first" if len(pieces) == 1 else aggregation))
        found.append(lead)
    return found


def _split_tag(label: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); a label without a B-/I- prefix counts as a continuation."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _group(members: list[dict]) -> dict:
    return {
        "entity_group": members[0]["entity"].split("-", 1)[-1],
        "score": np.mean(np.nanmean([m["score"] for m in members])),
        "word": _pieces_to_text([m["word"] for m in members]),
        "start": members[0]["start"],
        "end": members[-1]["end"],
    }


def group_entities(entities: list[dict]) -> list[dict]:
    """Merge neighbours with the same tag unless the later one starts a new entity (B-)."""
    groups: list[list[dict]] = []
    for entity in entities:
        bi, tag = _split_tag(entity["entity"])
        if groups and tag == _split_tag(groups[-1][-1]["entity"])[1] and bi != "B":
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return [_group(members) for members in groups]


def decode(
    features: NerFeatures,
    logits: np.ndarray,
    id2label: dict[int, str],
    *,
    aggregation: str = DEFAULT_AGGREGATION,
    ignore_labels: tuple[str, ...] = ("O",),
    tokenizer=None,
    word_from_text: bool = False,
    tokenizer_words: bool = False,
) -> list[dict]:
    """Logits (T, num_labels) of one sequence -> entities, exactly as transformers' pipeline returns them.

    With `word_from_text`, each `word` is the text as written (`text[start:end]`: casing and accents kept)
    instead of the pipeline's word pieces joined back (lower-cased by an uncased tokenizer), and no span splits a
    character from its combining marks: one ending right before marks (an accent-stripping tokenizer drops them
    from its offsets) takes them in, one starting on a mark starts at its letter (`whole_span`).

    With `tokenizer_words` (features of a text, not of pre-split words), a piece continues a word when the tokenizer
    says so (it shares the word of the token before it) instead of by the pipeline's test, a piece that covers more
    text than itself: where the normalizer drops a character inside a word (the combining accent of an NFD
    "Zu\u0308rich" under an uncased tokenizer, a soft hyphen, a zero-width space) the word's one piece covers more
    text than it holds, and the pipeline takes the word for the rest of the one before it ("in Zu\u0308rich" one
    word, labelled as "in"). Elsewhere both tests agree. Tokenizers that do not mark sub-words keep the pipeline's.

    aggregation "none": [{"entity", "score", "index", "word", "start", "end"}] per token;
    otherwise [{"entity_group", "score", "word", "start", "end"}]. Rows beyond len(features) (padding) are ignored.
    `tokenizer` is needed only for features built by hand without `tokens`.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    logits = np.asarray(logits)[: len(features)]
    if logits.dtype != np.float64:
        logits = logits.astype(np.float32)  # the pipeline scores fp16/bf16 logits in float32
    tokens = features.tokens
    if not tokens:
        if tokenizer is None:
            raise ValueError("features carry no tokens; pass tokenizer= to decode them")
        tokens = tokenizer.convert_ids_to_tokens(features.input_ids)
    records = _pre_entities(features, tokens, softmax(logits, axis=-1), tokenizer_words)
    if aggregation in ("none", "simple"):
        entities = _token_entities(records, id2label)
    else:
        entities = _word_entities(records, aggregation, id2label)
    if aggregation != "none":
        entities = group_entities(entities)
    kept = [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore_labels]
    for entity in kept:
        entity["score"] = float(entity["score"])
        if word_from_text:
            text = features.text
            start, end = whole_span(text, entity["start"], entity["end"])  # an accent's mark stays with its letter
            entity["start"], entity["end"], entity["word"] = start, end, text[start:end]
    return kept


# ---- serving ------------------------------------------------------------------------------------
LONG_INPUTS = LongInputs(
    merge="the entities of every window; of two that overlap the longer is kept, then the higher score "
    "(transformers' token-classification pipeline with a stride)",
    stride_field="stride",
)


def encode_request(
    tokenizer,
    items: list[str],
    limits: Limits,
    *,
    truncate: bool = False,
    stride: int | None = None,
    aggregation: str = DEFAULT_AGGREGATION,
    **_,
) -> list[list[NerFeatures]]:
    """Texts -> their windows: one for a text that fits the model, else the windows of transformers'
    token-classification pipeline with `stride` (tokenizers' overflow), at most limits.max_sequences in all
    (TooMuchWork beyond, before any window is built). With `truncate`, one window each: the text's start."""
    if truncate:
        if stride is not None:
            raise ValueError('stride: windows a long text whole, "truncate": true cuts it; send one of them')
        return [[f] for f in encode(tokenizer, items, max_length=limits.max_length, truncate=True)]
    max_length, limit = limits.max_length, limits.max_sequences
    specials = sum(len(part) for part in single_template(tokenizer))
    capacity = max_length - specials
    stride = LONG_INPUTS.stride(stride, capacity, max_length)
    each = max_text_tokens(max(limit - len(items) + 1, 1), capacity, stride)  # the others need a window each
    if any(cut for _, cut in (bounded_text(tokenizer, text, each) for text in items)):
        raise too_much_work(None, 0, limit, max_length)
    encodings = list(tokenizer.encode_batch(list(items)))
    needed = sum(window_count(len(e.ids) - specials, capacity, stride) for e in encodings)
    if needed > limit:
        raise too_much_work(needed, 0, limit, max_length)
    long = [i for i, e in enumerate(encodings) if len(e.ids) > max_length]
    if long and aggregation == "none":
        raise ValueError(
            f'aggregation: "none" gives token positions inside one window, and input {long[0]} needs several of '
            f'{max_length} tokens; choose another aggregation, or send "truncate": true'
        )
    marks, unk = _marks_subwords(tokenizer), _unk_token(tokenizer)
    windows = [[encoding] for encoding in encodings]
    for i in long:
        first = tokenizer.encode_batch([items[i]], max_length=max_length, truncation=True, stride=stride)[0]
        windows[i] = [first, *first.overflowing]
    return [[_features(w, text, marks_subwords=marks, unk_token=unk) for w in ws] for ws, text in zip(windows, items)]


def merge_windows(entities: list[dict]) -> list[dict]:
    """Entities of overlapping windows, in text order, each once: of two that overlap, the longer is kept, at equal
    length the higher score (transformers' TokenClassificationPipeline.aggregate_overlapping_entities)."""
    if not entities:
        return entities
    entities = sorted(entities, key=lambda e: e["start"])
    kept, previous = [], entities[0]
    for entity in entities:
        if previous["start"] <= entity["start"] < previous["end"]:
            length, previous_length = entity["end"] - entity["start"], previous["end"] - previous["start"]
            if length > previous_length or (length == previous_length and entity["score"] > previous["score"]):
                previous = entity
        else:
            kept.append(previous)
            previous = entity
    kept.append(previous)
    return kept


def decode_request(
    items: list, features: list, outputs: list, facts: ModelFacts, *, aggregation: str = DEFAULT_AGGREGATION, **_
) -> list[list[dict]]:
    """Entities per text, each `word` as written in the text (casing kept), words as the tokenizer splits them
    (decode's `tokenizer_words`); a windowed text's merged."""
    answers = []
    for windows, sequences in zip(features, outputs):
        found = [
            entity
            for window, sequence in zip(windows, sequences)
            for entity in decode(
                window,
                sequence["ner"],
                facts.labels,
                aggregation=aggregation,
                word_from_text=True,
                tokenizer_words=True,
            )
        ]
        answers.append(merge_windows(found) if len(windows) > 1 else found)
    return answers


ENTITY_COLUMNS = (
    ("start", "int32"),
    ("end", "int32"),
    ("word", "string"),
    ("entity_group", "string"),
    ("score", "float32"),
)


def _entity_rows(found: list[dict]) -> list[dict]:
    """A text's entities as a batch job's rows; aggregation "none" gives each token's "entity" as its group."""
    return [
        {
            "start": e["start"],
            "end": e["end"],
            "word": e["word"],
            "entity_group": e.get("entity_group", e.get("entity")),
            "score": e["score"],
        }
        for e in found
    ]


class NerTask(Task):
    """Token classification: transformers' token-classification pipeline, words as written."""

    name = "ner"
    order = 20
    head = Head("token", attribute="token_classifier", single_attribute="classifier")
    architectures = ("BertForTokenClassification",)
    labelled = True
    graph_outputs = {"ner_logits": "ner"}
    single_graph_outputs = {"logits": "ner"}
    routes = (
        Route(
            "/ner",
            "NerRequest",
            # a text: its entities; a list of texts: one list of entities per text
            Union[list[Entity], list[list[Entity]]],
            "Find named entities",
            to_items=texts_of,
            shape=one_or_list,
            check=check_inputs,
            fields=(
                MODEL,
                texts_param("My name is Wolfgang and I live in Berlin."),
                Param(
                    "aggregation",
                    Literal[AGGREGATIONS],
                    DEFAULT_AGGREGATION,
                    "how word pieces are merged into entities (transformers' aggregation_strategy); the default, "
                    "first, labels whole words by their first piece, so an entity is never a fragment of a word",
                    job=True,
                ),
                Param(
                    "stride",
                    Optional[int],
                    None,
                    "a text longer than the model's window is cut into windows that share this many tokens "
                    "(transformers' token-classification pipeline's `stride`) and their entities are merged, each "
                    "once, with offsets into the text; default 128, or less where windows are narrower; at most half "
                    "a window",
                    minimum=0,
                ),
                Param(
                    "truncate",
                    bool,
                    False,
                    "cut inputs longer than the model's limit to their start instead of windowing them",
                ),
            ),
            doc="`inputs` a string: a list of entities {entity_group, score, word, start, end} (character offsets; "
            '`word` as written). A list: one list of entities per input. With aggregation "none": per token '
            "{entity, score, index, word, start, end}.",
        ),
    )
    job = JobColumns(
        inputs=("text",),
        arity=(1,),
        results=(("entities", ("list", ("struct", ENTITY_COLUMNS))),),
        values=lambda answers: {"entities": column_of(answers, _entity_rows)},
    )
    long_inputs = LONG_INPUTS
    trainable = True
    main_metric = "f1"

    def encode_request(self, tokenizer, items, limits, **options):
        return encode_request(tokenizer, items, limits, **options)

    def decode_request(self, items, features, outputs, facts, **options):
        return decode_request(items, features, outputs, facts, **options)

    def decisions(self, items, answers):
        return [frozenset((e["start"], e["end"], e.get("entity_group", e.get("entity"))) for e in a) for a in answers]

    def margins(self, items, features, outputs, facts, **options):
        return margins(features, outputs, **options)

    verify_margin = TaskOption(
        "verify_margin",
        0.2,
        "recompute a text where a token's or word's best label leads its second by less than this (scores are "
        "probabilities, 0-1)",
        minimum=0,
        maximum=1,
    )

    # ---- training hooks: CoNLL sentences (TaggedSentence) --------------------------
    train_options = (
        TaskOption(
            "scheme", "auto", "ner: auto | iob1 | iob2: tag scheme of the CoNLL files (IOB1 is converted to IOB2)"
        ),
        TaskOption(
            "label_all_subtokens",
            False,
            "ner: train every sub-token (B- becomes I- after a word's first; default: first only)",
            evaluate=False,
        ),
    )
    train_data_help = "CoNLL file (IOB1 or IOB2)"

    def train_problems(self, cfg) -> list[str]:
        problems = super().train_problems(cfg)
        if cfg.scheme not in ("auto", "iob1", "iob2"):
            problems.append(f"--scheme must be auto, iob1 or iob2, got {cfg.scheme!r}")
        return problems

    def read_examples(self, cfg, *, train: bool = True) -> tuple[list, list]:
        return (read_conll(cfg.train_data, scheme=cfg.scheme) if train else []), read_conll(
            cfg.eval_data, scheme=cfg.scheme
        )

    def train_labels(self, cfg, train: list, evaluation: list) -> Labels:
        from bert.config import ConfigError

        kinds = sorted({t.split("-", 1)[1] for s in train for t in s.tags if t != "O"})
        labels = ["O"] + [f"{p}-{k}" for k in kinds for p in ("B", "I")]
        unknown = {t for s in evaluation for t in s.tags} - set(labels)
        if unknown:
            raise ConfigError(f"evaluation tags {sorted(unknown)} never occur in the training data")
        return Labels(labels, labels)

    def saved_labels(self, cfg, model_config, saved: dict) -> Labels:
        id2label = model_config.id2label or {}
        labels = [id2label[i] for i in sorted(id2label)]
        return Labels(labels, labels)

    def encode_train(self, tokenizer, examples: list, labels: Labels, cfg) -> tuple[list, list]:
        return encode_ner(tokenizer, examples, labels.values, cfg.max_seq_length, cfg.label_all_subtokens)

    def collate_targets(self, targets: list, width: int) -> dict:
        import torch

        from bert.losses import IGNORE_INDEX

        labels = torch.full((len(targets), width), IGNORE_INDEX, dtype=torch.long)
        for row, target in enumerate(targets):
            labels[row, : len(target)] = torch.tensor(target)
        return {"labels": labels}

    def loss(self, outputs: dict, batch: dict):
        import torch.nn.functional as F

        from bert.losses import IGNORE_INDEX

        logits = outputs[self.output_name("ner")]
        return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)

    def evaluate(self, model, tokenizer, examples: list, labels: Labels, cfg) -> dict:
        return evaluate_ner(
            model,
            tokenizer,
            examples,
            labels=labels.values,
            max_seq_length=cfg.max_seq_length,
            batch_size=cfg.eval_batch_size,
        )

    def summary(self, metrics: dict) -> str:
        return f"ner entity F1 {metrics['f1']:.2f}"

    def embed_texts(self, examples: list) -> dict[str, list[str]]:
        return {self.name: [" ".join(s.words) for s in examples]}


# ---- training: CoNLL files, token targets, evaluation and its metric (conlleval) --------------------------
@dataclass
class TaggedSentence:
    words: list[str]
    tags: list[str]  # IOB2
    document: int = 0  # index of the -DOCSTART- document it came from


def _prefix_and_kind(tag: str) -> tuple[str, str | None]:
    if tag == "O" or "-" not in tag:
        return "O", None
    prefix, kind = tag.split("-", 1)
    return prefix, kind


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between two adjacent entities of one type) -> IOB2 (B- starts every entity)."""
    out = []
    previous_kind = None
    for tag in tags:
        prefix, kind = _prefix_and_kind(tag)
        if prefix == "I" and previous_kind != kind:
            tag = f"B-{kind}"
        out.append(tag)
        previous_kind = kind
    return out


def detect_scheme(sentences: Iterable[Sequence[str]]) -> str:
    """'iob1' if some entity starts with I- (no B-/I- of its type before it), else 'iob2'."""
    for tags in sentences:
        previous_kind = None
        for tag in tags:
            prefix, kind = _prefix_and_kind(tag)
            if prefix == "I" and previous_kind != kind:
                return "iob1"
            previous_kind = kind
    return "iob2"


def read_conll(path: PathLike, *, tag_column: int = -1, scheme: str = "auto") -> list[TaggedSentence]:
    """Sentences of a CoNLL file (token ... tag per line, blank line between sentences, -DOCSTART- between
    documents). Tags come back in IOB2; `scheme` is 'iob1', 'iob2' or 'auto' (detected over the file)."""
    if scheme not in ("auto", "iob1", "iob2"):
        raise DataError(f"scheme must be auto, iob1 or iob2, got {scheme!r}")
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    document = 0

    def flush():
        nonlocal words, tags
        if words:
            sentences.append(TaggedSentence(words, tags, document))
        words, tags = [], []

    with open_text(path) as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                flush()
                continue
            parts = line.split()
            if parts[0] == "-DOCSTART-":
                flush()
                document += 1 if sentences or document else 0
                continue
            if len(parts) < 2:
                raise DataError(f"{path}:{line_no}: expected 'token ... tag', got {line!r}")
            words.append(parts[0])
            tags.append(parts[tag_column])
        flush()
    if scheme == "auto":
        scheme = detect_scheme(s.tags for s in sentences)
    if scheme == "iob1":
        for s in sentences:
            s.tags = iob1_to_iob2(s.tags)
    return sentences


def encode_ner(
    tokenizer,
    sentences: list[TaggedSentence],
    labels: list[str],
    max_seq_length: int,
    label_all_subtokens: bool = False,
):
    features = encode_words(tokenizer, [s.words for s in sentences], max_length=max_seq_length, truncate=True)
    index = {label: i for i, label in enumerate(labels)}
    targets, continuation = [], continuation_labels(labels)
    for sentence, feature in zip(sentences, features):
        word_labels = [index[t] for t in sentence.tags]
        targets.append(
            align_labels(
                word_labels, feature.word_ids, label_all_subtokens=label_all_subtokens, continuation=continuation
            )
        )
    return features, targets


def word_predictions(feature, token_logits: np.ndarray, id2label: dict, n_words: int) -> list[str]:
    """The label of each word: the prediction at its first sub-token; words cut off by truncation get O."""
    tags = ["O"] * n_words
    seen = set()
    for token, word in enumerate(feature.word_ids):
        if word is not None and word not in seen:
            seen.add(word)
            tags[word] = id2label[int(token_logits[token].argmax())]
    return tags


def evaluate_ner(
    model, tokenizer, sentences: list[TaggedSentence], *, labels: list[str], max_seq_length: int, batch_size: int = 64
) -> dict:
    from bert.running import run_model

    features = encode_words(tokenizer, [s.words for s in sentences], max_length=max_seq_length, truncate=True)
    outputs = run_model(model, features, batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)
    id2label = dict(enumerate(labels))
    predicted = [word_predictions(f, o[0], id2label, len(s.words)) for f, o, s in zip(features, outputs, sentences)]
    result = conlleval([s.tags for s in sentences], predicted)
    result["sentences"] = len(sentences)
    return result


# ---- conlleval
# A port of the chunk logic of conlleval.pl (CoNLL-2000 shared task): a chunk ends and starts exactly
# where the Perl script says, so IOB1, IOB2 (and IOBES) tags are scored alike, and a stray I- starts a chunk.


def _split(tag: str) -> tuple[str, str]:
    if tag in ("O", "", None):
        return "O", ""
    if "-" in tag:
        prefix, kind = tag.split("-", 1)
        return prefix, kind
    return tag, ""  # conlleval would read a bare tag as its own chunk type with no prefix


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    return (
        (prev_tag == "E")
        or (prev_tag == "S")
        or (prev_tag == "B" and tag in ("B", "S", "O"))
        or (prev_tag == "I" and tag in ("B", "S", "O"))
        or (prev_tag not in ("O", ".") and prev_type != type_)
        or prev_tag == "]"
        or prev_tag == "["
    )


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    return (
        (tag == "B")
        or (tag == "S")
        or (prev_tag == "E" and tag in ("E", "I"))
        or (prev_tag == "S" and tag in ("E", "I"))
        or (prev_tag == "O" and tag in ("E", "I"))
        or (tag not in ("O", ".") and prev_type != type_)
        or tag == "["
        or tag == "]"
    )


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entity chunks (type, first index, last index inclusive) of one tag sequence, conlleval's way."""
    found = []
    prev_tag, prev_type = "O", ""
    start = None
    for i, tag in enumerate(list(tags) + ["O"]):
        t, kind = _split(tag)
        if start is not None and _end_of_chunk(prev_tag, t, prev_type, kind):
            found.append((prev_type, start, i - 1))
            start = None
        if _start_of_chunk(prev_tag, t, prev_type, kind):
            start = i
        prev_tag, prev_type = t, kind
    return found


def conlleval(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """Entity-level precision/recall/F1 (percent, as conlleval prints) overall and per type, plus token accuracy.

    gold, predicted: per sentence the tag of every word (sentences are scored separately, as conlleval
    does with blank lines between them).
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    correct = collections.Counter()
    n_gold = collections.Counter()
    n_pred = collections.Counter()
    tokens = correct_tokens = 0
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags but {len(p)} predicted")
        gold_chunks, pred_chunks = set(chunks(g)), set(chunks(p))
        for kind, _, _ in gold_chunks:
            n_gold[kind] += 1
        for kind, _, _ in pred_chunks:
            n_pred[kind] += 1
        for kind, _, _ in gold_chunks & pred_chunks:
            correct[kind] += 1
        tokens += len(g)
        correct_tokens += sum(a == b for a, b in zip(g, p))

    def prf(c, n_p, n_g):
        precision = 100.0 * c / n_p if n_p else 0.0
        recall = 100.0 * c / n_g if n_g else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1, "support": n_g, "predicted": n_p}

    result = prf(sum(correct.values()), sum(n_pred.values()), sum(n_gold.values()))
    result["accuracy"] = 100.0 * correct_tokens / tokens if tokens else 0.0
    result["per_type"] = {
        kind: prf(correct[kind], n_pred[kind], n_gold[kind]) for kind in sorted(set(n_gold) | set(n_pred))
    }
    return result


TASK = NerTask()
