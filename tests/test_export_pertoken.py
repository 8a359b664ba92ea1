"""int8 with one activation scale per token (export/pertoken.py) and the int8 search that uses it
(export/sensitivity.py): the transform against a numpy reference, its refusals, every task's export through it,
and all-MiniLM-L6-v2's real FFN activations."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from export.cli import exit_code_for  # noqa: E402
from export.pertoken import PerTokenError, per_token, rewritable  # noqa: E402


def matmul_graph(weight: np.ndarray, opset: int = 17, extra_nodes=(), extra_inits=()) -> onnx.ModelProto:
    """x (batch, tokens, k) @ weight -> y, plus a MatMul by a non-constant and a Gemm (what the transform refuses)."""
    k, n = weight.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", n])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")] + list(extra_nodes)
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(weight, "w"), *extra_inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def reference(x: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    """The scheme in numpy, in float32 as onnxruntime computes the scales: int8 weights per output channel, each row
    of x quantised with its own scale (round half to even, as QuantizeLinear)."""
    w_scale = np.abs(w).max(0) / np.float32(127)
    w_q = np.clip(np.round(w / w_scale), -127, 127)
    if mode == "symmetric":
        s = np.maximum(np.abs(x).max(-1, keepdims=True) * np.float32(1 / 127), np.float32(1e-12))
        x_q = np.clip(np.round(x / s), -128, 127)
    else:
        low, high = np.minimum(x.min(-1, keepdims=True), 0), np.maximum(x.max(-1, keepdims=True), 0)
        s = np.maximum((high - low) * np.float32(1 / 255), np.float32(1e-12))
        offset = np.round(low / s)
        x_q = np.clip(np.round(x / s - offset), 0, 255) + offset
    return (x_q.astype(np.float64) * s) @ (w_q.astype(np.float64) * w_scale)


@pytest.mark.parametrize("mode", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("opset", [17, 18])  # 18: ReduceMax takes its axes as an input
def test_per_token_matches_the_scheme_row_by_row(mode, opset):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(48, 24)).astype(np.float32)
    x = rng.normal(size=(2, 5, 48)).astype(np.float32)
    x[0, 1] *= 300.0  # one loud token: per tensor it would coarsen every other token's steps
    x[1, 2] = np.abs(x[1, 2])  # a row with no negative values (asymmetric: its zero point is 0)
    x[1, 3] = 0.0  # an all-zero row
    model = per_token(matmul_graph(w, opset), ["dense"], mode)
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["y"] and "w" not in {t.name for t in model.graph.initializer}
    assert any(n.op_type == "MatMulIntegerToFloat" for n in model.graph.node)
    (y,) = run(model, {"x": x})
    expected = reference(x, w, mode)
    row_scale = np.abs(expected).max(-1, keepdims=True)
    assert np.all(np.abs(y - expected) <= 1e-5 * row_scale + 1e-6)
    # each quiet token keeps its own precision beside the loud one
    exact = x @ w
    quiet = np.abs(y[0, 0] - exact[0, 0]).max() / np.abs(exact[0, 0]).max()
    assert quiet < 0.03 and np.all(y[1, 3] == 0)


@pytest.mark.parametrize("mode", ["symmetric", "asymmetric"])
def test_outlier_channels_stay_fp32_beside_the_int8_product(mode):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(48, 24)).astype(np.float32)
    x = rng.normal(size=(2, 5, 48)).astype(np.float32)
    x[..., 7] *= 200.0  # a loud channel on every token: per token it still sets every row's step
    if mode == "asymmetric":
        x = np.abs(x)
    exact = x @ w
    (plain,) = run(per_token(matmul_graph(w), ["dense"], mode), {"x": x})
    model = per_token(matmul_graph(w), ["dense"], mode, outliers={"dense": [7]})
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["y"]
    (y,) = run(model, {"x": x})
    # the rest of the row quantised on its own range, the loud channel added back in fp32: the scheme on x without
    # channel 7, plus channel 7's exact product
    quiet = x.copy()
    quiet[..., 7] = 0.0
    kept = w.copy()
    kept[7] = 0.0
    expected = reference(quiet, kept, mode) + np.outer(x[..., 7], w[7]).reshape(exact.shape)
    assert np.all(np.abs(y - expected) <= 1e-5 * np.abs(expected).max(-1, keepdims=True) + 1e-5)

    def error(values):
        return np.abs(values - exact).max() / np.abs(exact).max()

    assert error(y) < error(plain) / 10
    # every channel an outlier: nothing is left to quantise and the product is fp32's
    (everything,) = run(per_token(matmul_graph(w), ["dense"], mode, outliers={"dense": range(48)}), {"x": x})
    assert np.allclose(everything, exact, rtol=1e-5, atol=1e-3)


def test_refuses_what_it_cannot_rewrite_and_the_cli_says_so_in_one_line():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 4)).astype(np.float32)
    other = [
        helper.make_node("MatMul", ["x", "x_t"], ["xx"], name="dynamic"),  # second input computed at run time
        helper.make_node("Transpose", ["x"], ["x_t"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Gemm", ["a", "w"], ["b"], name="gemm"),
    ]
    model = matmul_graph(w, extra_nodes=other)
    before = model.SerializeToString()
    for name, message in [
        ("missing", "no node named 'missing'"),
        ("dynamic", "not a constant 2-D float weight"),
        ("gemm", "it is a Gemm"),
        ("dense/qk", "NAME/qk names a fused Attention's query and key"),  # a MatMul has no query and key to split
        ("missing/qk", "no node named 'missing/qk'"),
    ]:
        with pytest.raises(PerTokenError, match=message):
            per_token(model, ["dense", name])
        assert model.SerializeToString() == before  # nothing half-rewritten
    for outliers, message in [
        ({"dense": [8]}, "outlier channel 8 of 'dense' is out of its 8 input channels"),
        ({"dense": [-1]}, "outlier channel -1 of 'dense' is out of its 8 input channels"),
        ({"gemm": [0]}, "outlier channels given for 'gemm', which is not rewritten"),
    ]:
        with pytest.raises(PerTokenError, match=message):
            per_token(model, ["dense"], outliers=outliers)
        assert model.SerializeToString() == before
    assert rewritable(model) == ["dense"]
    assert exit_code_for(PerTokenError("x")) == 2


@pytest.fixture(scope="module")
def tiny_fused(tmp_path_factory):
    from export.onnx import cli

    out = tmp_path_factory.mktemp("tiny-fp32")
    args = ["--ckpt", "tiny", "--random-init", "--precision", "fp32", "--out", str(out), "--max-seq", "64"]
    assert cli([*args, "--no-verify"]) == 0
    return out / "model.onnx"


def test_fused_graph_keeps_its_outputs_and_stays_close(tiny_fused):
    model = onnx.load(str(tiny_fused))
    names = rewritable(model)
    # every layer's fused Attention (its QKV projection), attention output, FFN input and FFN output; not the Gemm heads
    assert sorted(n for n in names if "encoder/layer" not in n) == ["Attention_0", "Attention_1"] and len(names) == 8
    rewritten = per_token(onnx.load(str(tiny_fused)), names)
    onnx.checker.check_model(rewritten)
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 8 and ops.count("MultiHeadAttention") == 2 and "Attention" not in ops
    # auto: the FFN output projections (fed by BiasGelu) get asymmetric rows, the other MatMuls symmetric ones
    reduce_min = [n.name for n in rewritten.graph.node if n.op_type == "ReduceMin"]
    assert len(reduce_min) == 2 and all("/output/dense/" in n for n in reduce_min)
    assert [(o.name, str(o.type)) for o in rewritten.graph.output] == [
        (o.name, str(o.type)) for o in model.graph.output
    ]
    rng = np.random.default_rng(2)
    ids = rng.integers(1000, 2000, size=(3, 12))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    (ref,), (got,) = run(model, feed), run(rewritten, feed)
    assert got.shape == ref.shape and np.sqrt(np.mean((got - ref) ** 2)) < 0.05 * np.sqrt(np.mean(ref**2))


def test_query_and_key_alone_per_token_leave_the_value_projection_fp32(tiny_fused):
    from export.pertoken import unfuse_attention

    model = onnx.load(str(tiny_fused))
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 2000, size=(3, 12))
    mask = np.ones_like(ids)
    mask[1, 8:] = 0  # a padded row: the mask index reaches the split attention too
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (ref,) = run(model, feed)
    # fp32, split: the same maths
    split = unfuse_attention(onnx.load(str(tiny_fused)), ["Attention_0", "Attention_1"], split_value=["Attention_1"])
    ops = {n.name: n.op_type for n in split.graph.node}
    assert ops["Attention_0/qkv"] == "MatMul" and ops["Attention_1/qk"] == ops["Attention_1/v"] == "MatMul"
    assert np.abs(run(split, feed)[0] - ref).max() < 1e-5

    rewritten = per_token(onnx.load(str(tiny_fused)), ["Attention_0/qk", "Attention_1"])
    onnx.checker.check_model(rewritten)
    nodes = {n.name: n for n in rewritten.graph.node}
    assert nodes["Attention_0/v"].op_type == "MatMul"  # the value projection: fp32, its weight the packed one's third
    weights = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    packed = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "Attention_0_qkv_weight"))
    assert np.array_equal(weights[nodes["Attention_0/v"].input[1]], packed[:, 2 * packed.shape[1] // 3 :])
    assert (
        "Attention_0/qk/per_token/MatMulIntegerToFloat" in nodes
        and "Attention_1/qkv/per_token/MatMulIntegerToFloat" in nodes
    )
    (got,) = run(rewritten, feed)
    assert np.sqrt(np.mean((got - ref) ** 2)) < 0.05 * np.sqrt(np.mean(ref**2))

    with pytest.raises(PerTokenError, match="named both whole and as Attention_0/qk"):
        per_token(onnx.load(str(tiny_fused)), ["Attention_0", "Attention_0/qk"])


def test_search_quantises_per_token_and_records_each_groups_scheme(tiny_fused, tmp_path):
    from bert.tokenizer import BertTokenizer
    from export import sensitivity

    calibration = sensitivity.build_calibration(BertTokenizer.from_dir(tiny_fused.parent), {"sentences"}, 32)
    judged = {"logits": ("cosine", False, "sentences")}
    found = sensitivity.search(tiny_fused, calibration, judged, target=0.01, budget=32, note=lambda _: None)
    assert found.kept == [] and len(found.trials) == 1
    described = found.describe()
    schemes = described["group_schemes"]
    # every MatMul and fused Attention per token; the embedding tables int8 without an activation scale; the Gemm
    # heads fp32 (dynamic quantisation would give them one activation scale per batch)
    assert schemes["layer 0 ffn-out"] == "per-token" and schemes["layer 1 attention"] == "per-token"
    assert schemes["head"] == "fp32" and schemes["embeddings"] == "weights-only"
    assert len(described["per_token_nodes"]) == 8 and described["batch_invariant"] is True
    # the graph the search measured is the one the export writes
    from export.variants import quantize_int8

    per_token_nodes = [n for n, how in found.quantised.items() if how == "per-token"]
    out = tmp_path / "int8.onnx"
    record = quantize_int8(tiny_fused, out, "auto", found.fp32_nodes, per_token_nodes)
    assert record["method"] == "per-row" and len(record["per_token_nodes"]) == 8
    nodes = onnx.load(str(out)).graph.node
    ops = {n.op_type for n in nodes}
    assert {"MatMulIntegerToFloat", "MultiHeadAttention", "QEmbedLayerNormalization", "ReduceMin"} <= ops
    assert not ops & {"Attention", "QAttention", "DynamicQuantizeLinear"}
    assert all("Gemm" in n.name for n in nodes if n.op_type == "MatMul")  # the heads, fp32


def cross_encoder(directory, tokenizer_dir):
    import torch
    import transformers

    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=1
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("task", ["classify", "ner", "qa", "embed", "rerank", "fill_mask"])
def test_every_task_exports_per_token_int8_that_passes_parity(task, tmp_path, request):
    from export.onnx import cli

    out = tmp_path / task
    source = ["--ckpt", "tiny", "--random-init"]
    if task == "rerank":  # a random preset has no one-logit head: a tiny cross-encoder checkpoint
        source = ["--ckpt", str(cross_encoder(tmp_path / "cross-encoder", request.getfixturevalue("minilm_dir")))]
    args = [*source, "--task", task, "--out", str(out), "--max-seq", "32"]
    assert (
        cli([*args, "--precision", "int8", "--int8-scope", "auto", "--int8-trials", "1", "--int8-agreement", "0.01"])
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    quantization = manifest["quantization"]
    assert quantization["method"] == "per-row" and quantization["per_token_nodes"]
    # one trial: the layers form one group, their MatMuls and attentions per token
    assert quantization["group_schemes"]["layers 0-1"] == "per-token" and quantization["trials"] == 1
    assert manifest["parity"]["model"]["passed"] is True and manifest["parity"]["model"]["precision"] == "int8"
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert "MatMulIntegerToFloat" in ops


@pytest.mark.minilm
def test_minilm_ffn_output_per_token_moves_less_than_per_tensor(minilm_dir, tmp_path):
    """all-MiniLM-L6-v2's last FFN output projection on its real GELU activations (long-tailed, a few loud tokens):
    asymmetric per-token int8 is closer to fp32 than onnxruntime's per-tensor dynamic int8 and than symmetric
    per-token int8."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from export.variants import quantize_dynamic_graph

    model = AutoModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    dense = model.encoder.layer[-1].output.dense
    seen = []
    handle = dense.register_forward_hook(lambda module, args, out: seen.append(args[0].detach()))
    texts = ["A quiet film about a noisy city.", "The results were reported on Tuesday in Geneva, Switzerland."]
    with torch.no_grad():
        model(**tokenizer(texts, padding=True, return_tensors="pt"))
    handle.remove()
    x = seen[0].numpy().astype(np.float32)
    w = dense.weight.detach().numpy().T.copy()
    graph = matmul_graph(w)
    exact = x @ w
    onnx.save(graph, str(tmp_path / "fp32.onnx"))
    quantize_dynamic_graph(tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx")
    (per_tensor,) = run(onnx.load(str(tmp_path / "dynamic.onnx")), {"x": x})
    (tokens,) = run(per_token(onnx.load(str(tmp_path / "fp32.onnx")), ["dense"], "asymmetric"), {"x": x})
    (symmetric,) = run(per_token(graph, ["dense"], "symmetric"), {"x": x})

    def error(y):
        return float(np.sqrt(np.mean((y - exact) ** 2) / np.mean(exact**2)))

    # GELU outputs run from -0.17 up: a symmetric row range leaves half its steps unused (why auto gives a GELU-fed
    # MatMul asymmetric rows); the row's own range beats one range for the whole tensor
    assert error(tokens) < 0.9 * error(per_tensor) and error(tokens) < 0.75 * error(symmetric)
