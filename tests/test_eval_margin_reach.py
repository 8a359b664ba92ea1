"""evals/margin_reach.py: the fewest items a margin must send to the exact model for each agreement with it."""

from __future__ import annotations

import math

import pytest

from evals.margin_reach import at_margin, main, reach


def test_reach_sends_the_smallest_margins_first_and_names_the_margin_that_sends_them():
    # ten items; int8 changed the ones with margins 0.01, 0.3 and 0.6
    margins = [0.01, 0.9, 0.3, 0.05, 2.0, 0.6, 0.05, 1.5, 0.2, 0.7]
    changed = [True, False, True, False, False, True, False, False, False, False]
    rows = {r["target_pct"]: r for r in reach(changed, margins, (70.0, 80.0, 90.0, 100.0))}
    assert rows[70.0] == {"target_pct": 70.0, "answered_again_pct": 0.0, "margin": 0.0, "largest_sent": None}
    assert rows[80.0]["answered_again_pct"] == 10.0 and rows[80.0]["largest_sent"] == 0.01  # the 0.01 item alone
    assert rows[90.0]["answered_again_pct"] == 50.0 and rows[90.0]["largest_sent"] == 0.3  # 0.01, 0.05 x2, 0.2, 0.3
    assert rows[100.0]["answered_again_pct"] == 60.0 and rows[100.0]["largest_sent"] == 0.6
    for row in rows.values():  # the named margin sends exactly those items, as the server's `margin < m` does
        if row["largest_sent"] is not None:
            assert row["margin"] > row["largest_sent"]
            assert at_margin(changed, margins, row["margin"])["answered_again_pct"] == row["answered_again_pct"]
            assert at_margin(changed, margins, row["margin"])["agree_pct"] >= row["target_pct"]


def test_a_change_with_nothing_competing_cannot_be_reached_and_equal_margins_go_together():
    rows = reach([True, False], [math.inf, 0.5], (100.0,))
    assert rows[0]["answered_again_pct"] is None and rows[0]["margin"] is None
    rows = reach([False, True, False, False], [0.2, 0.2, 0.2, 0.9], (100.0,))
    assert rows[0]["answered_again_pct"] == 75.0  # the three items at 0.2 are sent together
    assert at_margin([False, True], [0.2, 0.2], 0.2) == {"margin": 0.2, "answered_again_pct": 0.0, "agree_pct": 50.0}


def test_a_directory_without_an_exact_model_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["--artifact", str(tmp_path), "--task", "classify"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"exact model {tmp_path / 'verify'}: not a model directory (no config.json)")
    with pytest.raises(SystemExit):
        main(["--artifact", str(tmp_path), "--margins", "0.1,a"])
    assert "--margins '0.1,a': not a comma list of numbers" in capsys.readouterr().err


def test_a_decision_that_is_a_set_counts_its_members_and_an_item_answered_again_counts_fp32s():
    # three sentences: int8 found spans {a, b} where fp32 found {a}; {c} as fp32; nothing where fp32 found {d}
    fast, exact = [{"a", "b"}, {"c"}, set()], [{"a"}, {"c"}, {"d"}]
    parts = (
        [len(f & e) for f, e in zip(fast, exact)],
        [len(f | e) for f, e in zip(fast, exact)],
        [len(e) for e in exact],
    )
    changed, margins = [f != e for f, e in zip(fast, exact)], [0.1, 0.05, 0.3]
    assert at_margin(changed, margins, 0.0, parts)["agree_pct"] == 50.0  # 2 of 4 spans
    assert at_margin(changed, margins, 0.2, parts) == {"margin": 0.2, "answered_again_pct": 66.67, "agree_pct": 66.67}
    rows = reach(changed, margins, (60.0, 100.0), parts)
    assert [r["answered_again_pct"] for r in rows] == [66.67, 100.0]
    assert [r["largest_sent"] for r in rows] == [0.1, 0.3]
