"""Sequence (and sequence-pair) classification: [CLS] a [SEP] (b [SEP]) in, ranked labels out."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional, Union

import numpy as np

from bert.options import flag
from bert.tasks.base import (
    MODEL,
    TRUNCATE,
    Head,
    JobColumns,
    Labels,
    Param,
    Route,
    Task,
    TaskOption,
    TextPair,
    check_inputs,
    column_of,
    one_or_list,
    texts_of,
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
    sigmoid,
    softmax,
)
from bert.tokenizer import InputTooLong

FUNCTIONS = ("softmax", "sigmoid", "none")


@dataclass
class Label:
    """One of a text's labels and its score."""

    label: str
    score: float


def _split_input(item) -> tuple[str, str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(s, str) for s in item):
        return item[0], item[1]
    raise TypeError(f"expected a text or a [text, text_pair], got {item!r}")


def _encode_rows(tokenizer, texts, pairs, rows, **truncation) -> dict:
    """Encode the given rows; tokenizers wants a batch of all singles or all pairs, so split by kind."""
    if pairs.count(None) == len(pairs):  # texts alone, the usual request: one call, no sorting by kind
        return dict(zip(rows, tokenizer.encode_batch([texts[i] for i in rows], None, **truncation)))
    encoded = {}
    for is_pair in (False, True):
        kind_rows = [i for i in rows if (pairs[i] is not None) == is_pair]
        if kind_rows:
            kind_pairs = [pairs[i] for i in kind_rows] if is_pair else None
            batch = tokenizer.encode_batch([texts[i] for i in kind_rows], kind_pairs, **truncation)
            encoded.update(zip(kind_rows, batch))
    return encoded


def encode(
    tokenizer, inputs: Sequence[str | tuple[str, str] | list[str]], *, max_length: int = 512, truncate: bool = False
) -> list[Features]:
    """Texts or text pairs -> Features. Too long: InputTooLong, or with `truncate` cut longest-first."""
    texts, pairs, cut = [], [], []
    for item in inputs:
        text, pair = _split_input(item)
        text, cut_text = bounded_text(tokenizer, text, max_length)
        if pair is not None:
            pair, cut_pair = bounded_text(tokenizer, pair, max_length)
            cut_text = cut_text or cut_pair
        texts.append(text)
        pairs.append(pair)
        cut.append(cut_text)
    if any(cut) and not truncate:
        raise InputTooLong(cut.index(True), None, max_length)
    # Single plain texts, the usual request: their ids without the encodings' offsets and tokens (the same ids)
    plain = (
        tokenizer.encode_ids(texts) if pairs.count(None) == len(pairs) and hasattr(tokenizer, "encode_ids") else None
    )
    if plain is None:
        # .ids and .type_ids are new lists on every access: no copy needed
        plain = [
            (e.ids, e.type_ids) for _, e in sorted(_encode_rows(tokenizer, texts, pairs, range(len(texts))).items())
        ]
    too_long = [i for i, (ids, _) in enumerate(plain) if len(ids) > max_length]
    if too_long and not truncate:
        check_length(too_long[0], len(plain[too_long[0]][0]), max_length)
    if too_long:
        cut_rows = _encode_rows(tokenizer, texts, pairs, too_long, max_length=max_length, truncation="longest_first")
        for i, e in cut_rows.items():
            plain[i] = (e.ids, e.type_ids)
    return [Features(input_ids=ids, token_type_ids=types) for ids, types in plain]


def _label(id2label: dict, index: int) -> str:
    # Configs read from JSON have string keys ("0"), in-memory ones int keys.
    return id2label[index] if index in id2label else id2label[str(index)]


