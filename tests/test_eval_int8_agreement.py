"""evals/int8_agreement.py's near-tie figures: where a candidate graph decided otherwise than fp32, how close fp32
itself was to deciding otherwise (a changed top text at a margin of 0.015 logits is a tie any perturbation tips)."""

from __future__ import annotations

import numpy as np

from evals.int8_agreement import near_ties, top_gaps


def test_top_gaps_are_the_best_score_less_the_second():
    scores = np.array([[0.1, 2.0, 1.5], [3.0, -1.0, 2.9]])
    assert np.allclose(top_gaps(scores), [0.5, 0.1])
    assert np.isinf(top_gaps(np.array([[4.0]]))).all()  # one score: no second to tie with


def test_near_ties_name_the_margins_of_the_changed_decisions_and_how_common_such_margins_are():
    gaps = np.array([0.01, 2.0, 0.3, 0.02, 5.0, 1.0, 0.5, 0.7, 0.9, 3.0])
    same = np.array([False, True, True, False, True, True, True, True, True, True])
    figures = near_ties(gaps, same)
    assert figures["changed_fp32_margins"] == [0.01, 0.02]
    assert figures["share_within_largest_changed_margin"] == 0.2  # 0.01 and 0.02 of ten
    assert near_ties(gaps, np.ones(10, dtype=bool)) == {"changed_fp32_margins": []}
