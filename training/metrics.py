"""Evaluation metrics: classification/regression, CoNLL entity F1 (conlleval semantics), SQuAD EM/F1.

Pure Python + numpy, so they can be checked against hand-computed values.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Sequence

import numpy as np

# ----------------------------------------------------------------------------- classification


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


# ----------------------------------------------------------------------------- conlleval
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


# ----------------------------------------------------------------------------- SQuAD (official v1.1 script)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official evaluate-v1.1.py)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_f1(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_exact(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def squad_metrics(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict:
    """EM and F1 in percent, each the max over the gold answers; an unanswerable question (no gold
    answers, SQuAD 2.0) counts as right only for an empty prediction."""
    exact = f1 = 0.0
    for qid, answers in gold.items():
        prediction = predictions.get(qid, "")
        if not answers:
            score = float(prediction == "")
            exact += score
            f1 += score
            continue
        exact += max(squad_exact(prediction, a) for a in answers)
        f1 += max(squad_f1(prediction, a) for a in answers)
    n = len(gold)
    return {"exact_match": 100.0 * exact / n if n else 0.0, "f1": 100.0 * f1 / n if n else 0.0, "total": n}
