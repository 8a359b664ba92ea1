"""Sensitivity-guided int8 and `--precision auto` (export/sensitivity.py), on a tiny random model and a few
calibration inputs; the agreement figures on real models and held-out data are in docs/export.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from export import pertoken, sensitivity  # noqa: E402
from export.onnx import OnnxOptions, cli  # noqa: E402
from export.samples import CalibrationError, read_calibration  # noqa: E402


def test_estimated_agreement_counts_changes_that_take_away_margins():
    margins = np.array([0.1, 0.2, 1.0, 2.0])
    assert sensitivity.estimated_agreement(margins, np.zeros(4)) == 1.0
    assert sensitivity.estimated_agreement(margins, np.full(4, 5.0)) == 1.0  # a lead that grows flips nothing
    # each change of -0.07 counts as -0.14 (CHANGE_SAFETY 2) and takes away the margin 0.1 only: 1 of 4 margins
    assert sensitivity.CHANGE_SAFETY == 2.0
    assert sensitivity.estimated_agreement(margins, np.full(4, -0.07)) == pytest.approx(0.75)
    assert sensitivity.estimated_agreement(margins, np.full(4, -3.0)) == 0.0


def test_agreement_of_labels_positions_ranked_and_cosine():
    mask = np.ones((2, 3), dtype=np.int64)
    batch = {"attention_mask": mask}
    ref = {"logits": np.array([[2.0, 0.0], [0.0, 0.3]])}
    flipped = {"logits": np.array([[2.0, 0.0], [0.4, 0.3]])}
    same = sensitivity.agreement([ref], [ref], [batch], "labels", "logits", False)
    assert (same.observed, same.estimated, same.relative_rms) == (1.0, 1.0, 0.0)
    moved = sensitivity.agreement([ref], [flipped], [batch], "labels", "logits", False)
    assert moved.observed == 0.5 and moved.estimated < 1.0 and moved.relative_rms > 0

    ranked_ref = {"logits": np.array([[1.0], [3.0]])}  # one query, two texts: the second is best
    ranked_bad = {"logits": np.array([[3.5], [3.0]])}
    assert sensitivity.agreement([ranked_ref], [ranked_bad], [batch], "ranked", "logits", False).observed == 0.0
    # a single-logit head judged as labels has nothing to rank: no figure rather than a trivial 100 %
    assert sensitivity.agreement([ranked_ref], [ranked_bad], [batch], "labels", "logits", False).observed is None

    start_ref = {"start": np.array([[0.0, 5.0, 1.0], [4.0, 0.0, 0.0]])}
    start_bad = {"start": np.array([[0.0, 5.0, 1.0], [0.0, 4.5, 0.0]])}
    assert sensitivity.agreement([start_ref], [start_bad], [batch], "positions", "start", False).observed == 0.5

    emb = {"embedding": np.array([[1.0, 0.0], [0.0, 1.0]])}
    bent = {"embedding": np.array([[1.0, 0.05], [1.0, 1.0]])}  # cosine 0.9988 and 0.707
    cos = sensitivity.agreement([emb], [bent], [batch], "cosine", "embedding", False)
    assert cos.observed == 0.5 and cos.estimated == 0.5


def test_calibration_file_takes_every_task_input_format(tmp_path):
    path = tmp_path / "calibration.jsonl"
    lines = [
        "plain text line",
        json.dumps("a JSON string"),
        json.dumps(["a text", "its pair"]),
        json.dumps({"inputs": ["one", ["two", "pair"]]}),
        json.dumps({"question": "Who?", "context": "Ann did."}),
        json.dumps({"query": "q", "texts": ["a", "b", "c"]}),
        json.dumps({"query": "q2", "documents": ["d", "e"]}),
        json.dumps({"inputs": "a film review", "candidate_labels": ["film", "sport"]}),
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
    found = read_calibration(path)
    assert found["sentences"] == ["plain text line", "a JSON string", "one"]
    assert found["pairs"] == [("a text", "its pair"), ("two", "pair"), ("Who?", "Ann did.")]
    assert [len(g) for g in found["groups"]] == [3, 2, 2]
    assert found["groups"][2][1] == ("a film review", "This example is sport.")
    path.write_text(json.dumps({"label": 1}) + "\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match="calibration.jsonl:1"):
        read_calibration(path)
    # a request body gone wrong is refused, not calibrated on as text; so is a group that cannot be ranked
    for bad, why in [
        ('{"inputs": "hello world"', "not valid JSON"),
        (json.dumps({"query": "q", "texts": "not a list"}), "at least 2 texts"),
        (json.dumps({"query": "q", "texts": ["alone"]}), "at least 2 texts"),
    ]:
        path.write_text("fine text\n" + bad + "\n", encoding="utf-8")
        with pytest.raises(CalibrationError, match=f"calibration.jsonl:2: .*{why}"):
            read_calibration(path)
    path.write_text('[Verse 1] a lyric\n"Hello," she said.\n', encoding="utf-8")  # text may start with [ or "
    assert read_calibration(path)["sentences"] == ["[Verse 1] a lyric", '"Hello," she said.']


def test_calibration_inputs_no_output_is_judged_on_are_named():
    from export.sensitivity import unused_calibration

    extra = {"sentences": ["a", "b"], "pairs": [("q", "c")], "groups": [[("q", "a"), ("q", "b")]]}
    assert unused_calibration(extra, {"sentences"}) == "1 ranked group"
    assert unused_calibration(extra, {"question_contexts"}) == "2 texts, 1 ranked group"
    assert unused_calibration(extra, {"sentences", "ranked_groups"}) == ""
    assert unused_calibration(None, {"question_contexts"}) == ""


@pytest.fixture(scope="module")
def tiny_fused(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-fp32")
    args = ["--ckpt", "tiny", "--random-init", "--precision", "fp32", "--out", str(out), "--max-seq", "64"]
    assert cli(args) == 0
    return out / "model.onnx"


def test_groups_are_one_per_layer_and_kind_or_coarser_within_the_budget(tiny_fused):
    model = onnx.load(str(tiny_fused))
    fine = sensitivity.groups_of(model, budget=32)
    labels = [g.label for g in fine]
    assert labels[:4] == ["layer 0 attention", "layer 0 attention-output", "layer 0 ffn-in", "layer 0 ffn-out"]
    assert "embeddings" in labels and "head" in labels
    # every quantisable node is in exactly one group; a Gemm under the name quantize_dynamic gives its MatMul
    nodes = [n for g in fine for n in g.nodes]
    assert len(nodes) == len(set(nodes)) == len(sensitivity.quantisable_nodes(model))
    assert all(n.endswith("Gemm_MatMul") for g in fine if g.label == "head" for n in g.nodes)
    coarse = sensitivity.groups_of(model, budget=8)
    assert [g.label for g in coarse] == ["layer 0", "layer 1", "embeddings", "head"]
    assert sorted(n for g in coarse for n in g.nodes) == sorted(nodes)


def planted_outlier(fused, out, layer: int = 1):
    """The graph with one FFN unit of `layer` always on (bias +300 before its GELU) and its outgoing weights zero
    (fp32's answers do not see it), but that layer's FFN output projection now sees one activation ~300 beside
    values ~1, which one per-tensor int8 scale cannot hold."""
    from onnx import numpy_helper

    from export.variants import ffn_output_matmuls

    model = onnx.load(str(fused))
    gelu = [n for n in model.graph.node if n.op_type == "BiasGelu"][layer]
    projection = next(n for n in model.graph.node if n.name == ffn_output_matmuls(model)[layer])
    for i, tensor in enumerate(model.graph.initializer):
        value = numpy_helper.to_array(tensor).copy()
        if tensor.name == gelu.input[1]:
            value[0] += 300.0
        elif tensor.name == projection.input[1]:
            value[0, :] = 0.0
            value *= 50.0  # a random tiny model's FFN adds next to nothing to its residual stream; now it counts
        else:
            continue
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, tensor.name))
    onnx.save(model, str(out))
    return out


def test_search_keeps_the_fewest_sensitive_groups_that_meet_the_target(tiny_fused, tmp_path):
    from bert.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_dir(tiny_fused.parent)
    calibration = sensitivity.build_calibration(tokenizer, {"sentences"}, 32)
    judged = {"logits": ("cosine", False, "sentences")}  # a random model's labels hardly move: its logits do
    notes = []
    easy = sensitivity.search(tiny_fused, calibration, judged, target=0.01, budget=32, note=notes.append)
    assert easy.kept == [] and notes[0].startswith("int8 trial 1: every group quantised (per-token)")
    assert len(easy.trials) == 1
    # the bound on the rest, said once the first trial has run: its time, the budget, their product
    bound = re.fullmatch(
        r"int8 search: ([\d.]+) s a trial graph over (\d+) calibration inputs; at most 32 trials, "
        r"so at most about (\d+) s",
        notes[1],
    )
    assert bound and int(bound[2]) == sum(calibration.size().values()), notes[1]

    planted = planted_outlier(tiny_fused, tmp_path / "planted.onnx")
    strict = sensitivity.search(planted, calibration, judged, target=0.99, budget=32, note=notes.append)
    assert len(strict.trials) <= 32 and strict.trials[0].agreement < 0.99
    ordered = sorted(strict.sensitivity, key=lambda label: -strict.sensitivity[label])
    assert ordered[0] == "layer 1 ffn-out"  # the planted outlier is found
    # the embeddings and the heads (int8 saves next to no time there) are kept fp32 first, then the most sensitive
    kept = [g.label for g in strict.kept]
    assert kept[:2] == ["embeddings", "head"] and "embeddings" not in strict.sensitivity
    # step 3 kept the most sensitive, then step 4 quantised those it could with their outlier channels fp32: the
    # planted unit is the outlier channel of layer 1's FFN output projection
    step3 = [g.label for g in strict.groups if g in strict.kept or any(n in strict.outliers for n in g.nodes)]
    assert set(step3) - {"embeddings", "head"} == set(ordered[: len(step3) - 2]) and "layer 1 ffn-out" in step3
    (projection,) = next(g for g in strict.groups if g.label == "layer 1 ffn-out").nodes
    assert "layer 1 ffn-out" not in kept and 0 in strict.outliers[projection]
    assert len(strict.kept) < len(strict.groups) and strict.chosen.agreement >= 0.99


def planted_value_outlier(fused, out, layer: int = 1, channels=(5,)):
    """The graph with `channels` of the LayerNorm output that `layer`'s attention reads 300x louder, but no weight of
    its Q, K or V projection reading them (fp32's answers do not see them), and the value projection 50x stronger: the
    loud channels take the whole per-token int8 range from the others, which V passes on to the output while Q and K
    only shift near-uniform attention weights."""
    from onnx import numpy_helper

    model = onnx.load(str(fused))
    attention = next(n for n in model.graph.node if n.name == f"Attention_{layer}")
    norm = next(n for n in model.graph.node if attention.input[0] in n.output)
    at = 2 if norm.op_type == "SkipLayerNormalization" else 1  # the fp32 export splits it: Add + LayerNormalization
    index = {t.name: i for i, t in enumerate(model.graph.initializer)}
    gamma = numpy_helper.to_array(model.graph.initializer[index[norm.input[at]]]).copy()
    gamma[list(channels)] *= 300.0
    model.graph.initializer.append(numpy_helper.from_array(gamma, "planted_gamma"))  # LayerNorms may share theirs
    norm.input[at] = "planted_gamma"
    weight = numpy_helper.to_array(model.graph.initializer[index[attention.input[1]]]).copy()
    weight[list(channels), :] = 0.0
    weight[:, 2 * weight.shape[1] // 3 :] *= 50.0
    model.graph.initializer[index[attention.input[1]]].CopyFrom(numpy_helper.from_array(weight, attention.input[1]))
    onnx.save(model, str(out))
    return out


def test_an_attention_kept_fp32_for_its_value_quantises_its_query_and_key(tiny_fused, tmp_path, monkeypatch):
    from bert.tokenizer import BertTokenizer
    from export.variants import quantize_int8

    calibration = sensitivity.build_calibration(BertTokenizer.from_dir(tiny_fused.parent), {"sentences"}, 32)
    judged = {"logits": ("cosine", False, "sentences")}
    planted = planted_value_outlier(tiny_fused, tmp_path / "planted.onnx", channels=(5,))
    # per-token scales take in a few loud channels that a per-tensor scale could not, and step 4 takes the loud one
    # out: here step 4 is handed a quiet channel instead, so that the attention stays fp32 and step 5 runs
    monkeypatch.setattr(sensitivity, "outlier_channels", lambda path, calibration, nodes: {n: [0] for n in nodes})
    # symmetric rows but after a GELU: the shipped asymmetric rows meet the target here with every group int8
    # (the next test), so steps 3-5 would not run
    notes = []
    found = sensitivity.search(planted, calibration, judged, target=0.99, budget=32, note=notes.append, rows="auto")
    assert "layer 1 attention" in [g.label for g in found.kept] and found.describe()["row_mode"] == "auto"
    assert max(found.sensitivity, key=found.sensitivity.get) == "layer 1 attention"
    assert any(n.startswith("int8 trial") and "outlier channels fp32 in" in n for n in notes)
    assert "Attention_1" not in found.outliers
    assert any("query and key per token, value fp32, in layer 1 attention" in n for n in notes)
    described = found.describe()
    assert described["group_schemes"]["layer 1 attention"] == "per-token query and key, value fp32"
    assert "Attention_1/qk" in described["per_token_nodes"] and "Attention_1" in found.fp32_nodes
    assert found.chosen.agreement >= 0.99 and described["batch_invariant"] is True
    # the export writes the graph the search measured: the value projection fp32, the query and key int8
    out = tmp_path / "int8.onnx"
    per_token_nodes = [n for n, how in found.quantised.items() if how == "per-token"]
    record = quantize_int8(planted, out, "auto", found.fp32_nodes, per_token_nodes, rows=found.rows)
    nodes = {n.name: n.op_type for n in onnx.load(str(out)).graph.node}
    assert nodes["Attention_1/v"] == "MatMul" and nodes["Attention_1/qk/per_token/MatMulIntegerToFloat"]
    assert record["row_mode"] == "auto"


def test_a_group_kept_fp32_for_an_outlier_channel_is_int8_with_that_channel_fp32(tiny_fused, tmp_path):
    from bert.tokenizer import BertTokenizer
    from export.variants import quantize_int8

    calibration = sensitivity.build_calibration(BertTokenizer.from_dir(tiny_fused.parent), {"sentences"}, 32)
    judged = {"logits": ("cosine", False, "sentences")}
    planted = planted_value_outlier(tiny_fused, tmp_path / "planted.onnx", channels=(5,))
    # the shipped rows (each its own range and zero point) meet the target with every group int8, and the export
    # writes those rows; symmetric rows (below) need the attention's loud channel taken out
    assert pertoken.SEARCH_ROWS == "asymmetric"
    shipped = sensitivity.search(planted, calibration, judged, target=0.99, budget=32, note=lambda line: None)
    assert shipped.kept == [] and len(shipped.trials) == 1 and shipped.chosen.agreement >= 0.99
    rows = [n for n, how in shipped.quantised.items() if how == "per-token"]
    written = quantize_int8(planted, tmp_path / "shipped.onnx", "auto", [], rows)
    assert written["row_mode"] == "asymmetric"
    reference = sensitivity.run_graph(planted, calibration, ["logits"])
    answers = sensitivity.run_graph(tmp_path / "shipped.onnx", calibration, ["logits"])
    assert sensitivity.judge(reference, answers, calibration, judged)[0] == shipped.chosen.agreement
    notes = []
    found = sensitivity.search(planted, calibration, judged, target=0.99, budget=32, note=notes.append, rows="auto")
    # step 3 keeps the attention fp32; step 4 finds the loud channel and quantises the rest of its input
    assert found.sensitivity["layer 1 attention"] > 0.05
    assert any("outlier channels fp32 in" in n and "layer 1 attention" in n for n in notes)
    taken = found.outliers["Attention_1"]
    assert "layer 1 attention" not in [g.label for g in found.kept] and 5 in taken
    described = found.describe()
    assert described["group_schemes"]["layer 1 attention"] == f"per-token, {len(taken)} outlier input channels fp32"
    assert described["outlier_channels"]["Attention_1"] == taken and "Attention_1" in described["per_token_nodes"]
    assert found.chosen.agreement >= 0.99
    # the export writes the graph the search measured, and it answers as that trial did
    out = tmp_path / "int8.onnx"
    per_token_nodes = [n for n, how in found.quantised.items() if how == "per-token"]
    record = quantize_int8(planted, out, "auto", found.fp32_nodes, per_token_nodes, found.outliers, rows="auto")
    assert record["outlier_channels"] == {"Attention_1": taken}
    nodes = {n.name: n.op_type for n in onnx.load(str(out)).graph.node}
    assert nodes["Attention_1/qkv/per_token/OutlierMatMul"] == "MatMul"
    reference = sensitivity.run_graph(planted, calibration, ["logits"])
    written = sensitivity.run_graph(out, calibration, ["logits"])
    agreement, _, _ = sensitivity.judge(reference, written, calibration, judged)
    assert agreement == found.chosen.agreement
    # without the channel taken out, the same graph is what step 3 refused
    plain = tmp_path / "plain.onnx"
    quantize_int8(planted, plain, "auto", found.fp32_nodes, per_token_nodes, rows="auto")
    without, _, _ = sensitivity.judge(
        reference, sensitivity.run_graph(plain, calibration, ["logits"]), calibration, judged
    )
    assert without < 0.99


def test_precision_auto_is_the_default_and_writes_the_faster_faithful_graph(tmp_path):
    fields = OnnxOptions.__dataclass_fields__
    assert fields["precision"].default == "auto" and fields["int8_scope"].default == "auto"
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("An extra calibration sentence.\n", encoding="utf-8")
    out = tmp_path / "art"
    args = ["--ckpt", "tiny", "--random-init", "--out", str(out), "--max-seq", "64", "--precision", "auto"]
    args += ["--int8-scope", "auto"]
    assert cli([*args, "--int8-trials", "6", "--calibration", str(calibration), "--int8-agreement", "0.5"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    choice = manifest["precision_choice"]
    assert choice["requested"] == "auto" and manifest["precision"] == choice["chosen"]
    candidates = choice["candidates"]
    # the searches' graphs (int8, per-row activation scales), one per row mode (asymmetric rows, then auto rows: the
    # second search runs where the first quantised something): no per-tensor graph, whose answers depend on the batch
    assert set(candidates) - {"int8-verified"} in ({"fp32", "int8"}, {"fp32", "int8", "int8-auto-rows"})
    # a classifier: also every group int8 with the fp32 graph answering again what it is unsure of
    assert candidates["int8-verified"]["measured"]["tasks"]["classify"]["items"] > 0
    assert all(c["seconds"] > 0 for c in candidates.values()) and candidates["fp32"]["meets_target"]
    # the fastest int8 graph that meets the target and is faster than fp32, pass by pass (the median of the paired
    # ratios)
    int8s = {name: c for name, c in candidates.items() if name != "fp32"}
    assert all(c["speed"] > 0 for c in int8s.values())
    faithful = {name: c["speed"] for name, c in int8s.items() if c["meets_target"] and c["speed"] > 1}
    assert choice["graph"] == (max(faithful, key=faithful.get) if faithful else "fp32")
    assert choice["chosen"] == ("int8" if faithful else "fp32")
    assert (choice["graph"] == "int8-verified") == (out / "verify").is_dir()
    if choice["chosen"] == "int8" and choice["graph"] != "int8-verified":
        quantization = manifest["quantization"]
        rows = {"int8": "asymmetric", "int8-auto-rows": "auto"}[choice["graph"]]
        assert quantization["row_mode"] in (rows, None)  # None: no per-token node (a tiny model's tables alone)
        assert quantization["scope"] == "auto" and quantization["trials"] <= 6
        assert quantization["method"] == "per-row" and quantization["batch_invariant"] is True
        assert quantization["agreement"] >= 0.5 and quantization["calibration"]["sentences"] == 49
        assert manifest["parity"]["model"]["precision"] == "int8"
    assert not any(p.name.startswith(("fused", "int8")) for p in out.iterdir())


def test_a_checkpoint_holding_calibration_text_is_measured_on_it_unless_told_none(tmp_path, capsys):
    """A checkpoint trained here holds its evaluation inputs (training/calibration.py); the export measures int8
    on them beside the built-in samples with no --calibration, says so, and records the file in the manifest."""
    from test_serving_support import build_checkpoint

    from bert.checkpoint import CALIBRATION_FILE

    ckpt = build_checkpoint(tmp_path / "ckpt", task="classify")
    own = ["a film of quiet charm .", '["a premise .", "a hypothesis ."]', "the plot never takes off ."]
    (ckpt / CALIBRATION_FILE).write_text("".join(line + "\n" for line in own), encoding="utf-8")
    args = ["--ckpt", str(ckpt), "--max-seq", "64", "--precision", "int8", "--int8-scope", "auto", "--int8-trials", "2"]
    assert cli([*args, "--out", str(tmp_path / "a")]) == 0
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    record = manifest["calibration"]["calibration_file"]
    assert record["from"] == "the checkpoint's calibration.jsonl" and record["path"] == str(ckpt / CALIBRATION_FILE)
    built_in = manifest["quantization"]["calibration"]["sentences"]
    assert cli([*args, "--calibration", "none", "--out", str(tmp_path / "b")]) == 0
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["calibration"]["calibration_file"] is None
    assert built_in == manifest["quantization"]["calibration"]["sentences"] + 3  # two texts and one pair

    # a checkpoint's file that cannot be read: one line naming it and the way round it, exit 2, nothing written
    (ckpt / CALIBRATION_FILE).write_text('a text\n{"inputs": 3}\n', encoding="utf-8")
    assert cli([*args, "--out", str(tmp_path / "c")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "calibration.jsonl:2" in line and "--calibration none" in line, line
    assert not (tmp_path / "c").exists()


def test_bad_int8_flags_exit_2(tmp_path):
    base = ["--ckpt", "tiny", "--random-init", "--out", str(tmp_path / "a")]
    assert cli([*base, "--int8-agreement", "1.5"]) == 2
    assert cli([*base, "--int8-trials", "0"]) == 2
    assert cli([*base, "--calibration", str(tmp_path / "missing.txt")]) == 2


def test_every_task_is_judged_by_what_its_users_see():
    from types import SimpleNamespace

    import bert.model  # noqa: F401 - registers the mlm head kind, as loading a model does in an export
    from export.onnx import judged_outputs

    def wrapper(spec, dtypes=None):
        return SimpleNamespace(spec=spec, dtypes=dtypes or {})

    seq, tok = ("batch",), ("batch", "sequence")
    cases = {
        "classify": ({"logits": (None, seq, "classify")}, {"logits": ("labels", False, "sentences")}),
        "ner": ({"logits": (None, tok, "ner")}, {"logits": ("labels", True, "sentences")}),
        "qa": (
            {"start_logits": (None, tok, "qa"), "end_logits": (None, tok, "qa")},
            {
                "start_logits": ("positions", True, "question_contexts"),
                "end_logits": ("positions", True, "question_contexts"),
            },
        ),
        "embed": ({"embedding": (None, seq, "embed")}, {"embedding": ("cosine", False, "sentences")}),
        "rerank": ({"logits": (None, seq, "rerank")}, {"logits": ("ranked", False, "ranked_groups")}),
        "zero_shot": ({"logits": (None, seq, "zero_shot")}, {"logits": ("labels", False, "hypotheses")}),
        "encoder": ({"last_hidden_state": (None, tok, None)}, {"last_hidden_state": ("cosine", True, "sentences")}),
    }
    for task, (spec, expected) in cases.items():
        assert judged_outputs(wrapper(spec), task) == expected, task
    fill_mask = {"fill_mask_scores": (None, tok, "fill_mask"), "fill_mask_ids": (None, tok, "fill_mask")}
    judged = judged_outputs(wrapper(fill_mask, {"fill_mask_ids": "int64"}), "fill_mask")
    assert judged == {"fill_mask_scores": ("none", True, "sentences"), "fill_mask_ids": ("ids", True, "sentences")}


def test_qa_int8_is_searched_on_question_context_pairs(tmp_path):
    out = tmp_path / "qa"
    args = ["--ckpt", "tiny", "--random-init", "--task", "qa", "--out", str(out), "--max-seq", "64"]
    assert cli([*args, "--precision", "int8", "--int8-scope", "auto", "--int8-trials", "4"]) == 0
    quantization = json.loads((out / "manifest.json").read_text())["quantization"]
    assert quantization["calibration"] == {"question_contexts": 32}
    assert quantization["outputs"]["start_logits"]["kind"] == "positions" and quantization["trials"] <= 4


def test_calibration_has_long_contexts_and_entity_dense_sentences():
    from bert.tokenizer import BertTokenizer
    from export.samples import CALIBRATION_QA, CALIBRATION_SENTENCES, QUESTION_CONTEXTS, SENTENCES

    tokenizer = BertTokenizer.from_dir(Path(__file__).resolve().parents[1] / "serving" / "demo_model")
    calibration = sensitivity.build_calibration(tokenizer, {"sentences", "question_contexts", "ranked_groups"}, 256)
    sizes = calibration.size()
    assert sizes["sentences"] == len(SENTENCES) + len(CALIBRATION_SENTENCES)
    assert sizes["question_contexts"] == len(QUESTION_CONTEXTS) + len(CALIBRATION_QA)
    # the long contexts are whole paragraphs, kept whole (not cut) at 256 tokens
    longest = max(b["attention_mask"].sum(1).max() for b in calibration.batches["question_contexts"])
    assert 120 < longest < 256
    # rerank: the short contexts' queries, and each long-context question against its paragraph's sentences
    ranked = calibration.batches["ranked_groups"]
    assert len(ranked) == len(QUESTION_CONTEXTS) + len(CALIBRATION_QA)
    assert all(len(b["input_ids"]) >= 4 for b in ranked[len(QUESTION_CONTEXTS) :])


def test_precision_choice_says_why_an_int8_graph_is_refused(tiny_fused, tmp_path):
    """An int8 graph that kept every group fp32 is fp32 under another name: refused as such, not as 'below the
    target' beside an agreement of 1.0; one below the target says so."""
    from types import SimpleNamespace

    from bert.tokenizer import BertTokenizer
    from export.onnx import choose_precision

    calibration = sensitivity.build_calibration(BertTokenizer.from_dir(tiny_fused.parent), {"sentences"}, 32)
    kept_all = SimpleNamespace(groups=["g"], quantised={}, chosen=SimpleNamespace(agreement=1.0))
    choice = choose_precision(tiny_fused, {"int8": tiny_fused}, calibration, {"int8": kept_all}, 0.995)
    int8 = choice["candidates"]["int8"]
    assert choice["graph"] == "fp32" and not int8["meets_target"]
    assert int8["refused"] == "every group kept fp32: nothing quantised" and "nothing quantised" in choice["line"]
    low = SimpleNamespace(groups=["g"], quantised={"n": "per-token"}, chosen=SimpleNamespace(agreement=0.9))
    int8 = choose_precision(tiny_fused, {"int8": tiny_fused}, calibration, {"int8": low}, 0.995)["candidates"]["int8"]
    assert int8["refused"] == "below the 99.5% target" and "refused" not in choice["candidates"]["fp32"]


def test_an_auto_export_short_of_int8_speed_names_the_verify_graph_for_tasks_that_can_use_it():
    from export.onnx import fast_answers_hint

    def choice(graph: str, speed: float | None) -> dict:
        candidates = {"fp32": {"seconds": 1.0, "meets_target": True}}
        if speed is not None:
            candidates["int8"] = {"seconds": 1.0 / speed, "meets_target": True, "speed": speed}
        return {"graph": graph, "candidates": candidates}

    hint = fast_answers_hint(choice("fp32", 1.9), ["classify", "ner", "qa", "embed"])
    assert "for classify, ner, qa:" in hint and "--int8-scope all --verify-graph" in hint
    assert "rerank" in fast_answers_hint(choice("int8", 1.09), ["rerank"])  # an int8 graph kept mostly fp32
    assert fast_answers_hint(choice("int8", 1.8), ["rerank"]) is None  # int8's speed already
    assert fast_answers_hint(choice("fp32", None), ["embed"]) is None  # vectors: no unsure answer to verify
