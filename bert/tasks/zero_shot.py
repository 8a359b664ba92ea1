"""Zero-shot classification: an NLI model scores each candidate label, chosen per request, as a hypothesis.

transformers' zero-shot-classification pipeline, answer for answer: each (text, hypothesis_template.format(label))
pair is one model input of the server's shared batch, [CLS] text [SEP] hypothesis [SEP], scored by a sequence-pair
classifier trained on NLI (any BertForSequenceClassification whose id2label has a label starting with "entail").
With one label, or `multi_label`, each label's score is the softmax of its [contradiction, entailment] logits
(contradiction: the first label, or the last when entailment is the first, as the pipeline takes it); otherwise
the entailment logits are softmaxed over the labels. Labels come back best first.

The head is the classifier's own: a model that serves classify serves zero-shot from the same forward pass.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Union

import numpy as np

from bert.tasks.base import (
    MODEL,
    EmptyInput,
    Head,
    JobColumns,
    Param,
    Route,
    Task,
    TaskOption,
    check_inputs,
    check_texts,
    column_of,
    described,
    one_or_list,
    text_chars,
    texts_param,
)
from bert.tasks.common import Features, Limits, ModelFacts, TooMuchWork, bounded_text, decision_leads, softmax
from bert.tokenizer import InputTooLong

DEFAULT_TEMPLATE = "This example is {}."


@dataclass
class ZeroShotResult:
    """A text's candidate labels, best first, with their scores."""

    sequence: str = described("the text as sent")
    labels: list[str] = described("the candidate labels, best first")
    scores: list[float] = described("each label's score, in the order of `labels`")


def parse_labels(candidate_labels) -> list[str]:
    """A list of labels as given, or one string of comma-separated labels (stripped, blanks dropped), as the
    pipeline reads them."""
    if isinstance(candidate_labels, str):
        return [label.strip() for label in candidate_labels.split(",") if label.strip()]
    return list(candidate_labels)


def entailment_index(id2label: dict) -> int | None:
    """The output whose label starts with "entail" (any case), the pipeline's rule; None when there is none."""
    for index in sorted(id2label, key=int):
        if str(id2label[index]).lower().startswith("entail"):
            return int(index)
    return None


def check_template(template: str) -> None:
    """The template must hold the label as "{}" (or "{0}"), and nothing else in braces: a format spec such as
    "{:>999999999}" or a field such as "{0.__class__}" is no part of a sentence, and would cost or show what a
    request should not reach."""
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
        template.format("label")  # "{} {}" (two labels wanted) or "{} {0}" (mixed numbering) fail here
    except (ValueError, IndexError, KeyError):
        fields = []
    if not fields or any(f not in ("", "0") or spec or conv is not None for f, spec, conv in fields):
        raise ValueError(
            f'hypothesis_template {template!r} must hold "{{}}" where the label goes (and no other {{...}} field; '
            "write {{ and }} for a brace)"
        )


def check_labels(labels: list[str], field: str = "candidate_labels[{}]") -> None:
    """The candidate labels as /zero-shot and python -m batch take them. A blank or invisible label ("\u200b",
    NUL: the tokenizer drops it, so the model would weigh "This example is ." and answer for a label it never
    read) is EmptyInput; a lone surrogate, or a label given twice, ValueError. `field` names a label ("{}": its
    index)."""
    if not labels:
        raise EmptyInput("candidate_labels is empty")
    check_texts(labels, field)
    seen = set()
    for label in labels:
        if label in seen:
            raise ValueError(f"candidate_labels: {label!r} is given twice (each label is one answer)")
        seen.add(label)


def _check(body, info=None) -> None:
    check_inputs(body)
    check_labels(parse_labels(body.candidate_labels))
    check_template(body.hypothesis_template)
    try:
        body.hypothesis_template.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"hypothesis_template is not valid Unicode: a lone surrogate at character {e.start} (send a whole "
            "surrogate pair, or the character itself)"
        ) from None


def _items(body) -> tuple[list, dict]:
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    return texts, {
        "candidate_labels": parse_labels(body.candidate_labels),
        "hypothesis_template": body.hypothesis_template,
        "multi_label": body.multi_label,
        "truncate": body.truncate,
    }


