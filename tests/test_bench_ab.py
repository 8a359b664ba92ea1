"""The interleaved A/B benchmark (bench/ab.py): both checkouts' servers up at once, load in ABBA windows, the
ratio of medians with a bootstrap interval; a batch job per side in the same order; a path that is not a
checkout is one line and exit 2."""

from __future__ import annotations

import json

import pytest
from test_serving_support import build_checkpoint

from bench import ab
from bench.common import REPO


def test_ratios_and_intervals_come_from_the_rounds():
    figures = ab.compare([100.0, 110.0, 90.0, 100.0], [95.0, 104.5, 85.5, 95.0])
    assert figures["before_median"] == 100.0 and figures["after_median"] == 95.0
    assert figures["ratio"] == pytest.approx(0.95)
    assert figures["round_ratios"] == pytest.approx([0.95] * 4)
    low, high = figures["ratio_95"]
    assert 0.8 < low <= 0.95 <= high < 1.15
    assert ab.ratio_interval([5.0] * 6, [6.0] * 6) == pytest.approx((1.2, 1.2))
    assert [ab.order(r) for r in range(3)] == [("before", "after"), ("after", "before"), ("before", "after")]


def test_a_to_a_run_measures_both_servers_and_the_batch_job(tmp_path, data_dir, capsys):
    ckpt = build_checkpoint(tmp_path / "ckpt")
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": f"sentence number {i} is fine"}) + "\n" for i in range(24)))
    out = tmp_path / "ab.json"
    code = ab.main(
        [
            "--before",
            str(REPO),
            "--task",
            "classify",
            "--model",
            str(ckpt),
            "--server-args",
            "--backend torch",
            "--concurrency",
            "2",
            "--rounds",
            "2",
            "--seconds",
            "0.4",
            "--warmup",
            "0.1",
            "--sample",
            "16",
            "--threads",
            "1",
            "--busy",
            "warn",
            "--check-seconds",
            "0.1",
            "--batch-rounds",
            "1",
            "--batch-args",
            f"--task classify --model {ckpt} --input {texts} --threads 1",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    results = json.loads(out.read_text())
    level = results["servers"]["classify"]["2"]
    assert len(level["before"]) == len(level["after"]) == 2
    assert all(x > 0 for x in level["before"] + level["after"])
    assert level["ratio"] == pytest.approx(level["after_median"] / level["before_median"])
    assert [(r["round"], r["side"]) for r in results["rows"]] == [
        (0, "before"),
        (0, "after"),
        (1, "after"),
        (1, "before"),
    ]
    assert all(r["errors"] == 0 and r["ok"] > 0 and r["mean_batch"] >= 1 for r in results["rows"])
    batch = results["batch"]
    assert len(batch["before"]) == len(batch["after"]) == 1 and min(batch["before"] + batch["after"]) > 0
    assert "after / before" in capsys.readouterr().out


def test_a_checkout_that_is_not_one_is_one_line_and_exit_2(tmp_path, capsys):
    assert ab.main(["--before", str(tmp_path), "--task", "classify"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a bertserve checkout" in err


def test_a_level_that_is_no_number_or_a_peer_that_is_none_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        ab.main(["--before", str(REPO), "--concurrency", "8,x"])
    assert stopped.value.code == 2 and "--concurrency '8,x'" in capsys.readouterr().err
    assert ab.main(["--before", str(REPO), "--task", "classify", "--peer", "nope", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: no peer 'nope' for classify; choose from bertserve-")
