"""int8 with one activation scale per token: a graph transform for MatMuls with constant weights.

onnxruntime's dynamic quantisation (export/variants.py quantize_dynamic_graph) gives a whole activation tensor one
range per batch, so one token's outlier (a GELU tail, a [CLS] or [SEP] row an order of magnitude above the rest)
coarsens every other token's steps. Here each row of the activation (one token) gets its own scale, computed at run
time:

    s = max(|x|, over the row) / 127          (at least 1e-12)
    q = QuantizeLinear(x, s, 128), axis 0     uint8, zero point 128: symmetric, the row's own range (x seen as
                                              rows of k: one pass, no x / s tensor)
    y = MatMulIntegerToFloat(q, Wq, s, ws, 128)   com.microsoft; s has shape [..., 1]: one scale per row

with the weight int8 per output channel (ws, shape [N]). MatMulInteger takes one zero point per tensor for its first
input only, so an asymmetric row (its own zero point) is computed as the symmetric one plus a correction:
q = round(x / s) - round(min / s) in 0..255 with zero point 0, and y += s * round(min / s) * colsum(W dequantised).

A few input channels of a BERT hidden state run far above the rest and still set every row's step. With `outliers`
(node -> channels) those channels are zeroed in the int8 product's input and their own product is added back in fp32:

    y = per_token(x * inlier_mask) + Gather(x, channels) @ W[channels]

Measured figures: docs/export.md, "int8: per-token activations" and "int8: outlier channels".
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODES = ("auto", "symmetric", "asymmetric")
# auto: asymmetric for a MatMul fed by a GELU (outputs from -0.17 up: a symmetric range would leave half the steps
# unused), symmetric elsewhere (LayerNorm and attention outputs straddle zero; two reductions fewer)
GELU_OPS = ("BiasGelu", "FastGelu", "Gelu")  # as fused by onnxruntime
SCHEME = "uint8, one scale per row: per token of each text, never shared across the texts of a batch"
# The rows of the default search's graphs (export/sensitivity.py), measured and written alike: each row its own range
# and zero point. Its two reductions a row cost the all-int8 graph a few percent against "auto", and the search then
# keeps far fewer groups fp32 for the same agreement (docs/export.md, "int8: asymmetric rows").
SEARCH_ROWS = "asymmetric"
# --precision auto searches once more with `auto` rows and times both graphs: where both keep the same groups fp32,
# auto's cheaper rows win (docs/export.md, "int8: which rows, by timing").
AUTO_ROWS = (SEARCH_ROWS, "auto")


class PerTokenError(ValueError):
    """A node the transform cannot rewrite was asked for: the graph is left as it was (export/cli.py: exit 2)."""


def rewritable(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes `per_token` can rewrite: MatMuls whose weight is a constant 2-D float matrix, and fused
    Attention nodes (onnxruntime's BERT fusion: input, constant QKV weight and bias, optional mask index)."""
    weights = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    return [n.name for n in model.graph.node if _refusal(n, weights) is None]


def _refusal(node: onnx.NodeProto, weights: set[str]) -> str | None:
    """Why `node` cannot be rewritten, or None."""
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
        if len(node.input) != 2 or node.input[1] not in weights:
            return "a MatMul whose second input is not a constant 2-D float weight"
        return None
    if node.op_type == "Attention" and node.domain == "com.microsoft":
        attributes = {a.name for a in node.attribute}
        if len(node.input) < 3 or node.input[1] not in weights or not node.input[2]:
            return "an Attention whose QKV weight is not a constant 2-D float matrix with a bias"
        if len(node.input) > 4 or len(node.output) != 1 or attributes - {"num_heads", "mask_filter_value"}:
            return "an Attention with inputs or attributes beyond input, weights, bias, mask index and num_heads"
        return None
    return f"a {node.op_type}"


QK = "/qk"  # NAME/qk: the query and key projections of the fused Attention NAME; its value projection stays fp32