def choose_function(num_labels: int, problem_type: str | None = None) -> str:
    """The score function transformers' text-classification pipeline applies by default."""
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def decode(
    logits: np.ndarray,
    id2label: dict[int, str],
    *,
    top_k: int | None = 1,
    function: str | None = None,
    problem_type: str | None = None,
) -> list[list[dict]]:
    """Logits (B, num_labels) -> per row [{"label", "score"}] by descending score; top_k None = all labels."""
    logits = np.asarray(logits)
    if logits.ndim == 1:
        logits = logits[None, :]
    if logits.dtype != np.float64:  # the pipeline scores in float32 (fp16/bf16 logits are upcast)
        logits = logits.astype(np.float32, copy=False)  # nothing below writes to it
    function = function or choose_function(logits.shape[-1], problem_type)
    if function == "softmax":
        scores = softmax(logits, axis=-1)
    elif function == "sigmoid":
        scores = sigmoid(logits)
    elif function == "none":
        scores = logits
    else:
        raise ValueError(f"function must be one of {FUNCTIONS}, got {function!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    labels = [_label(id2label, i) for i in range(scores.shape[-1])] if len(scores) else []
    results = []
    # tolist() gives the rows' Python floats in one call (float(s) per numpy scalar costs more than the softmax)
    for row in scores.tolist():
        ranked = [{"label": label, "score": s} for label, s in zip(labels, row)]
        ranked.sort(key=lambda r: r["score"], reverse=True)  # stable: ties keep label order, as in transformers
        results.append(ranked if top_k is None else ranked[:top_k])
    return results


# ---- serving ------------------------------------------------------------------------------------
def encode_request(tokenizer, items: list, limits: Limits, *, truncate: bool = False, **_) -> list[list[Features]]:
    """Texts or [text, text_pair] pairs -> one Features each."""
    pairs = [tuple(x) if isinstance(x, list) else x for x in items]
    return [[f] for f in encode(tokenizer, pairs, max_length=limits.max_length, truncate=truncate)]


def decode_request(
    items: list,
    features: list,
    outputs: list,
    facts: ModelFacts,
    *,
    top_k: int | None = 1,
    function_to_apply: str | None = None,
    **_,
) -> list[list[dict]]:
    rows = [sequences[0]["classify"] for sequences in outputs]
    # np.array, not np.stack: the same (B, L) array from equal rows at a fraction of the per-call cost (np.stack
    # kept for no rows, which it refuses)
    logits = np.array(rows) if rows else np.stack(rows)
    return decode(logits, facts.labels, top_k=top_k, function=function_to_apply, problem_type=facts.problem_type)


def margins(outputs: list, facts: ModelFacts) -> list[float]:
    """Per text, how sure its label is, in the probabilities the model was trained for (whatever a request's
    function_to_apply shows): one label chosen among several (softmax), the best label's less the second's; labels
    each yes or no (multi-label, or one label: sigmoid), the smallest lead of a label's more likely outcome over the
    other, |2p - 1|; a regression, nothing to be unsure of (inf). A slightly perturbed model (int8) changes a label
    only where this is small; the engine recomputes those texts on an exact model (--classify-verify-model)."""
    if not outputs:
        return []
    logits = np.array([sequences[0]["classify"] for sequences in outputs], dtype=np.float32)
    function = choose_function(logits.shape[-1], facts.problem_type)
    if function == "none":
        return [math.inf] * len(outputs)
    if function == "sigmoid":
        return decision_leads(sigmoid(logits), independent=True).tolist()
    return decision_leads(softmax(logits, axis=-1)).tolist()


# The TSV columns a reader takes (classify's and rerank's): their training options, declared once.
TSV_OPTIONS = (
    TaskOption("text_column", "0", "TSV column (index or header name) of the text", multitask=False),
    TaskOption("pair_column", "", "TSV column of the second text of a pair (empty = single texts)", multitask=False),
    TaskOption("label_column", "-1", "TSV column of the label", multitask=False),
    TaskOption("header", "auto", "auto | yes | no: whether the TSV's first row names its columns", multitask=False),
)


class ClassifyTask(Task):
    """Sequence (or pair) classification: transformers' text-classification pipeline."""

    name = "classify"
    order = 10
    head = Head("sequence", attribute="classifier", single_attribute="classifier")
    architectures = ("BertForSequenceClassification",)
    labelled = True
    graph_outputs = {"classify_logits": "classify"}
    single_graph_outputs = {"logits": "classify"}
    routes = (
        Route(
            "/classify",
            "ClassifyRequest",
            # a text: its labels; a list of texts: one list of labels per text
            Union[list[Label], list[list[Label]]],
            "Classify texts or text pairs",
            to_items=texts_of,
            shape=one_or_list,
            check=check_inputs,
            fields=(
                MODEL,
                Param(
                    "inputs",
                    Union[str, list[Union[str, TextPair]]],
                    help="a text, a list of texts, or a list of [text, text_pair]",
                    examples=("I loved this film.", ["great plot", ["A man is eating.", "Someone eats."]]),
                ),
                Param("top_k", Optional[int], 1, "labels per input, best first; null for all labels", minimum=1),
                Param(
                    "function_to_apply",
                    Optional[Literal[FUNCTIONS]],
                    None,
                    "score function (default: the model's, as in transformers' pipeline)",
                ),
                TRUNCATE,
            ),
            doc="`inputs` a string: a list of {label, score}, best first. A list: one such list per input.",
        ),
    )
    job = JobColumns(
        inputs=("text",),
        arity=(1, 2),
        results=(("label", "string"), ("score", "float32")),
        values=lambda answers: {
            "label": column_of(answers, lambda a: a[0]["label"]),
            "score": column_of(answers, lambda a: a[0]["score"]),
        },
        options=lambda o: {"truncate": o["truncate"], "top_k": 1},
    )
    trainable = True
    main_metric = "accuracy"

    def encode_request(self, tokenizer, items, limits, **options):
        return encode_request(tokenizer, items, limits, **options)

    def decode_request(self, items, features, outputs, facts, **options):
        return decode_request(items, features, outputs, facts, **options)

    def margins(self, items, features, outputs, facts, **_):
        return margins(outputs, facts)

    def decisions(self, items, answers):
        return [labels[0]["label"] for labels in answers]  # the best label (the answers hold the top 1)

    verify_margin = TaskOption(
        "verify_margin",
        0.2,
        "recompute a text whose best label's probability leads the second's by less than this (a multi-label "
        "model: a label within half of it of 0.5; 0-1)",
        minimum=0,
        maximum=1,
    )

    def score(self, metrics: dict) -> float:
        return 100.0 * float(metrics["accuracy"])  # a fraction in the task's metrics

    # ---- training hooks: TSV rows (TextExample) -----------------------------------
    train_options = (
        *TSV_OPTIONS,
        # evaluate reads these from the checkpoint (its --labels: the data's values in head order)
        TaskOption("labels", [], "label values as written in the data (default: sorted unique)", evaluate=False),
        TaskOption("label_names", [], "names the checkpoint shows for them (default: the values)", evaluate=False),
        TaskOption(
            "regression",
            False,
            "one output, MSE loss, Pearson/Spearman (e.g. STS-B)",
            multitask=False,
            evaluate=False,
        ),
    )
    multitask_options = ("labels", "label_names")
    train_data_help = "TSV (text, label)"

    def train_problems(self, cfg) -> list[str]:
        problems = super().train_problems(cfg)
        if cfg.regression and cfg.labels:
            problems.append(f"--regression and {flag(cfg, 'labels')} contradict each other (regression has no classes)")
        if cfg.label_names and len(cfg.label_names) != len(cfg.labels):
            problems.append(f"{flag(cfg, 'label_names')} needs {flag(cfg, 'labels')}, one name per label value")
        if cfg.header not in ("auto", "yes", "no"):
            problems.append(f"--header must be auto, yes or no, got {cfg.header!r}")
        return problems

    def read_examples(self, cfg, *, train: bool = True) -> tuple[list, list]:
        columns = dict(
            text_column=cfg.text_column,
            pair_column=cfg.pair_column or None,
            label_column=cfg.label_column,
            header={"auto": None, "yes": True, "no": False}[cfg.header],
        )
        return (read_tsv(cfg.train_data, **columns) if train else []), read_tsv(cfg.eval_data, **columns)

    def train_labels(self, cfg, train: list, evaluation: list) -> Labels:
        if cfg.regression:
            return Labels(None, ["score"], "regression")
        values = cfg.labels or sorted({e.label for e in train})
        return Labels(values, cfg.label_names or values)

    def saved_labels(self, cfg, model_config, saved: dict) -> Labels:
        if model_config.problem_type == "regression":
            return Labels(None, None, "regression")
        id2label = model_config.id2label or {}
        values = cfg.labels or saved.get("labels") or [id2label[i] for i in sorted(id2label)]
        return Labels(values, values)

    def encode_train(self, tokenizer, examples: list, labels: Labels, cfg) -> tuple[list, list]:
        return encode_classify(tokenizer, examples, cfg.max_seq_length), classify_targets(examples, labels.values)

    def collate_targets(self, targets: list, width: int) -> dict:
        import torch

        regression = isinstance(targets[0], float)
        return {"labels": torch.tensor(targets, dtype=torch.float32 if regression else torch.long)}

    def loss(self, outputs: dict, batch: dict):
        import torch.nn.functional as F

        logits, labels = outputs[self.output_name("classify")].float(), batch["labels"]
        if labels.is_floating_point():  # regression: one output
            return F.mse_loss(logits.squeeze(-1), labels.view(-1))
        return F.cross_entropy(logits, labels.view(-1))

    def evaluate(self, model, tokenizer, examples: list, labels: Labels, cfg) -> dict:
        return evaluate_classify(
            model,
            tokenizer,
            examples,
            labels=labels.values,
            max_seq_length=cfg.max_seq_length,
            batch_size=cfg.eval_batch_size,
        )

    def best_metric(self, labels: Labels) -> str:
        return "pearson" if labels.problem_type == "regression" else self.main_metric

    def summary(self, metrics: dict) -> str:
        return f"classify accuracy {self.score(metrics):.2f} %"

    def embed_texts(self, examples: list) -> dict[str, list[str]]:
        return {self.name: [e.text for e in examples]}


# ---- training: GLUE-style TSV rows, their targets, evaluation and its metrics -----------------------------
@dataclass
class TextExample:
    text: str
    pair: str | None
    label: str | None  # as written in the file (class name, integer, or a float for regression)


def _column(header: list[str] | None, spec: str | int | None) -> int | None:
    """A column given by index (int or digit string) or by header name."""
    if spec is None:
        return None
    if isinstance(spec, int) or str(spec).lstrip("-").isdigit():
        return int(spec)
    if header is None:
        raise DataError(f"column {spec!r} is named but the file has no header row")
    if spec not in header:
        raise DataError(f"no column {spec!r} in header {header}")
    return header.index(spec)


def _looks_like_header(row: list[str], label_index: int | None) -> bool:
    """GLUE headers name their columns; data rows have a label that is a number or a short class name.
    A row whose label cell is a known header word (label, gold_label, score, ...) is a header."""
    if label_index is None or label_index >= len(row) or label_index < -len(row):
        return False
    cell = row[label_index].strip().lower()
    return cell in {"label", "labels", "gold_label", "score", "class", "target", "sentiment", "quality"}


def tsv_line(path: str, rows: int, index: int) -> str:
    """`path:LINE` of the index-th of the `rows` rows read_tsv returned (it skips blank lines and a header row), or
    `path: row N` when the file does not read back that way: for a message about one row."""
    try:
        with open_text(path) as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            lines = [n for n, cells in enumerate(reader, 1) if cells]
    except (OSError, ValueError, csv.Error):
        lines = []
    skipped = len(lines) - rows  # 1: a header row
    if 0 <= skipped <= 1 and index + skipped < len(lines):
        return f"{path}:{lines[index + skipped]}"
    return f"{path}: row {index + 1}"


def read_tsv(
    path: PathLike,
    *,
    text_column: str | int = 0,
    pair_column: str | int | None = None,
    label_column: str | int | None = -1,
    header: bool | None = None,
    delimiter: str = "\t",
) -> list[TextExample]:
    """Rows of a GLUE-style TSV. Columns by index or header name; `header=None` detects it.

    BOM and CRLF are tolerated; quoting is off (GLUE files contain bare quotes).
    """
    with open_text(path) as f:
        rows = [row for row in csv.reader(f, delimiter=delimiter, quoting=csv.QUOTE_NONE) if row]
    if not rows:
        return []
    first = rows[0]
    names = [c.strip() for c in first]
    named = any(
        isinstance(c, str) and not str(c).lstrip("-").isdigit()
        for c in (text_column, pair_column, label_column)
        if c is not None
    )
    if header is None:
        label_guess = (
            names.index(label_column)
            if isinstance(label_column, str) and label_column in names
            else (int(label_column) if label_column is not None and str(label_column).lstrip("-").isdigit() else None)
        )
        header = named or _looks_like_header(first, label_guess)
    head = names if header else None
    body = rows[1:] if header else rows
    t, p, lab = _column(head, text_column), _column(head, pair_column), _column(head, label_column)
    examples = []
    for line_no, row in enumerate(body, 2 if header else 1):
        try:
            examples.append(
                TextExample(
                    text=row[t].strip(),
                    pair=row[p].strip() if p is not None else None,
                    label=row[lab].strip() if lab is not None else None,
                )
            )
        except IndexError:
            raise DataError(f"{path}:{line_no}: row has {len(row)} columns, fewer than the columns asked for") from None
    return examples


def label_index(labels: list[str], value: str | None) -> int:
    """A label as written in the data -> its index among `labels` (or the integer itself if in range)."""
    if value in labels:
        return labels.index(value)
    if value is not None and value.lstrip("-").isdigit() and 0 <= int(value) < len(labels):
        return int(value)
    raise ValueError(f"label {value!r} is not one of {labels}")


def encode_classify(tokenizer, examples: list[TextExample], max_seq_length: int) -> list[Features]:
    inputs = [e.text if e.pair is None else (e.text, e.pair) for e in examples]
    return encode(tokenizer, inputs, max_length=max_seq_length, truncate=True)


def classify_targets(examples: list[TextExample], labels: list[str] | None) -> list:
    if labels is None:  # regression
        return [float(e.label) for e in examples]
    return [label_index(labels, e.label) for e in examples]


def evaluate_classify(
    model,
    tokenizer,
    examples: list[TextExample],
    *,
    labels: list[str] | None,
    max_seq_length: int,
    batch_size: int = 64,
) -> dict:
    from bert.running import run_model

    features = encode_classify(tokenizer, examples, max_seq_length)
    logits = np.stack(
        [r[0] for r in run_model(model, features, batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)]
    )
    targets = classify_targets(examples, labels)
    if labels is None:
        metrics = regression_metrics(logits[:, 0], targets)
    else:
        metrics = classification_metrics(logits.argmax(-1).tolist(), targets)
    metrics["examples"] = len(examples)
    return metrics


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    if not len(labels):
        return 0.0
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def f1_binary(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    p, y = np.asarray(predictions), np.asarray(labels)
    tp = int(np.sum((p == positive) & (y == positive)))
    fp = int(np.sum((p == positive) & (y != positive)))
    fn = int(np.sum((p != positive) & (y == positive)))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def f1_macro(predictions: Sequence[int], labels: Sequence[int]) -> float:
    classes = sorted(set(labels) | set(predictions))
    return float(np.mean([f1_binary(predictions, labels, c) for c in classes])) if classes else 0.0


def matthews_corrcoef(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K), equal to the binary MCC for two classes; 0 if undefined."""
    p, y = np.asarray(predictions), np.asarray(labels)
    classes = sorted(set(p.tolist()) | set(y.tolist()))
    index = {c: i for i, c in enumerate(classes)}
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    for a, b in zip(y, p):
        confusion[index[a], index[b]] += 1
    t = confusion.sum(axis=1)  # true counts per class
    q = confusion.sum(axis=0)  # predicted counts per class
    c = np.trace(confusion)
    s = confusion.sum()
    numerator = c * s - t @ q
    denominator = math.sqrt((s * s - q @ q) * (s * s - t @ t))
    return float(numerator / denominator) if denominator else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    xm, ym = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(xm @ xm) * float(ym @ ym))
    return float(xm @ ym / denominator) if denominator else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties sharing the mean of their positions, as scipy.stats.rankdata."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return pearson(_ranks(np.asarray(x, dtype=np.float64)), _ranks(np.asarray(y, dtype=np.float64)))


def classification_metrics(predictions: Sequence[int], labels: Sequence[int]) -> dict:
    metrics = {
        "accuracy": accuracy(predictions, labels),
        "matthews": matthews_corrcoef(predictions, labels),
        "f1_macro": f1_macro(predictions, labels),
    }
    if set(labels) <= {0, 1} and set(predictions) <= {0, 1}:
        metrics["f1"] = f1_binary(predictions, labels)
    return metrics


def regression_metrics(predictions: Sequence[float], labels: Sequence[float]) -> dict:
    p, y = np.asarray(predictions, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    return {"pearson": pearson(p, y), "spearman": spearman(p, y), "mse": float(np.mean((p - y) ** 2))}


TASK = ClassifyTask()
