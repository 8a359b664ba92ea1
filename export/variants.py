"""The ONNX files of an artifact: the portable graph (standard ONNX ops, TensorRT's input) and the
onnxruntime variants made from it: fused fp32, fused fp16, fused + int8 (per-row activation scales).
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from pathlib import Path

import onnx

from bert.config import BertConfig

from .pertoken import GELU_OPS

DEFAULT_OPSET = 17  # LayerNormalization is a standard op from 17 on; TensorRT 10 parses up to 20+
# Fused operators we count; Attention must appear once per layer or the export fails.
FUSED_OPERATORS = (
    "Attention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "LayerNormalization",
    "MultiHeadAttention",
)
# Kept in fp32 when converting to fp16: reductions whose range or accumulation fp16 cannot hold.
# (The fused SkipLayerNormalization/EmbedLayerNormalization/Attention kernels accumulate in fp32.)
FP16_OP_BLOCK_LIST = (
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "Softmax",
    "Pow",
    "ReduceMean",
    "Range",
    "CumSum",
    "TopK",
)


class FusionError(RuntimeError):
    """onnxruntime's optimizer did not fuse the graph as a BERT graph must be fused."""


def export_portable(
    wrapper, example_inputs, path: Path, *, input_names, output_names, dynamic_axes, opset: int = DEFAULT_OPSET
) -> Path:
    """torch -> ONNX with the TorchScript-based exporter (`dynamo=False`).

    Why not the default torch.export-based exporter: its graphs (torch 2.13, onnxruntime 1.31)
    do not match onnxruntime's BERT Attention fusion pattern, and that fusion is the point of
    the onnxruntime variant. The TorchScript exporter is deprecated but still shipped; the
    fusion check below fails loudly if a future exporter changes the graph.
    """
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        with torch.no_grad():
            torch.onnx.export(
                wrapper,
                tuple(example_inputs),
                str(path),
                dynamo=False,
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                do_constant_folding=True,
            )
    return path


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(node.op_type for node in model.graph.node))


def fused_operator_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = op_counts(model)
    return {op: counts.get(op, 0) for op in FUSED_OPERATORS}