def unfuse_attention(model: onnx.ModelProto, names, split_value=()) -> onnx.ModelProto:
    """Replace each fused Attention `names` by MatMul (input x QKV weight, named NAME/qkv) -> Split into Q, K, V ->
    com.microsoft MultiHeadAttention (the QKV bias, the same mask index, num_heads): the same maths, with the QKV
    projection a plain MatMul that can be quantised per token. For the Attentions also in `split_value` the
    projection is two MatMuls, NAME/qk (query and key, then split) and NAME/v (value), so that the query and key can
    be quantised while the value, whose error reaches the output unsoftened, stays fp32. Outputs keep their names."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    wanted, split = set(names), set(split_value)
    nodes = []
    for node in graph.node:
        if node.name not in wanted:
            nodes.append(node)
            continue
        x, w, bias = node.input[:3]
        mask = node.input[3] if len(node.input) > 3 else ""
        hidden = weights[w].dims[1] // 3
        p = node.name
        kept = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attention = helper.make_node(
            "MultiHeadAttention",
            [f"{p}/q", f"{p}/k", f"{p}/v", bias] + ([mask] if mask else []),
            list(node.output),
            name=f"{p}/mha",
            domain="com.microsoft",
            **kept,
        )
        if p in split:
            packed = numpy_helper.to_array(weights[w])
            qk_weight = numpy_helper.from_array(np.ascontiguousarray(packed[:, : 2 * hidden]), f"{p}/qk_weight")
            v_weight = numpy_helper.from_array(np.ascontiguousarray(packed[:, 2 * hidden :]), f"{p}/v_weight")
            sizes = numpy_helper.from_array(np.array([hidden] * 2, np.int64), f"{p}/split_sizes")
            graph.initializer.extend([qk_weight, v_weight, sizes])
            nodes += [
                helper.make_node("MatMul", [x, qk_weight.name], [f"{p}/qk_out"], name=f"{p}{QK}"),
                helper.make_node("MatMul", [x, v_weight.name], [f"{p}/v"], name=f"{p}/v"),
                helper.make_node(
                    "Split", [f"{p}/qk_out", sizes.name], [f"{p}/q", f"{p}/k"], name=f"{p}/split", axis=-1
                ),
                attention,
            ]
            continue
        sizes = numpy_helper.from_array(np.array([hidden] * 3, np.int64), f"{p}/split_sizes")
        graph.initializer.append(sizes)
        nodes += [
            helper.make_node("MatMul", [x, w], [f"{p}/qkv_out"], name=f"{p}/qkv"),
            helper.make_node(
                "Split", [f"{p}/qkv_out", sizes.name], [f"{p}/q", f"{p}/k", f"{p}/v"], name=f"{p}/split", axis=-1
            ),
            attention,
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node of `graph` or of its subgraphs (If, Loop, Scan bodies) reads."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                names |= _read_names(sub)
    return names


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def per_token(model: onnx.ModelProto, names, mode: str = "auto", outliers=None) -> onnx.ModelProto:
    """Rewrite the MatMuls `names` of `model` (in place; returned) to int8 with per-token activation scales. The
    graph's inputs and outputs keep their names, types and shapes; each rewritten MatMul's output keeps its name.
    Raises PerTokenError, before changing anything, for a name that is not a node of the graph or a node that is not
    a MatMul with a constant 2-D float weight or a fused Attention (unfuse_attention; NAME/qk: only its query and key
    projections, the value's fp32). `mode`: symmetric rows (zero point 128), asymmetric rows (each row's own
    range), or auto (asymmetric where a GELU feeds the MatMul). `outliers`: name -> input channels that stay fp32
    (taken out of the int8 product, multiplied in fp32 and added back)."""
    if mode not in MODES:
        raise PerTokenError(f"per-token int8: mode must be one of {MODES}, got {mode!r}")
    names = list(dict.fromkeys(names))
    graph = model.graph
    by_name = {n.name: n for n in graph.node}
    initializers = {t.name: t for t in graph.initializer}
    opset = _opset(model)
    if opset < 13:
        raise PerTokenError(f"per-token int8 needs opset 13 or later (ReduceMax over the last axis), got {opset}")
    float_2d = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    # NAME/qk: a fused Attention's query and key projections alone
    query_key = {n: n[: -len(QK)] for n in names if n.endswith(QK) and n not in by_name}
    for name in names:
        node = by_name.get(query_key.get(name, name))
        if node is None:
            raise PerTokenError(f"per-token int8: no node named {name!r} in the graph")
        refusal = _refusal(node, float_2d)
        if name in query_key and node.op_type != "Attention":
            refusal = f"a {node.op_type} (NAME{QK} names a fused Attention's query and key projections)"
        if refusal:
            raise PerTokenError(
                f"per-token int8 cannot rewrite node {name!r}: it is {refusal}; only MatMuls with constant weights "
                "and fused Attention nodes"
            )
    outliers = {n: sorted({int(c) for c in channels}) for n, channels in (outliers or {}).items() if len(channels)}
    stray = sorted(set(outliers) - set(names))
    if stray:
        raise PerTokenError(f"per-token int8: outlier channels given for {stray[0]!r}, which is not rewritten")
    for name, channels in outliers.items():
        width = initializers[by_name[query_key.get(name, name)].input[1]].dims[0]
        if channels[0] < 0 or channels[-1] >= width:
            bad = channels[0] if channels[0] < 0 else channels[-1]
            raise PerTokenError(
                f"per-token int8: outlier channel {bad} of {name!r} is out of its {width} input channels"
            )
    both = sorted(set(query_key.values()) & set(names))
    if both:
        raise PerTokenError(f"per-token int8: {both[0]!r} is named both whole and as {both[0]}{QK}: name one of them")
    # a fused Attention becomes its QKV projection (a MatMul, rewritten below), a Split and MultiHeadAttention; for
    # NAME/qk its query and key projection (rewritten) and its value projection (left fp32)
    attention = [n for n in names if by_name.get(n) is not None and by_name[n].op_type == "Attention"]
    if attention or query_key:
        unfuse_attention(model, attention + list(query_key.values()), split_value=query_key.values())
        outliers = {f"{n}/qkv" if n in attention else n: c for n, c in outliers.items()}
        names = [f"{n}/qkv" if n in attention else n for n in names]
        by_name = {n.name: n for n in graph.node}
        initializers = {t.name: t for t in graph.initializer}
    weights = {name: numpy_helper.to_array(initializers[by_name[name].input[1]]) for name in names}

    added: list[onnx.TensorProto] = []

    def constant(name: str, value) -> str:
        added.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def reduce(op: str, x: str, out: str, prefix: str) -> onnx.NodeProto:
        if opset >= 18:  # axes became an input
            axes = constant(f"{prefix}/axes_{op}", np.array([-1], np.int64))
            return helper.make_node(op, [x, axes], [out], name=f"{prefix}/{op}", keepdims=1)
        return helper.make_node(op, [x], [out], name=f"{prefix}/{op}", axes=[-1], keepdims=1)

    def quantize_rows(x: str, scale: str, row_zero: str | None, k: int, prefix: str) -> list:
        """PREFIX/q = saturate(round(x / scale) + zero point), one scale (and zero point) per row, in one pass: x and
        its [..., 1] scales are viewed as k-wide rows and one scale per row (QuantizeLinear along axis 0), then q
        takes x's shape again. `row_zero` is the rows' uint8 zero points ([..., 1]); None: 128 for every row."""
        rows = constant(f"{prefix}/rows_shape", np.array([-1, k], np.int64))
        flat = constant(f"{prefix}/flat_shape", np.array([-1], np.int64))
        out = [
            helper.make_node("Reshape", [x, rows], [f"{prefix}/x_rows"], name=f"{prefix}/Rows"),
            helper.make_node("Reshape", [scale, flat], [f"{prefix}/row_scale"], name=f"{prefix}/RowScale"),
        ]
        if row_zero is None:
            out += [
                helper.make_node("Shape", [f"{prefix}/row_scale"], [f"{prefix}/row_count"], name=f"{prefix}/RowCount"),
                helper.make_node(
                    "ConstantOfShape",
                    [f"{prefix}/row_count"],
                    [f"{prefix}/row_zero_flat"],
                    name=f"{prefix}/RowZero",
                    value=numpy_helper.from_array(np.array([128], np.uint8)),
                ),
            ]
        else:
            out.append(
                helper.make_node("Reshape", [row_zero, flat], [f"{prefix}/row_zero_flat"], name=f"{prefix}/RowZeroFlat")
            )
        out += [
            helper.make_node(
                "QuantizeLinear",
                [f"{prefix}/x_rows", f"{prefix}/row_scale", f"{prefix}/row_zero_flat"],
                [f"{prefix}/q_rows"],
                name=f"{prefix}/Quantize",
                axis=0,
            ),
            helper.make_node("Shape", [x], [f"{prefix}/x_shape"], name=f"{prefix}/XShape"),
            helper.make_node(
                "Reshape", [f"{prefix}/q_rows", f"{prefix}/x_shape"], [f"{prefix}/q"], name=f"{prefix}/QShape"
            ),
        ]
        return out

    gelu_outputs = {o for n in graph.node if n.op_type in GELU_OPS for o in n.output}
    nodes = []
    for node in graph.node:
        if node.name not in weights:
            nodes.append(node)
            continue
        symmetric = mode == "symmetric" or (mode == "auto" and node.input[0] not in gelu_outputs)
        w = weights[node.name].astype(np.float32)
        p = f"{node.name}/per_token"
        x, y = node.input[0], node.output[0]
        channels = outliers.get(node.name)
        if channels:
            index = np.asarray(channels, np.int64)
            inlier = np.ones(w.shape[0], np.float32)
            inlier[index] = 0.0
            outlier_weight = w[index]
            w = w * inlier[:, None]
            nodes.append(
                helper.make_node(
                    "Mul", [x, constant(f"{p}/inlier_mask", inlier)], [f"{p}/inliers"], name=f"{p}/Inliers"
                )
            )
            tail = [
                helper.make_node(
                    "Gather",
                    [x, constant(f"{p}/outlier_index", index)],
                    [f"{p}/outliers"],
                    name=f"{p}/Outliers",
                    axis=-1,
                ),
                helper.make_node(
                    "MatMul",
                    [f"{p}/outliers", constant(f"{p}/outlier_weight", outlier_weight)],
                    [f"{p}/outlier_out"],
                    name=f"{p}/OutlierMatMul",
                ),
                helper.make_node("Add", [f"{p}/inlier_out", f"{p}/outlier_out"], [y], name=f"{p}/JoinOutliers"),
            ]
            x, y = f"{p}/inliers", f"{p}/inlier_out"
        else:
            tail = []
        w_scale = np.abs(w).max(axis=0) / 127.0
        w_scale[w_scale == 0] = 1.0  # an all-zero column: any scale gives zeros
        w_q = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
        wq = constant(f"{p}/weight_int8", w_q)
        ws = constant(f"{p}/weight_scale", w_scale.astype(np.float32))
        tiny = constant(f"{p}/tiny", np.array(1e-12, np.float32))
        if symmetric:
            zero_point = constant(f"{p}/zero_point", np.array(128, np.uint8))
            nodes += [
                helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
                reduce("ReduceMax", f"{p}/abs", f"{p}/max", p),
                helper.make_node(
                    "Mul", [f"{p}/max", constant(f"{p}/inv127", np.array(1 / 127, np.float32))], [f"{p}/s0"]
                ),
                helper.make_node("Max", [f"{p}/s0", tiny], [f"{p}/scale"], name=f"{p}/Scale"),
                *quantize_rows(x, f"{p}/scale", None, w.shape[0], p),
                helper.make_node(
                    "MatMulIntegerToFloat",
                    [f"{p}/q", wq, f"{p}/scale", ws, zero_point],
                    [y],
                    name=f"{p}/MatMulIntegerToFloat",
                    domain="com.microsoft",
                ),
                *tail,
            ]
            continue
        zero = constant(f"{p}/zero", np.array(0.0, np.float32))
        zero_point = constant(f"{p}/zero_point", np.array(0, np.uint8))
        column_sums = (w_q.astype(np.int64).sum(axis=0) * w_scale).astype(np.float32)
        nodes += [
            reduce("ReduceMax", x, f"{p}/max0", p),
            reduce("ReduceMin", x, f"{p}/min0", p),
            helper.make_node("Max", [f"{p}/max0", zero], [f"{p}/max"], name=f"{p}/Max"),
            helper.make_node("Min", [f"{p}/min0", zero], [f"{p}/min"], name=f"{p}/Min"),
            helper.make_node("Sub", [f"{p}/max", f"{p}/min"], [f"{p}/range"], name=f"{p}/Range"),
            helper.make_node(
                "Mul", [f"{p}/range", constant(f"{p}/inv255", np.array(1 / 255, np.float32))], [f"{p}/s0"]
            ),
            helper.make_node("Max", [f"{p}/s0", tiny], [f"{p}/scale"], name=f"{p}/Scale"),
            helper.make_node("Div", [f"{p}/min", f"{p}/scale"], [f"{p}/min_steps"], name=f"{p}/MinSteps"),
            helper.make_node("Round", [f"{p}/min_steps"], [f"{p}/offset"], name=f"{p}/Offset"),  # minus the zero point
            # the row's zero point, -offset, in 0..255: min / scale >= -255 since the range holds -min
            helper.make_node("Neg", [f"{p}/offset"], [f"{p}/row_zero_f"], name=f"{p}/RowZero"),
            helper.make_node(
                "Cast", [f"{p}/row_zero_f"], [f"{p}/row_zero"], name=f"{p}/RowZeroU8", to=TensorProto.UINT8
            ),
            *quantize_rows(x, f"{p}/scale", f"{p}/row_zero", w.shape[0], p),
            helper.make_node(
                "MatMulIntegerToFloat",
                [f"{p}/q", wq, f"{p}/scale", ws, zero_point],
                [f"{p}/product"],
                name=f"{p}/MatMulIntegerToFloat",
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [f"{p}/offset", f"{p}/scale"], [f"{p}/offset_value"], name=f"{p}/OffsetValue"),
            helper.make_node(
                "Mul", [f"{p}/offset_value", constant(f"{p}/column_sums", column_sums)], [f"{p}/correction"]
            ),
            helper.make_node("Add", [f"{p}/product", f"{p}/correction"], [y], name=f"{p}/Correct"),
            *tail,
        ]
    for i, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.output[0]}/node{i}"
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(added)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    # the fp32 weights the rewritten MatMuls alone read are dropped
    used = _read_names(graph) | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model
