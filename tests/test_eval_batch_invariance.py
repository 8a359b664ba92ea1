"""evals/batch_invariance.py: held-out inputs answered alone and inside mixed batches, in-process and through a real
server under concurrent clients. A per-row int8 export passes; onnxruntime's per-tensor dynamic int8 of the same
fused graph fails the same check, so the check can fail."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from evals import batch_invariance  # noqa: E402
from export.onnx import cli  # noqa: E402


def export(out, task: str, *args: str):
    command = ["--out", str(out), "--ckpt", "tiny", "--random-init", "--task", task, "--max-seq", "512", "--no-verify"]
    assert cli([*command, *args]) == 0
    return out


@pytest.mark.parametrize("task", ["classify", "ner", "qa", "rerank"])
def test_per_row_int8_answers_held_out_inputs_alike_in_any_batch(task, tmp_path, data_dir):
    model = export(tmp_path / task, task, "--precision", "int8", "--int8-scope", "all")
    figures = tmp_path / "figures.json"
    code = batch_invariance.main(
        ["--model", str(model), "--count", "12", "--data", str(data_dir), "--json", str(figures)]
    )
    results = json.loads(figures.read_text())["results"]
    assert code == 0, results
    assert [r["check"] for r in results] == ["in-process, batches of 8", "in-process, batches of 32"]
    for r in results:
        assert r["decisions"] >= 12 and r["decisions_changed"] == 0 and r["largest_change"] <= 1e-5


def test_per_tensor_int8_is_caught(tmp_path, data_dir, capsys):
    from export.variants import quantize_dynamic_graph

    fp32 = export(tmp_path / "fp32", "classify", "--precision", "fp32")
    per_tensor = tmp_path / "per-tensor"
    shutil.copytree(fp32, per_tensor)
    quantize_dynamic_graph(fp32 / "model.onnx", per_tensor / "model.onnx")
    figures = tmp_path / "figures.json"
    args = ["--model", str(per_tensor), "--count", "64", "--data", str(data_dir), "--json", str(figures)]
    assert batch_invariance.main(args) == 1
    results = json.loads(figures.read_text())["results"]
    assert max(r["largest_change"] for r in results) > 1e-4
    assert "decisions changed" in capsys.readouterr().out


@pytest.mark.parametrize("task", ["classify", "rerank"])
def test_through_a_server_under_concurrent_clients(task, tmp_path, data_dir):
    from test_serving_support import Server

    model = export(tmp_path / task, task, "--precision", "int8", "--int8-scope", "all")
    figures = tmp_path / "figures.json"
    flags = ("--max-batch-requests", "32", "--max-padding", "1", "--max-wait-ms", "5")
    with Server("--model", str(model), *flags) as server:
        code = batch_invariance.main(
            ["--model", str(model), "--count", "24", "--data", str(data_dir), "--url", server.url]
            + ["--clients", "8", "--json", str(figures)]
        )
    results = json.loads(figures.read_text())["results"]
    assert code == 0, results
    served = results[-1]
    assert served["check"].startswith("server, 8 clients") and served["decisions_changed"] == 0
    assert served["answers"] == 3 * served["inputs"] and served["largest_change"] <= 1e-5
    assert served["sequences_per_batch"] > 1.5  # the batcher put callers' inputs together


def test_not_an_export_or_no_server_is_one_line_and_exit_2(tmp_path, capsys):
    assert batch_invariance.main(["--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "manifest.json" in err[0]
    for flag in ("--count", "--clients"):
        assert batch_invariance.main(["--model", str(tmp_path), flag, "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"{flag} 0: give 1 or more"]
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "manifest.json").write_text("{}")
    assert batch_invariance.main(["--model", str(tmp_path), "--url", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no server answers there" in err[0]


def test_a_ranking_is_compared_by_text_and_entities_as_they_are():
    from evals.batch_invariance import plain

    ranked = [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.2}]
    assert plain(ranked) == {"order": [1, 0], "by_text": [ranked[1], ranked[0]]}
    # aggregated entities carry "index": None (a token's index only without aggregation): a list, not a ranking
    entities = [
        {"entity_group": "PER", "index": None, "score": 0.9},
        {"entity_group": "LOC", "index": None, "score": 0.8},
    ]
    assert plain(entities) == entities
