"""Metrics against hand-computed values, the official SQuAD normalisation, and conlleval's chunk rules (each in its task)."""

from __future__ import annotations

import math

import pytest

from bert.tasks.classify import accuracy, classification_metrics, f1_binary, matthews_corrcoef, pearson, spearman
from bert.tasks.ner import chunks, conlleval
from bert.tasks.qa import normalize_answer, squad_exact, squad_f1, squad_metrics


def test_classification_by_hand():
    predictions, labels = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]
    # tp=2 fp=1 fn=1 tn=2
    assert accuracy(predictions, labels) == pytest.approx(4 / 6)
    assert f1_binary(predictions, labels) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert matthews_corrcoef(predictions, labels) == pytest.approx((2 * 2 - 1 * 1) / math.sqrt(3 * 3 * 3 * 3))
    assert matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # undefined -> 0, as sklearn
    assert classification_metrics([0, 1], [0, 1])["f1"] == 1.0


def test_pearson_spearman_by_hand():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    # ties take average ranks: x ranks [1, 2.5, 2.5, 4], y ranks [1, 2, 3, 4]
    xr, yr = [1, 2.5, 2.5, 4], [1, 2, 3, 4]
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(pearson(xr, yr))


def test_squad_normalisation_official_examples():
    assert normalize_answer("The Quick, Brown Fox!") == "quick brown fox"
    assert normalize_answer("  an   apple  a day ") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # "the" only as a word
    assert squad_exact("the Denver Broncos", "Denver Broncos") == 1.0
    assert squad_f1("Denver Broncos won", "Denver Broncos") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert squad_f1("nothing", "Denver Broncos") == 0.0


def test_squad_metrics_max_over_gold_and_no_answer():
    gold = {"a": ["Denver Broncos", "Broncos"], "b": ["Santa Clara, California"], "c": []}
    predictions = {"a": "broncos", "b": "Santa Clara", "c": ""}
    m = squad_metrics(predictions, gold)
    f1_b = 2 * 1.0 * (2 / 3) / (1.0 + 2 / 3)
    assert m["exact_match"] == pytest.approx(100 * 2 / 3)
    assert m["f1"] == pytest.approx(100 * (1 + f1_b + 1) / 3)


def test_conlleval_chunks_iob1_iob2_and_stray_i():
    assert chunks(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert chunks(["I-PER", "I-PER", "B-PER", "I-LOC"]) == [("PER", 0, 1), ("PER", 2, 2), ("LOC", 3, 3)]  # IOB1
    assert chunks(["O", "I-ORG", "I-ORG"]) == [("ORG", 1, 2)]  # a stray I- starts a chunk
    assert chunks(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]  # a type change ends one


def test_conlleval_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-MISC", "I-MISC"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "B-MISC", "O"]]
    r = conlleval(gold, pred)
    # gold chunks 4 (PER, LOC, ORG, MISC); predicted 4 (PER, ORG, ORG, MISC[2:2]); correct 2 (PER, first ORG)
    assert r["precision"] == pytest.approx(50.0) and r["recall"] == pytest.approx(50.0)
    assert r["f1"] == pytest.approx(50.0)
    assert r["accuracy"] == pytest.approx(100 * 6 / 8)
    assert r["per_type"]["ORG"]["precision"] == pytest.approx(50.0)
    assert r["per_type"]["ORG"]["recall"] == pytest.approx(100.0)
    assert r["per_type"]["LOC"]["recall"] == 0.0 and r["per_type"]["MISC"]["f1"] == 0.0
    # an I- continuing a differently-typed chunk, scored like conlleval (IOB1 input, same boundaries)
    assert conlleval([["I-PER", "I-PER"]], [["B-PER", "I-PER"]])["f1"] == pytest.approx(100.0)