def fuse(portable: Path, config: BertConfig):
    """onnxruntime's transformer optimizer, Python fusions only (opt_level=0), so the result is not
    tied to one execution provider. Returns the OnnxModel; raises FusionError if attention did not fuse."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_gelu_approximation = False  # keep exact erf GELU: parity with torch
    # EmbedLayerNormalization computes positions 0..T-1 itself: a family whose positions start elsewhere
    # (RoBERTa's, after the pad id) keeps its embeddings unfused (docs/export.md, "Model families").
    options.enable_embed_layer_norm = embed_fusion(config)
    optimized = optimizer.optimize_model(
        str(portable),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        optimization_options=options,
        opt_level=0,
    )
    check_fusion(fused_operator_counts(optimized.model), config)
    return optimized


def embed_fusion(config: BertConfig) -> bool:
    return config.position_offset == 0 and config.position_table


def bert_shaped(config: BertConfig) -> bool:
    """Whether onnxruntime's BERT fusions have a pattern for this encoder: post-norm blocks with plain
    query/key/value attention. Rotary positions, disentangled (relative) attention, windowed masks, pre-norm blocks and gated MLPs have none;
    such graphs keep those parts as standard ops (the counts recorded say which fusions applied)."""
    family = config.family
    return not (
        config.rope_theta is not None
        or config.relative_attention
        or config.layer_types
        or family.pre_norm
        or family.gated_mlp
        or family.qkv_projection
    )


def check_fusion(counts: dict[str, int], config: BertConfig) -> None:
    if not bert_shaped(config):
        return
    layers = config.num_hidden_layers
    expected = {
        "Attention": layers,
        "SkipLayerNormalization": 2 * layers,
        "EmbedLayerNormalization": 1 if embed_fusion(config) else 0,
    }
    wrong = {op: (counts.get(op, 0), n) for op, n in expected.items() if counts.get(op, 0) != n}
    if wrong:
        detail = ", ".join(f"{op} {got} (expected {want})" for op, (got, want) in wrong.items())
        raise FusionError(
            f"onnxruntime did not fuse the graph as a {layers}-layer BERT: {detail}; "
            f"all counts {counts}. The exported attention or embedding pattern changed "
            "(see export/wrapper.py prepare_for_export)."
        )


def to_fp16(fused):
    """Fused fp32 OnnxModel -> fp16 weights and compute, inputs/outputs unchanged (int64 in, fp32 out). What does
    not depend on the inputs stays fp32 (input_independent_nodes)."""
    kept = input_independent_nodes(fused.model)
    fused.convert_float_to_float16(
        use_symbolic_shape_infer=True,
        keep_io_types=True,
        op_block_list=list(FP16_OP_BLOCK_LIST),
        **({"node_block_list": kept} if kept else {}),
    )
    return fused


def input_independent_nodes(model: onnx.ModelProto) -> list[str]:
    """Computing nodes none of whose inputs depend on a graph input: arithmetic on weights alone (DeBERTa's
    relative-position embeddings, normalised and projected per layer). Kept fp32, onnxruntime folds them into
    constants when a session starts; converted to fp16 they are Gemms its CPU provider has no kernel to fold
    with, and session creation crashed on them (onnxruntime 1.32, ORT_ENABLE_ALL). A BERT graph has none."""
    dependent = {i.name for i in model.graph.input}
    kept = []
    for node in model.graph.node:  # topologically ordered
        if any(name in dependent for name in node.input):
            dependent.update(node.output)
        elif node.input:
            kept.append(node.name)
    return kept


INT8_SCOPES = ("auto", "skip-ffn-output", "all")


def ffn_output_matmuls(model: onnx.ModelProto) -> list[str]:
    """Each layer's feed-forward output projection in a fused graph: the MatMul fed by the GELU. Its input (GELU
    activations, a long positive tail) loses most under per-tensor activation quantisation."""
    producer = {out: node for node in model.graph.node for out in node.output}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and n.input[0] in producer and producer[n.input[0]].op_type in GELU_OPS
    ]


WEIGHT_ONLY = {"Gather": 0, "EmbedLayerNormalization": 2}  # int8 tables dequantised as read: no activation scale


def weight_only_nodes(model: onnx.ModelProto) -> list[str]:
    """Embedding lookups whose table is a float initializer: quantised, they read int8 rows and need no activation
    scale, so their answers cannot depend on the batch."""
    tables = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return [
        n.name
        for n in model.graph.node
        if n.op_type in WEIGHT_ONLY
        and len(n.input) > WEIGHT_ONLY[n.op_type]
        and n.input[WEIGHT_ONLY[n.op_type]] in tables
    ]


def quantize_int8(
    fused_path: Path,
    out_path: Path,
    scope: str = "skip-ffn-output",
    excluded=None,
    per_token_nodes=(),
    outliers=None,
    rows: str | None = None,
) -> dict:
    """int8 for CPU on the fused graph: int8 weights per output channel, and each activation row (one token of one
    text) quantised with its own scale at run time (export/pertoken.py), so a text's answer is the same whatever
    batch it rides in. onnxruntime's dynamic quantisation would give a whole batch one activation scale: one text's
    outlier would then coarsen every other text's steps (docs/export.md, "int8: batch-invariant answers"). The
    embedding tables are int8 too (weights only); what per_token cannot rewrite (Gemm heads) stays fp32.

    Scope "all" quantises every MatMul and fused Attention; "skip-ffn-output" keeps each layer's FFN output
    projection fp32 (its input, the GELU output, has a long tail); "auto" keeps `excluded` fp32 and quantises
    `per_token_nodes`, the nodes export/sensitivity.py's search chose, with `outliers` (node -> input channels) fp32
    beside the int8 product. Rows (export/pertoken.py's modes): `rows`, else scope auto's the search's default
    (SEARCH_ROWS; give the mode the search measured with) and the other scopes' "auto" (what --int8-distill's fake
    quantisation computes). Returns what was done, for the manifest."""
    from . import pertoken
    from .pertoken import SCHEME, rewritable

    if scope not in INT8_SCOPES:
        raise ValueError(f"int8 scope must be one of {INT8_SCOPES}, got {scope!r}")
    rows = rows or (pertoken.SEARCH_ROWS if scope == "auto" else "auto")
    graph = onnx.load(str(fused_path), load_external_data=False)
    if scope == "skip-ffn-output":
        excluded = ffn_output_matmuls(graph)
    elif scope == "all":
        excluded = []
    elif excluded is None:
        raise ValueError("int8 scope auto needs the nodes to keep fp32 (export/sensitivity.py)")
    # weights-only arithmetic is folded into constants at session start: quantised it would only lose digits
    excluded = list(excluded) + input_independent_nodes(graph)
    if per_token_nodes and scope != "auto":
        raise ValueError("the nodes to quantise are given with int8 scope auto only")
    kept = set(excluded)
    if scope != "auto":
        per_token_nodes = rewritable(graph)
    per_token_nodes = [n for n in per_token_nodes if n not in kept]
    tables = [n for n in weight_only_nodes(graph) if n not in kept]
    del graph
    if tables:
        quantize_dynamic_graph(fused_path, out_path, only=tables)
        quantized = onnx.load(str(out_path))
    else:
        quantized = onnx.load(str(fused_path))
    if per_token_nodes:
        from .pertoken import per_token

        channels = {n: c for n, c in (outliers or {}).items() if n in per_token_nodes}
        per_token(quantized, per_token_nodes, rows, outliers=channels)
    split = split_skip_layer_norm(quantized)
    save(quantized, out_path)
    return {
        "method": "per-row",
        "weights": "int8 per channel",
        "activations": SCHEME,
        "row_mode": rows,
        "batch_invariant": True,
        "scope": scope,
        "fp32_nodes": list(excluded),
        "per_token_nodes": list(per_token_nodes),
        "outlier_channels": {n: list(c) for n, c in (outliers or {}).items() if n in per_token_nodes},
        "skip_layer_norms_split": split,
    }


def quantize_dynamic_graph(fused_path: Path, out_path: Path, *, exclude=(), only=None) -> None:
    """int8 per-channel weights, activations quantised per batch at run time (onnxruntime's quantize_dynamic)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it warns on the root logger about pre-processing that BERT does not need
    try:
        # Shape inference cannot type the outputs of com.microsoft ops; they are all float here.
        quantize_dynamic(
            str(fused_path),
            str(out_path),
            weight_type=QuantType.QInt8,
            per_channel=True,
            nodes_to_quantize=list(only) if only is not None else None,
            nodes_to_exclude=list(exclude),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.setLevel(level)


def split_skip_layer_norm(model: onnx.ModelProto) -> int:
    """Replace each fused SkipLayerNormalization by Add (+ Add for its bias) and the standard
    LayerNormalization (opset >= 17; otherwise the graph is left as it is). On CPU, onnxruntime runs the
    pair faster than its fused kernel (docs/export.md, "LayerNorm on CPU"): the fp32 and int8 graphs are
    split, the fp16 one (for GPUs) is not. Returns how many were split."""
    from onnx import helper

    if next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0) < 17:
        return 0
    nodes, split = [], 0
    for node in model.graph.node:
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft":
            nodes.append(node)
            continue
        split += 1
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        inputs = list(node.input) + [""] * (5 - len(node.input))
        x, skip, gamma, beta, bias = inputs[:5]
        total = f"{node.name}/sum"
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{node.name}/add"))
        if bias:
            nodes.append(helper.make_node("Add", [total, bias], [f"{total}_bias"], name=f"{node.name}/add_bias"))
            total = f"{total}_bias"
        outputs = list(node.output) + [""] * (4 - len(node.output))
        norm_outputs = outputs[:3]
        while not norm_outputs[-1]:
            norm_outputs.pop()
        nodes.append(
            helper.make_node(
                "LayerNormalization",
                [total, gamma] + ([beta] if beta else []),
                norm_outputs,
                name=f"{node.name}/layer_norm",
                axis=-1,
                epsilon=eps,
            )
        )
        if outputs[3]:  # the optional input + skip (+ bias) sum
            nodes.append(helper.make_node("Identity", [total], [outputs[3]], name=f"{node.name}/sum_out"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return split


def save(model_or_onnx_model, path: Path) -> Path:
    """Save a ModelProto or OnnxModel; weights over 2 GB go to one external data file next to it."""
    proto = getattr(model_or_onnx_model, "model", model_or_onnx_model)
    domains = {node.domain for node in proto.graph.node if node.domain}
    for domain in domains - {o.domain for o in proto.opset_import}:
        proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))  # fused ops: com.microsoft v1
    large = proto.ByteSize() > 1_800_000_000 if _byte_size_ok(proto) else True
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        location=data_file(path).name if large else None,
    )
    return path


def data_file(path: Path) -> Path:
    """Where `save` puts a large graph's weights: beside it, named after it."""
    return path.with_name(path.name + ".data")


def move(src: Path, dst: Path) -> Path:
    """Rename a graph `save` wrote to `dst`, replacing what was there; a large graph's weights file moves with it
    (the graph names that file, so the name inside is rewritten)."""
    for old in (dst, data_file(dst)):
        old.unlink(missing_ok=True)
    if not data_file(src).exists():
        return src.rename(dst)
    proto = onnx.load_model(str(src), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_file(dst).name
    data_file(src).rename(data_file(dst))
    onnx.save_model(proto, str(dst))
    src.unlink()
    return dst


def _byte_size_ok(proto) -> bool:
    try:
        proto.ByteSize()
        return True
    except Exception:  # protobuf refuses to size messages over 2 GB
        return False