def encode(
    tokenizer, texts: list[str], hypotheses: list[str], *, max_length: int, truncate: bool = False
) -> list[list[Features]]:
    """Per text, one (text, hypothesis) Features per hypothesis. Too long: InputTooLong naming the text, or with
    `truncate` the text is cut (only the text: the pipeline's only_first), never the hypothesis."""
    before, between, after, _ = tokenizer.pair_template
    room = max_length - len(before) - len(between) - len(after) - 1  # hypothesis tokens that leave one for the text
    backend = getattr(tokenizer, "backend", tokenizer)
    for index, hypothesis in enumerate(hypotheses):
        bounded, cut = bounded_text(tokenizer, hypothesis, room)
        if cut or len(backend.encode_batch([bounded], add_special_tokens=False)[0].ids) > room:
            raise ValueError(
                f"candidate_labels[{index}]: its hypothesis {bounded[:80]!r} leaves no room for the text in the "
                f"model's {max_length} tokens"
            )
    bounded = [bounded_text(tokenizer, text, max_length) for text in texts]
    if not truncate and any(cut for _, cut in bounded):
        raise InputTooLong(next(i for i, (_, cut) in enumerate(bounded) if cut), None, max_length)
    firsts = [text for text, _ in bounded for _ in hypotheses]
    seconds = [h for _ in bounded for h in hypotheses]
    encoded = tokenizer.encode_batch(firsts, seconds)
    too_long = [row for row, e in enumerate(encoded) if len(e.ids) > max_length]
    if too_long and not truncate:
        raise InputTooLong(too_long[0] // len(hypotheses), len(encoded[too_long[0]].ids), max_length)
    if too_long:
        cut = tokenizer.encode_batch(
            [firsts[r] for r in too_long],
            [seconds[r] for r in too_long],
            max_length=max_length,
            truncation="only_first",
        )
        for row, e in zip(too_long, cut):
            encoded[row] = e
    features = [Features(input_ids=list(e.ids), token_type_ids=list(e.type_ids)) for e in encoded]
    n = len(hypotheses)
    return [features[i * n : (i + 1) * n] for i in range(len(texts))]


def scores(logits: np.ndarray, entailment: int, *, multi_label: bool) -> np.ndarray:
    """(labels, outputs) logits of one text -> one score per label, as the pipeline computes them (in float32)."""
    logits = np.asarray(logits, dtype=np.float32)
    if multi_label or len(logits) == 1:
        contradiction = -1 if entailment == 0 else 0
        return softmax(logits[:, [contradiction, entailment]], axis=-1)[:, 1]
    return softmax(logits[:, entailment], axis=-1)


def answer(text: str, labels: list[str], values: np.ndarray) -> dict:
    order = list(reversed(values.argsort()))  # the pipeline's order, ties included
    return {"sequence": text, "labels": [labels[i] for i in order], "scores": [float(values[i]) for i in order]}


class ZeroShotTask(Task):
    """transformers' zero-shot-classification pipeline over an NLI sequence-pair classifier."""

    name = "zero_shot"
    order = 70
    head = Head("sequence", attribute="zero_shot_classifier", single_attribute="classifier")
    architectures = ("BertForSequenceClassification",)
    labelled = True
    graph_outputs = {"zero_shot_logits": "zero_shot"}
    single_graph_outputs = {"logits": "zero_shot"}
    routes = (
        Route(
            "/zero-shot",
            "ZeroShotRequest",
            Union[ZeroShotResult, list[ZeroShotResult]],  # a text: its result; a list of texts: one per text
            "Classify texts into labels chosen per request (an NLI model's entailment)",
            to_items=_items,
            shape=one_or_list,
            check=_check,
            fields=(
                MODEL,
                texts_param("One day I will see the world."),
                Param(
                    "candidate_labels",
                    Union[str, list[str]],
                    help="the labels to choose from: a list, or one string of comma-separated labels; inputs x labels "
                    "is at most max_request_sequences (413 beyond)",
                    examples=(["travel", "cooking", "dancing"],),
                    job=True,
                    job_kind=list[str],
                    job_default=[],
                    job_help="the labels each row is weighed against",
                ),
                Param(
                    "hypothesis_template",
                    str,
                    DEFAULT_TEMPLATE,
                    'the hypothesis each label is put into, at its "{}"',
                    job=True,
                ),
                Param(
                    "multi_label",
                    bool,
                    False,
                    "score each label on its own (entailment vs contradiction) instead of across the labels",
                    job=True,
                ),
                Param(
                    "truncate",
                    bool,
                    False,
                    "cut texts too long for the model beside a hypothesis instead of refusing them (never the "
                    "hypothesis)",
                ),
            ),
            doc="Each candidate label becomes a hypothesis (`hypothesis_template` with the label in its {}) that the "
            "NLI model weighs against the text, one model input per (text, label): {sequence, labels, scores} with "
            "the labels best first, as transformers' zero-shot-classification pipeline answers; a list of them for a "
            "list of texts. Scores sum to 1 over the labels, or with `multi_label` each is entailment against "
            "contradiction.",
        ),
    )
    job = JobColumns(
        inputs=("text",),
        arity=(1,),
        results=(("labels", ("list", "string")), ("scores", ("list", "float32"))),
        values=lambda answers: {
            "labels": column_of(answers, lambda a: a["labels"]),
            "scores": column_of(answers, lambda a: a["scores"]),
        },
    )
    calibration = "hypotheses"

    def job_problems(self, options: dict) -> list[str]:
        labels = options["candidate_labels"]
        labels = labels.split(",") if isinstance(labels, str) else labels
        options["candidate_labels"] = labels = [v.strip() for v in labels if v.strip()]  # "sports, food": no " food"
        if not labels:
            return ["--candidate-labels is required for zero_shot"]
        try:  # as /zero-shot checks them: a label of only invisible characters is one the model never reads
            check_labels(labels, "--candidate-labels: label {}")
        except ValueError as e:
            return [str(e)]
        try:
            check_template(options["hypothesis_template"])
        except ValueError as e:
            return [f"--hypothesis-template: {e}"]
        return []

    def serves(self, config: dict) -> bool:
        return not self.unserved_reason(config)

    def unserved_reason(self, config: dict) -> str:
        id2label = config.get("id2label") or {}
        if len(id2label) < 2 or entailment_index(id2label) is None:
            names = ", ".join(str(id2label[k]) for k in sorted(id2label, key=int)) or "none"
            return (
                f'zero-shot needs an NLI model: its config.json id2label must have a label starting with "entail" '
                f"and one to weigh it against (it has {names})"
            )
        return ""

    def request_chars(self, items: list, options: dict) -> int:
        labels = options.get("candidate_labels") or ()
        template = len(options.get("hypothesis_template") or "")
        return text_chars(items) * len(labels) + len(items) * sum(template + len(label) for label in labels)

    def encode_request(
        self,
        tokenizer,
        items: list,
        limits: Limits,
        *,
        candidate_labels: list[str],
        hypothesis_template: str = DEFAULT_TEMPLATE,
        truncate: bool = False,
        **_,
    ) -> list[list[Features]]:
        needed = len(items) * len(candidate_labels)
        if needed > limits.max_sequences:
            raise TooMuchWork(
                f"{len(items)} inputs x {len(candidate_labels)} candidate_labels need {needed} model inputs; the "
                f"limit is {limits.max_sequences} (max_request_sequences): send fewer labels or inputs per request"
            )
        hypotheses = [hypothesis_template.format(label) for label in candidate_labels]
        return encode(tokenizer, items, hypotheses, max_length=limits.max_length, truncate=truncate)

    def decode_request(
        self, items, features, outputs, facts: ModelFacts, *, candidate_labels: list[str], multi_label=False, **_
    ) -> list[dict]:
        entailment = entailment_index(facts.labels)
        if entailment is None:  # a checkpoint that names this task (config "task") without an NLI head's labels
            raise RuntimeError(self.unserved_reason({"id2label": facts.labels}))
        return [
            answer(
                text,
                candidate_labels,
                scores(np.stack([o["zero_shot"] for o in sequences]), entailment, multi_label=multi_label),
            )
            for text, sequences in zip(items, outputs)
        ]

    def margins(self, items, features, outputs, facts: ModelFacts, *, multi_label=False, **_) -> list[float]:
        """Per text, how sure its labels are, in the scores it answers: one label chosen among the candidates, the best
        one's lead over the second; each candidate yes or no (multi_label, or one candidate), the smallest lead of a
        candidate's more likely outcome over the other, |2s - 1|. A slightly perturbed model (int8) changes the order
        at the top, or a candidate's side of 0.5, only where this is small (--zero-shot-verify-model)."""
        entailment = entailment_index(facts.labels)
        if entailment is None:
            raise RuntimeError(self.unserved_reason({"id2label": facts.labels}))
        found = []
        for sequences in outputs:
            logits = np.stack([o["zero_shot"] for o in sequences])
            values = scores(logits, entailment, multi_label=multi_label)
            found.append(float(decision_leads(values, independent=multi_label or len(values) == 1)))
        return found

    verify_margin = TaskOption(
        "verify_margin",
        0.1,
        "recompute a text whose best candidate label's score leads the second's by less than this (multi_label: a "
        "candidate within half of it of 0.5; 0-1)",
        minimum=0,
        maximum=1,
    )


TASK = ZeroShotTask()
