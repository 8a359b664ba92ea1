"""--precision auto's int8-verified candidate (export/verified.py): every group int8 with the fp32 graph beside it,
measured on the calibration inputs as the server runs the pair, chosen when it is the fastest that meets the
agreement target, and then written as `--verify-graph` writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_serving_support import build_checkpoint

import export.onnx as onnx_export
from bert.tasks import TASKS
from export import verified
from export.onnx import PAIRED, Paired, choose_precision, cli


def test_decisions_are_what_a_user_reads_off_the_answers():
    rerank = TASKS["rerank"]
    pairs = [["q1", "a"], ["q1", "b"], ["q2", "c"], ["q1", "d"], ["q2", "e"]]
    # per query its top text; a tie keeps the first (as the route's order does)
    assert rerank.decisions(pairs, [0.1, 0.9, 0.5, 0.9, 0.2]) == ["b", "c"]
    assert TASKS["classify"].decisions(["x"], [[{"label": "pos", "score": 0.9}]]) == ["pos"]
    entities = [{"entity_group": "PER", "start": 0, "end": 5, "score": 0.9, "word": "Angela"}]
    moved = [{**entities[0], "score": 0.5}]  # the score moves, the span does not: the same decision
    assert TASKS["ner"].decisions(["t"], [entities]) == TASKS["ner"].decisions(["t"], [moved])
    assert TASKS["ner"].decisions(["t"], [entities]) != TASKS["ner"].decisions(["t"], [[{**entities[0], "end": 4}]])
    assert TASKS["qa"].decisions([{}], [[{"answer": "Berlin", "score": 0.7, "start": 1, "end": 7}]]) == ["Berlin"]
    assert {t.name for t in TASKS.values() if verified.verifiable(t)} == {"classify", "ner", "qa", "rerank"}


@pytest.fixture(scope="module")
def ner_graphs(tmp_path_factory):
    """A tiny NER checkpoint exported fp32 and every group int8."""
    root = tmp_path_factory.mktemp("verified")
    ckpt = build_checkpoint(root / "ckpt", task="ner")
    common = ["--ckpt", str(ckpt), "--max-seq", "64", "--calibration", "none"]
    assert cli([*common, "--precision", "fp32", "--out", str(root / "fp32")]) == 0
    assert cli([*common, "--precision", "int8", "--int8-scope", "all", "--out", str(root / "int8")]) == 0
    return ckpt, root


def _alone(directory: Path, items: list, task) -> tuple[list, list, list]:
    """(outputs, margins, decisions) of `items` on one graph, through the runtime."""
    from bert.tasks.common import Limits
    from runtime.inference import Inference, run_encoded
    from runtime.loading import LoadOptions, load_model

    model = load_model(directory, LoadOptions(allow_unverified=True))
    inference = Inference(model, task)
    options = task.job_options(task.job_defaults(truncate=True))
    limits = Limits(max_length=64, max_sequences=1 << 20, qa_max_length=64, qa_max_question_length=64)
    encoded = inference.encode(items, limits, options)
    outputs = run_encoded(model.backend, encoded)
    margins = inference.margins(encoded, outputs, options)
    return outputs, margins, task.decisions(items, inference.decode(encoded, outputs, options))


def test_the_pair_answers_unsure_items_with_fp32_and_the_rest_with_int8(ner_graphs):
    _, root = ner_graphs
    task = TASKS["ner"]
    items = verified.calibration_items(task, None)
    assert len(items) > 40 and all(isinstance(i, str) for i in items)
    found = verified.measure(root / "int8", root / "fp32", ["ner", "embed"], None, 64)
    assert set(found.tasks) == {"ner"}  # embed has no margins: not verifiable
    _, fast_margins, fast = _alone(root / "int8", items, task)
    _, _, exact = _alone(root / "fp32", items, task)
    unsure = [m < task.verify_margin.default for m in fast_margins]
    expected = sum(e == (e if u else f) for e, f, u in zip(exact, fast, unsure)) / len(items)
    figures = found.tasks["ner"]
    assert figures["items"] == len(items) and figures["answered_again"] == sum(unsure)
    assert figures["agreement"] == pytest.approx(expected)
    assert figures["agreement"] >= sum(e == f for e, f in zip(exact, fast)) / len(items)
    assert 0 <= found.again_share <= 1 and found.agreement == figures["agreement"]
    # the exact graph against itself: every decision kept, whatever was answered again
    same = verified.measure(root / "fp32", root / "fp32", ["ner"], None, 64)
    assert same.tasks["ner"]["agreement"] == 1.0


def test_the_pair_is_timed_as_int8_plus_fp32_over_what_it_answers_again(ner_graphs):
    from export import sensitivity
    from export.samples import SENTENCES

    _, root = ner_graphs
    from bert.tokenizer import BertTokenizer

    calibration = sensitivity.build_calibration(BertTokenizer.from_dir(root / "fp32"), {"sentences"}, 64)
    fp32, int8 = root / "fp32" / "model.onnx", root / "int8" / "model.onnx"
    assert len(SENTENCES) > 0

    def choose(agreement: float, share: float) -> dict:
        found = verified.Verified(tasks={"ner": {"agreement": agreement}}, again_share=share)
        return choose_precision(fp32, {}, calibration, {}, 0.995, Paired(int8, {}, found, ""))

    everything = choose(1.0, 1.0)["candidates"][PAIRED]  # all answered again: slower than fp32 alone
    assert everything["meets_target"] and everything["speed"] < 1 and everything["answered_again_token_share"] == 1
    low = choose(0.9, 0.0)
    assert not low["candidates"][PAIRED]["meets_target"] and low["graph"] == "fp32"
    assert "below the 99.5% target" in low["candidates"][PAIRED]["refused"]
    none = choose(1.0, 0.0)
    assert none["graph"] == (PAIRED if none["candidates"][PAIRED]["speed"] > 1 else "fp32")
    assert none["candidates"][PAIRED]["seconds"] == pytest.approx(none["candidates"][PAIRED]["seconds"])


def test_an_auto_export_measures_the_pair_and_writes_it_with_its_fp32_graph_when_chosen(
    ner_graphs, tmp_path, monkeypatch
):
    ckpt, _ = ner_graphs
    common = ["--ckpt", str(ckpt), "--max-seq", "64", "--calibration", "none", "--int8-trials", "4"]
    common += ["--precision", "auto", "--int8-scope", "auto"]  # the suite's default is fp32 (conftest.py)
    out = tmp_path / "auto"
    assert cli([*common, "--out", str(out)]) == 0
    choice = json.loads((out / "manifest.json").read_text())["precision_choice"]
    pair = choice["candidates"][PAIRED]
    assert pair["measured"]["tasks"]["ner"]["items"] > 40 and math.isfinite(pair["speed"])
    assert (choice["graph"] == PAIRED) == (out / "verify").is_dir()

    without = tmp_path / "single"
    assert cli([*common, "--no-int8-verified", "--out", str(without)]) == 0
    assert PAIRED not in json.loads((without / "manifest.json").read_text())["precision_choice"]["candidates"]

    # where the pair is the choice (forced here: which graph is fastest is the machine's), it is written as
    # --verify-graph writes it, and a server given the directory loads the fp32 graph beside the int8 one
    real = onnx_export.choose_precision

    def pair_chosen(*args, **kwargs):
        made = real(*args, **kwargs)
        return made | {"graph": PAIRED, "chosen": "int8"}

    monkeypatch.setattr(onnx_export, "choose_precision", pair_chosen)
    chosen = tmp_path / "paired"
    assert cli([*common, "--out", str(chosen)]) == 0
    manifest = json.loads((chosen / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["precision_choice"]["graph"] == PAIRED
    assert manifest["quantization"]["scope"] == "all" and manifest["verify_graph"]["dir"] == "verify"
    assert json.loads((chosen / "verify" / "manifest.json").read_text())["precision"] == "fp32"
    assert not any(p.name.startswith((".paired", PAIRED, "fused", "fp32")) for p in chosen.iterdir())

    from runtime.artifact import verify_artifact, verify_graph
    from runtime.model_dir import read_model_spec

    spec = read_model_spec(chosen)
    verify_artifact(spec)
    assert verify_graph(spec) == chosen / "verify"


def test_a_pair_that_cannot_be_measured_is_left_out_with_a_note_and_no_files(ner_graphs, tmp_path):
    """An fp32 graph the runtime cannot load (a truncated file here): the candidate is left out, the export's note
    says why, and the measuring directories are gone; the int8 graph was written where export looks for it."""
    import shutil

    _, root = ner_graphs
    broken = tmp_path / "fp32.onnx"
    broken.write_bytes((root / "fp32" / "model.onnx").read_bytes()[:4096])

    def write_config(directory: Path) -> None:
        for p in (root / "fp32").iterdir():
            if p.is_file() and p.suffix != ".onnx" and not p.name.endswith(".data") and p.name != "manifest.json":
                shutil.copy(p, directory / p.name)

    notes: list[str] = []
    work = tmp_path / "work"
    work.mkdir()
    found = onnx_export.measure_paired(
        notes.append,
        root / "fp32" / "model.onnx",
        broken,
        work,
        None,
        {},
        None,
        [TASKS["ner"]],
        None,
        {"max_seq": 64},
        write_config,
    )
    assert found is None
    assert len(notes) == 1 and notes[0].startswith(f"{PAIRED}: not measured (") and notes[0].endswith("left out")
    assert sorted(p.name for p in work.iterdir()) == [f"{PAIRED}.onnx"]
