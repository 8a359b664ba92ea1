"""Sensitivity-guided int8: keep in fp32 only the fewest MatMuls that bring the quantised graph's answers to the
agreement target with fp32, measured on calibration text (docs/export.md, "int8: what stays fp32").

Steps, each a quantised graph run on the calibration batches (bounded by `trials`):
1. everything quantised: if it meets the target, nothing stays fp32;
2. each group of MatMuls of the layers (one layer's attention, attention output, FFN input, FFN output) quantised
   alone: how far it moves the outputs from fp32 (relative RMS error), its sensitivity;
3. a binary search for the fewest most-sensitive groups that, kept fp32, meet the target; the embeddings and the
   heads (CHEAP: int8 saves next to no time there) are kept fp32 first, before any layer's group;
4. of the layers' groups kept fp32, the most that meet the target per token with their outlier input channels (the
   highest calibration peaks, one in OUTLIER_SHARE) kept fp32 beside the int8 product (export/pertoken.py);
5. of the attention groups still kept fp32, the most that meet the target with their query and key per token and
   their value fp32. Steps 4 and 5 try all first, then binary-search from the least sensitive.

Agreement is what a user of the task sees: labels (classify, ner, zero-shot), the top position (qa's start and
end) or the top text of a query (rerank), the first predicted token (fill-mask), cosine >= 0.99 (embeddings).
A small calibration set cannot show a 0.5 % flip rate, so each score vector's fp32 margin (best minus runner-up)
is also set against every row's change of that margin under int8: the share of (change, margin) pairs where
the change reaches the margin estimates the flip rate on text like the calibration text. The lower of the
observed and the estimated agreement is what the target is held to.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from . import pertoken
from .pertoken import QK, SCHEME, rewritable
from .samples import (
    CALIBRATION_QA,
    CALIBRATION_SENTENCES,
    QUESTION_CONTEXTS,
    SENTENCES,
    ZERO_SHOT_LABELS,
    ZERO_SHOT_TEMPLATE,
)

COSINE = 0.99  # an embedding agrees when its cosine with fp32 reaches this
# A few dozen calibration inputs under-sample both the tail of int8's changes and the small margins of held-out
# text: each change counts twice its size when set against the margins (docs/export.md, "int8: what stays fp32").
CHANGE_SAFETY = 2.0
# An embedding counts in the estimate when its distance from fp32 (1 - cosine) is at most half of what COSINE
# allows: the calibration rows stand for many more held-out rows, so a row near the bound is a warning.
COSINE_ESTIMATE_SHARE = 0.5
QUANTISABLE = ("MatMul", "Attention", "Gemm", "EmbedLayerNormalization", "Gather")
WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Attention": 1, "Gather": 0, "EmbedLayerNormalization": 2}
KINDS = ("embeddings", "attention", "attention-output", "ffn-in", "ffn-out", "other")
# how the quantised MatMuls' activations are scaled: one scale per token (row), what the export writes, or per tensor
# (onnxruntime's dynamic quantisation, one scale for the whole batch), kept for comparison
# (docs/export.md, "int8: batch-invariant answers")
SCHEMES = ("per-token", "per-tensor")
# Groups whose integer kernels save next to no time (a gather of embedding rows; the pooler and the heads, one small
# MatMul each) but whose int8 weights move every answer: kept fp32 before any layer's group (docs/export.md).
CHEAP = ("embeddings", "head")
# A MatMul quantised with outliers keeps one input channel in OUTLIER_SHARE fp32 (8 of a 384-wide hidden state): those
# whose calibration peaks are highest. A few channels of a BERT hidden state run an order of magnitude above the
# rest and set every token's int8 step; taken out, the step fits the others (docs/export.md, "int8: outlier channels").
OUTLIER_SHARE = 48


# ---------------------------------------------------------------------------------------------- calibration
@dataclass
class Calibration:
    """Padded input batches by set; `ranked` sets hold one query (its candidate pairs) per batch."""

    batches: dict[str, list[dict[str, np.ndarray]]] = field(default_factory=dict)

    def size(self) -> dict[str, int]:
        return {name: sum(len(b["input_ids"]) for b in batches) for name, batches in self.batches.items()}

    def flat(self) -> list[tuple[str, int, dict[str, np.ndarray]]]:
        return [(name, i, b) for name, batches in self.batches.items() for i, b in enumerate(batches)]


def _sentence_items(extra):
    texts = [(t,) for t in (*SENTENCES, *CALIBRATION_SENTENCES, *extra["sentences"])]
    return [texts, list(extra["pairs"])]  # texts, then pairs: each batch is of one arity


def _question_context_items(extra):
    return [[*QUESTION_CONTEXTS, *CALIBRATION_QA, *extra["pairs"]]]


def _ranked_group_items(extra):
    from bert.tasks.rerank import sentence_spans

    contexts = [c for _, c in QUESTION_CONTEXTS]
    groups = [[(q, c) for c in contexts] for q, _ in QUESTION_CONTEXTS]
    groups += [[(q, context[a:b]) for a, b in sentence_spans(context)] for q, context in CALIBRATION_QA]
    return [group for group in (*groups, *extra["groups"]) if len(group) > 1]


def _hypothesis_items(extra):
    groups = [[(s, ZERO_SHOT_TEMPLATE.format(label)) for label in ZERO_SHOT_LABELS] for s in SENTENCES]
    return [group for group in (*groups, *extra["groups"]) if group]


@dataclass(frozen=True)
class CalibrationSet:
    """One set of calibration inputs a task declares it is judged on (`Task.calibration` names it): `items(extra)`
    gives its inputs from the shipped samples and a --calibration file's, as lists of same-arity tuples that are
    batched `batch_size` at a time, or (`ranked`) as one query's candidate pairs per batch; `takes` says which of
    the file's kinds of input ("sentences", "pairs", "groups") it reads."""

    items: Callable[[dict], list]
    takes: tuple[str, ...]
    ranked: bool = False


# Rerank's queries are each ranked against every short context and, for the long contexts, against the sentences
# of their own paragraph (as a reranker is asked); a zero-shot text against each label's hypothesis.
CALIBRATION_SETS = {
    "sentences": CalibrationSet(_sentence_items, ("sentences", "pairs")),
    "question_contexts": CalibrationSet(_question_context_items, ("pairs",)),
    "ranked_groups": CalibrationSet(_ranked_group_items, ("groups",), ranked=True),
    "hypotheses": CalibrationSet(_hypothesis_items, ("groups",), ranked=True),
}
RANKED_GROUP_MAX = 64  # candidates of one query in one batch


def build_calibration(
    tokenizer, needed: set[str], max_seq: int, extra: dict[str, list] | None = None, batch_size: int = 8
) -> Calibration:
    """The shipped samples (export/samples.py: the parity samples and the calibration-only ones) plus a
    --calibration file's inputs, for the sets `needed` (CALIBRATION_SETS' names)."""
    unknown = sorted(set(needed) - set(CALIBRATION_SETS))
    if unknown:
        raise ValueError(f"no calibration set named {unknown}; the sets are {sorted(CALIBRATION_SETS)}")
    extra = extra or {"sentences": [], "pairs": [], "groups": []}
    keys = ("input_ids", "attention_mask", "token_type_ids")

    def encode(rows):
        columns = [list(column) for column in zip(*rows)]
        truncation = True if len(columns) == 1 else "longest_first"
        encoded = tokenizer(*columns, max_length=max_seq, truncation=truncation)
        return {k: np.asarray(encoded[k], dtype=np.int64) for k in keys}

    calibration = Calibration()
    for name in CALIBRATION_SETS:
        if name not in needed:
            continue
        made = CALIBRATION_SETS[name]
        if made.ranked:
            calibration.batches[name] = [encode(group[:RANKED_GROUP_MAX]) for group in made.items(extra)]
        else:
            calibration.batches[name] = [
                encode(rows[i : i + batch_size]) for rows in made.items(extra) for i in range(0, len(rows), batch_size)
            ]
    return calibration


def unused_calibration(extra: dict[str, list] | None, built: set[str]) -> str:
    """What of a --calibration file's inputs no calibration set `built` takes (CALIBRATION_SETS' `takes`), in
    words ("3 texts, 2 ranked groups"), or ""."""
    extra = extra or {}
    taken = {kind for name in built for kind in CALIBRATION_SETS[name].takes}
    words = {"sentences": "text", "pairs": "text pair", "groups": "ranked group"}
    left = [
        f"{len(extra[k])} {words[k]}{'s' if len(extra[k]) != 1 else ''}"
        for k in words
        if extra.get(k) and k not in taken
    ]
    return ", ".join(left)


# ------------------------------------------------------------------------------------------------ agreement
@dataclass
class OutputAgreement:
    kind: str  # labels | positions | ranked | ids | cosine | none
    observed: float | None
    estimated: float | None
    relative_rms: float
    rows: int

    @property
    def value(self) -> float | None:
        values = [v for v in (self.observed, self.estimated) if v is not None]
        return min(values) if values else None


def _vectors(kind: str, value: np.ndarray, mask: np.ndarray, token_level: bool) -> list[np.ndarray]:
    """The score vectors whose argmax is the answer: per row (labels of a sequence), per real token (labels of a
    token), over a row's real tokens (positions), over a batch's rows (ranked: one query's texts)."""
    if kind == "ranked":
        return [value.reshape(len(value), -1)[:, 0]]
    if kind == "positions":
        return [row[m.astype(bool)] for row, m in zip(value, mask)]
    rows = value[mask.astype(bool)] if token_level else value
    return list(rows.reshape(len(rows), -1)) if rows.ndim > 1 else [rows]


def _margins_and_changes(refs: list[np.ndarray], cands: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per score vector: fp32's margin (best minus runner-up), and the signed change under int8 of the best's lead
    over its closest challenger (the most negative change of best minus any other); and how many kept their best."""
    margins, changes, agree = [], [], 0
    for r, c in zip(refs, cands):
        if r.size < 2:
            continue
        top = int(r.argmax())
        agree += int(c.argmax() == top)
        lead_r, lead_c = r[top] - r, c[top] - c
        others = np.arange(r.size) != top
        margins.append(float(lead_r[others].min()))
        changes.append(float((lead_c - lead_r)[others].min()))
    return np.asarray(margins), np.asarray(changes), agree


def estimated_agreement(margins: np.ndarray, changes: np.ndarray) -> float:
    """1 - P(a row's change of lead, times CHANGE_SAFETY, takes away another row's margin), over every (change,
    margin) pair."""
    if not margins.size:
        return 1.0
    ordered = np.sort(margins)
    # a change d flips a row of margin m when d <= -m, i.e. m <= -d: count the margins at most -d
    flips = np.searchsorted(ordered, -CHANGE_SAFETY * changes, side="right").sum()
    return 1.0 - float(flips) / (margins.size * changes.size)


def agreement(
    reference: list[dict[str, np.ndarray]],
    candidate: list[dict[str, np.ndarray]],
    batches: list[dict[str, np.ndarray]],
    kind: str,
    name: str,
    token_level: bool,
) -> OutputAgreement:
    diffs, refs_all = [], []
    ref_vectors, cand_vectors, cosines = [], [], []
    for ref, cand, batch in zip(reference, candidate, batches):
        r, c, mask = ref[name], cand[name], batch["attention_mask"]
        valid = mask.astype(bool)
        if kind != "ids":
            rv = r[valid] if token_level else r
            cv = c[valid] if token_level else c
            diffs.append((rv - cv).ravel())
            refs_all.append(rv.ravel())
        if kind in ("labels", "positions", "ranked"):
            ref_vectors += _vectors(kind, r, mask, token_level)
            cand_vectors += _vectors(kind, c, mask, token_level)
        elif kind == "ids":
            rv, cv = r[valid], c[valid]
            ref_vectors.append((rv[..., 0] == cv[..., 0]).ravel())
        elif kind == "cosine":
            rv = (r[valid] if token_level else r).reshape(-1, r.shape[-1]).astype(np.float64)
            cv = (c[valid] if token_level else c).reshape(-1, c.shape[-1]).astype(np.float64)
            norms = np.linalg.norm(rv, axis=1) * np.linalg.norm(cv, axis=1)
            cosines.append((rv * cv).sum(1) / np.maximum(norms, 1e-12))
    error = 0.0
    if diffs:
        diff, ref_all = np.concatenate(diffs).astype(np.float64), np.concatenate(refs_all).astype(np.float64)
        scale = float(np.sqrt(np.mean(ref_all**2))) or 1.0
        error = float(np.sqrt(np.mean(diff**2))) / scale
    if kind in ("labels", "positions", "ranked"):
        margins, changes, agree = _margins_and_changes(ref_vectors, cand_vectors)
        if not margins.size:  # one score per row: nothing to rank (a single-logit head judged as labels)
            return OutputAgreement(kind, None, None, error, 0)
        return OutputAgreement(kind, agree / margins.size, estimated_agreement(margins, changes), error, margins.size)
    if kind == "ids":
        same = np.concatenate(ref_vectors) if ref_vectors else np.zeros(0, dtype=bool)
        observed = float(same.mean()) if same.size else None
        return OutputAgreement(kind, observed, observed, error, int(same.size))
    if kind == "cosine":
        cos = np.concatenate(cosines)
        strict = 1 - (1 - COSINE) * COSINE_ESTIMATE_SHARE
        return OutputAgreement(kind, float((cos >= COSINE).mean()), float((cos >= strict).mean()), error, cos.size)
    return OutputAgreement(kind, None, None, error, 0)


# ------------------------------------------------------------------------------------------------ the groups
@dataclass(frozen=True)
class Group:
    label: str  # "layer 3 ffn-out", "embeddings", "head"
    nodes: tuple[str, ...]


def quantisable_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes dynamic quantisation would turn into integer kernels: those whose weight is an initializer."""
    initializers = {t.name for t in model.graph.initializer}
    return [
        n
        for n in model.graph.node
        if n.op_type in QUANTISABLE
        and len(n.input) > WEIGHT_INPUT[n.op_type]
        and n.input[WEIGHT_INPUT[n.op_type]] in initializers
    ]


LAYER = re.compile(r"layers?[./_](\d+)[./_]")


def node_kind(node: onnx.NodeProto, ffn_outputs: set[str]) -> str:
    name = node.name.lower()
    if node.op_type in ("Gather", "EmbedLayerNormalization") or "embeddings" in name:
        return "embeddings"
    if node.name in ffn_outputs:
        return "ffn-out"
    if node.op_type == "Attention" or re.search(r"attention/self|/(query|key|value)/|wqkv", name):
        return "attention"
    if re.search(r"attention/output|attn/wo|attn\.wo", name):
        return "attention-output"
    if re.search(r"intermediate|mlp/wi|mlp\.wi", name):
        return "ffn-in"
    if re.search(r"/output/dense|mlp/wo|mlp\.wo", name):
        return "ffn-out"
    return "other"


def groups_of(model: onnx.ModelProto, budget: int) -> list[Group]:
    """One group per layer and kind, or coarser (per layer, then runs of layers) until a search fits `budget`."""
    from .variants import ffn_output_matmuls

    ffn_outputs = set(ffn_output_matmuls(model))
    attention_index = 0
    units: dict[tuple, list[str]] = {}
    for node in quantisable_nodes(model):
        kind = node_kind(node, ffn_outputs)
        match = LAYER.search(node.name + "/")
        layer = int(match.group(1)) if match else None
        if node.op_type == "Attention":  # fused nodes are named Attention_0, _1, ... in graph order
            layer, attention_index = attention_index, attention_index + 1
        if kind == "embeddings" or layer is None:
            key = (None, "embeddings" if kind == "embeddings" else "head")
        else:
            key = (layer, kind)
        # dynamic quantisation rewrites a Gemm as MatMul + Add first; the MatMul is the node it then sees
        units.setdefault(key, []).append(node.name + "_MatMul" if node.op_type == "Gemm" else node.name)

    def cost(n: int) -> int:
        return 1 + n + math.ceil(math.log2(n + 1))

    layered = sorted(k for k in units if k[0] is not None)
    loose = [k for k in units if k[0] is None]
    fine = [
        Group(f"layer {k[0]} {k[1]}", tuple(units[k])) for k in sorted(layered, key=lambda k: (k[0], KINDS.index(k[1])))
    ]
    fine += [Group(k[1], tuple(units[k])) for k in loose]
    if cost(len(fine)) <= budget:
        return fine
    layers = sorted({k[0] for k in layered})
    per_chunk = 1
    while cost(math.ceil(len(layers) / per_chunk) + len(loose)) > budget and per_chunk < len(layers):
        per_chunk += 1
    coarse = []
    for start in range(0, len(layers), per_chunk):
        chunk = layers[start : start + per_chunk]
        nodes = tuple(n for k in layered if k[0] in chunk for n in units[k])
        label = f"layer {chunk[0]}" if len(chunk) == 1 else f"layers {chunk[0]}-{chunk[-1]}"
        coarse.append(Group(label, nodes))
    return coarse + [Group(k[1], tuple(units[k])) for k in loose]


def judge(
    reference: list[dict[str, np.ndarray]],
    candidate: list[dict[str, np.ndarray]],
    calibration: Calibration,
    judged: dict[str, tuple[str, bool, str]],
) -> tuple[float | None, float, dict[str, OutputAgreement]]:
    """A candidate's outputs on the calibration batches against fp32's: (the lowest agreement of its outputs, the
    sum of their relative RMS errors, each output's figures); each output is judged on its own calibration set."""
    flat = calibration.flat()
    outputs = {}
    for name, (kind, token_level, judged_on) in judged.items():
        chosen = [i for i, (s, _, _) in enumerate(flat) if s == judged_on]
        outputs[name] = agreement(
            [reference[i] for i in chosen],
            [candidate[i] for i in chosen],
            [flat[i][2] for i in chosen],
            kind,
            name,
            token_level,
        )
    values = [a.value for a in outputs.values() if a.value is not None]
    return (min(values) if values else None), sum(a.relative_rms for a in outputs.values()), outputs


# ----------------------------------------------------------------------------------------------- the search
@dataclass
class Trial:
    what: str
    excluded: tuple[str, ...]
    agreement: float | None
    error: float
    outputs: dict[str, OutputAgreement]


def run_graph(path: Path, calibration: Calibration, output_names: list[str]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}
    results = []
    for _, _, batch in calibration.flat():
        values = sess.run(output_names, {k: v for k, v in batch.items() if k in inputs})
        results.append({n: np.asarray(v) for n, v in zip(output_names, values)})
    return results


def scheme_of_nodes(model: onnx.ModelProto, nodes, scheme: str) -> dict[str, str]:
    """Node -> how it is quantised, for the nodes `nodes` that can be: "per-token" (export/pertoken.py: the MatMuls
    with constant weights and the fused Attentions, unfused so that their QKV projection is such a MatMul) or
    "per-tensor" (onnxruntime's dynamic quantisation, one activation scale for the whole batch), with `scheme`
    per-token "weights-only" for the embedding tables (int8 rows read without an activation scale). A node left out stays fp32: a Gemm head, whose dynamic quantisation
    would give the batch one activation scale (docs/export.md, "int8: batch-invariant answers")."""
    from .variants import weight_only_nodes

    if scheme not in SCHEMES:
        raise ValueError(f"int8 scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme == "per-tensor":
        return {n: "per-tensor" for n in nodes}
    per_token, tables = set(rewritable(model)), set(weight_only_nodes(model))
    return {n: "per-token" if n in per_token else "weights-only" for n in nodes if n in per_token | tables}


def build_int8(
    fused_path: Path, out_path: Path, schemes: dict[str, str], outliers=None, rows: str | None = None
) -> Path:
    """The fused graph with each node of `schemes` quantised as it says (per-tensor first, by onnxruntime's
    quantize_dynamic, which leaves the other nodes as they are; then per-token, with `outliers`: node -> input
    channels kept fp32, `rows` export/pertoken.py's row mode, default SEARCH_ROWS); every other node stays fp32."""
    from .pertoken import per_token
    from .variants import quantize_dynamic_graph, save

    dynamic = [n for n, how in schemes.items() if how in ("per-tensor", "weights-only")]
    tokens = [n for n, how in schemes.items() if how == "per-token"]
    if dynamic:
        quantize_dynamic_graph(fused_path, out_path, only=dynamic)
        if not tokens:
            return out_path
        model = onnx.load(str(out_path))
    else:
        model = onnx.load(str(fused_path))
    channels = {n: c for n, c in (outliers or {}).items() if n in tokens}
    return save(per_token(model, tokens, rows or pertoken.SEARCH_ROWS, outliers=channels), out_path)


def outlier_channels(fused_path: Path, calibration: Calibration, nodes) -> dict[str, list[int]]:
    """Node -> the input channels (one in OUTLIER_SHARE, at least one) whose peak |x| over the calibration tokens
    (padding left out) is highest, in the fp32 graph."""
    from .variants import save

    model = onnx.load(str(fused_path))
    by_name = {n.name: n for n in model.graph.node}
    inputs = {n: by_name[n].input[0] for n in nodes}
    read = list(dict.fromkeys(inputs.values()))
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in read if name not in outputs
    )
    with tempfile.TemporaryDirectory(dir=fused_path.parent) as scratch:
        results = run_graph(save(model, Path(scratch) / "peaks.onnx"), calibration, read)
    del model
    peaks: dict[str, np.ndarray] = {}
    for (_, _, batch), result in zip(calibration.flat(), results):
        mask = batch["attention_mask"].astype(bool)
        for name, value in result.items():
            rows = value[mask] if value.shape[:2] == mask.shape else value.reshape(-1, value.shape[-1])
            peak = np.abs(rows).max(axis=0)
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    chosen = {}
    for node, name in inputs.items():
        count = max(1, round(len(peaks[name]) / OUTLIER_SHARE))
        chosen[node] = sorted(int(i) for i in np.argsort(-peaks[name], kind="stable")[:count])
    return chosen


def group_schemes(groups: list[Group], kept: list[Group], schemes: dict[str, str], outliers=None) -> dict[str, str]:
    """Group label -> fp32, per-token, per-tensor, both (a group of nodes quantised both ways), "per-token query
    and key, value fp32" (an attention group kept fp32 but for its query and key projections, NAME/qk) or
    "per-token, N outlier input channels fp32" (`outliers`: node -> channels)."""
    kept_labels = {g.label for g in kept}
    described = {}
    for group in groups:
        found = {schemes.get(n, "fp32") for n in group.nodes}
        if group.label in kept_labels:
            split = {schemes.get(f"{n}{QK}") for n in group.nodes} - {None}
            described[group.label] = f"{split.pop()} query and key, value fp32" if split else "fp32"
            continue
        described[group.label] = found.pop() if len(found) == 1 else "both"
        channels = sorted({len((outliers or {}).get(n, ())) for n in group.nodes} - {0})
        if channels and described[group.label] == "per-token":
            described[group.label] = f"per-token, {'/'.join(map(str, channels))} outlier input channels fp32"
    return described


@dataclass
class Search:
    """What the search found: the nodes kept fp32, how the others are quantised and the agreement of the graph."""

    target: float
    groups: list[Group]
    kept: list[Group]
    chosen: Trial
    trials: list[Trial]
    sensitivity: dict[str, float]
    calibration: dict[str, int]
    scheme: str = "per-tensor"
    schemes: dict[str, str] = field(default_factory=dict)  # every quantisable grouped node -> its scheme_of_nodes
    outliers: dict[str, list[int]] = field(default_factory=dict)  # node -> input channels kept fp32 (per-token)
    rows: str = pertoken.SEARCH_ROWS  # the per-token rows' mode (export/pertoken.py MODES)

    @property
    def fp32_nodes(self) -> list[str]:
        return [n for g in self.kept for n in g.nodes]

    @property
    def quantised(self) -> dict[str, str]:
        """Node -> scheme of the nodes the chosen graph quantises."""
        kept = set(self.fp32_nodes)
        return {n: how for n, how in self.schemes.items() if n not in kept}

    def describe(self) -> dict:
        """The manifest's record."""
        chosen, quantised, schemes, kept, outliers = self.chosen, self.quantised, self.schemes, self.kept, self.outliers
        per_token = sorted(n for n, how in quantised.items() if how == "per-token")
        per_tensor = any(how == "per-tensor" for how in quantised.values())
        return {
            "method": "per-tensor" if per_tensor else "per-row",
            "weights": "int8 per channel",
            "activations": "uint8 per tensor, one scale for the whole batch" if per_tensor else SCHEME,
            "row_mode": self.rows if per_token else None,
            "batch_invariant": not per_tensor,
            "scope": "auto",
            "scheme": self.scheme,
            "target_agreement": self.target,
            "agreement": chosen.agreement,
            "outputs": {
                name: {
                    "kind": a.kind,
                    "observed": a.observed,
                    "estimated": a.estimated,
                    "relative_rms": a.relative_rms,
                    "rows": a.rows,
                }
                for name, a in chosen.outputs.items()
            },
            "fp32_groups": [g.label for g in kept],
            "fp32_nodes": [n for g in kept for n in g.nodes],
            "group_schemes": group_schemes(self.groups, kept, schemes | quantised, outliers),
            "outlier_channels": outliers,
            "per_token_nodes": per_token,
            "groups": len(self.groups),
            "trials": len(self.trials),
            "sensitivity": self.sensitivity,
            "calibration": self.calibration,
        }


def search(
    fused_path: Path,
    calibration: Calibration,
    judged: dict[str, tuple[str, bool, str]],
    *,
    target: float,
    budget: int,
    note: Callable[[str], None] = print,
    scheme: str = "per-token",
    rows: str | None = None,
) -> Search:
    """judged: output name -> (agreement kind, token level, calibration set). Returns the fewest groups that, kept
    fp32, meet `target`, the others quantised as `scheme` says (scheme_of_nodes; per-token rows as `rows` says);
    `note` shows each trial as it ends."""
    rows = rows or pertoken.SEARCH_ROWS
    model = onnx.load(str(fused_path), load_external_data=False)
    groups = groups_of(model, budget)
    schemes = scheme_of_nodes(model, [n for g in groups for n in g.nodes], scheme)
    ops = {n.name: n.op_type for n in model.graph.node}
    per_token_able = set(rewritable(model))
    del model
    names = list(judged)
    reference = run_graph(fused_path, calibration, names)
    started = time.perf_counter()
    trials: list[Trial] = []
    outliers: dict[str, list[int]] = {}  # node -> input channels kept fp32, of the groups step 4 quantised

    def measure(what: str, exclude=(), only=None, how=None, channels=None) -> Trial:
        how = how or schemes
        excluded = set(exclude)
        chosen = {n: s for n, s in how.items() if n not in excluded and (only is None or n in only)}
        with tempfile.TemporaryDirectory(dir=fused_path.parent) as scratch:
            path = Path(scratch) / "trial.onnx"
            build_int8(fused_path, path, chosen, outliers if channels is None else channels, rows)
            candidate = run_graph(path, calibration, names)
        trial = Trial(what, tuple(exclude), *judge(reference, candidate, calibration, judged))
        trials.append(trial)
        shown = f"agreement {trial.agreement:.4f}" if trial.agreement is not None else "no agreement measure"
        note(f"int8 trial {len(trials)}: {what}: {shown}, relative error {trial.error:.4f}")
        if len(trials) == 1 and budget > 1:  # the bound, before the rest of the work
            took = time.perf_counter() - started
            note(
                f"int8 search: {took:.1f} s a trial graph over {sum(calibration.size().values())} calibration "
                f"inputs; at most {budget} trials, so at most about {took * budget:.0f} s"
            )
        return trial

    def meets(trial: Trial) -> bool:
        return trial.agreement is None or trial.agreement >= target

    def found(kept, chosen, sensitivity) -> Search:
        if scheme == "per-token":
            kept, chosen = with_outliers(kept, chosen, sensitivity)
            chosen = query_and_key(kept, chosen, sensitivity)
        return Search(
            target,
            groups,
            kept,
            chosen,
            trials,
            sensitivity,
            calibration.size(),
            scheme=scheme,
            schemes=schemes,
            outliers=dict(outliers),
            rows=rows,
        )

    def most_that_meet(count: int, trial_of: Callable[[int], Trial], chosen: Trial, reserve: int) -> tuple[int, Trial]:
        """The most of `count` candidates (the first n, in their order) whose graph meets the target, and its trial
        (`chosen` when none does): all of them tried first, then a binary search, leaving `reserve` trials."""
        low, high = 0, count
        while low < high and len(trials) < budget - reserve:
            middle = high if high == count else (low + high + 1) // 2
            trial = trial_of(middle)
            if meets(trial):
                low, chosen = middle, trial
            else:
                high = middle - 1
        return low, chosen

    def with_outliers(kept, chosen, sensitivity) -> tuple[list[Group], Trial]:
        """Of the layers' groups kept fp32, the most that meet the target per token with their outlier input
        channels fp32 (outlier_channels), least sensitive first; adds them to `schemes` and `outliers` and returns
        the groups still kept and the trial of the graph that then meets the target."""
        candidates = [g for g in kept if g.label not in CHEAP and all(n in per_token_able for n in g.nodes)]
        if not candidates or len(trials) >= budget - 1:  # a trial left for step 5
            return kept, chosen
        candidates.sort(key=lambda g: sensitivity.get(g.label, 0.0))
        channels = outlier_channels(fused_path, calibration, [n for g in candidates for n in g.nodes])
        fp32 = [n for g in kept for n in g.nodes]

        def moved(count: int) -> dict[str, str]:
            return {n: "per-token" for g in candidates[:count] for n in g.nodes}

        def trial_of(count: int) -> Trial:
            trying = moved(count)
            return measure(
                f"per token with outlier channels fp32 in {', '.join(g.label for g in candidates[:count])}",
                exclude=[n for n in fp32 if n not in trying],
                how=schemes | trying,
                channels={n: channels[n] for n in trying},
            )

        low, chosen = most_that_meet(len(candidates), trial_of, chosen, reserve=1)
        schemes.update(moved(low))
        outliers.update({n: channels[n] for n in moved(low)})
        return [g for g in kept if g not in candidates[:low]], chosen

    def query_and_key(kept, chosen, sensitivity) -> Trial:
        """Of the attention groups kept fp32, the most that may quantise their query and key projections per token
        (the value's stays fp32: its error reaches the output unsoftened by the softmax), least sensitive first;
        adds them to `schemes` as NAME/qk and returns the trial of the graph that then meets the target."""
        attention = [g for g in kept if any(ops.get(n) == "Attention" for n in g.nodes)]
        attention.sort(key=lambda g: sensitivity.get(g.label, 0.0))
        fp32 = [n for g in kept for n in g.nodes]

        def query_keys(count: int) -> dict[str, str]:
            return {f"{n}{QK}": "per-token" for g in attention[:count] for n in g.nodes if ops.get(n) == "Attention"}

        def trial_of(count: int) -> Trial:
            labels = ", ".join(g.label for g in attention[:count])
            return measure(
                f"query and key per token, value fp32, in {labels}", exclude=fp32, how=schemes | query_keys(count)
            )

        low, chosen = most_that_meet(len(attention), trial_of, chosen, reserve=0)
        schemes.update(query_keys(low))
        return chosen

    everything = measure(f"every group quantised ({scheme})")
    if meets(everything) or not groups:
        return found([], everything, {})
    sensitivity = {}
    cheap = [g for g in groups if g.label in CHEAP]
    for group in groups:
        if group.label not in CHEAP:  # kept fp32 first whatever they measure
            alone = measure(f"{group.label} alone", only=set(group.nodes))
            sensitivity[group.label] = alone.error
    ordered = cheap + sorted((g for g in groups if g.label not in CHEAP), key=lambda g: -sensitivity[g.label])
    # the fewest most-sensitive groups kept fp32 that meet the target (the cheap ones first): all of them kept is
    # fp32 itself
    low, high, best = max(len(cheap), 1), len(ordered), None
    while low < high and len(trials) < budget:
        middle = (low + high) // 2
        kept = ordered[:middle]
        trial = measure(
            f"{middle} most sensitive kept fp32 ({', '.join(g.label for g in kept)})",
            exclude=[n for g in kept for n in g.nodes],
        )
        if meets(trial):
            high, best = middle, trial
        else:
            low = middle + 1
    if best is None:  # only fp32 everywhere met the target (or the budget ran out before a smaller set did)
        same = {name: OutputAgreement(kind, 1.0, 1.0, 0.0, 0) for name, (kind, _, _) in judged.items()}
        best = Trial("every group kept fp32", tuple(n for g in ordered for n in g.nodes), 1.0, 0.0, same)
    return found(ordered[:high], best, sensitivity)


def time_graphs(
    paths: dict[str, Path], calibration: Calibration, passes: int = 5, every_pass: bool = False
) -> dict[str, float] | dict[str, list[float]]:
    """Seconds per pass over the calibration batches, the median of `passes` passes taken in turn (so a busy
    moment of the machine falls on every candidate alike), after one warm-up pass each; `every_pass`: each pass's
    seconds, in the order taken."""
    import time

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sessions = {
        name: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for name, p in paths.items()
    }
    batches = [b for _, _, b in calibration.flat()]
    feeds = {
        name: [{k: v for k, v in b.items() if k in {i.name for i in sess.get_inputs()}} for b in batches]
        for name, sess in sessions.items()
    }
    for name, sess in sessions.items():
        for feed in feeds[name]:
            sess.run(None, feed)
    seconds: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(passes):
        for name, sess in sessions.items():
            start = time.perf_counter()
            for feed in feeds[name]:
                sess.run(None, feed)
            seconds[name].append(time.perf_counter() - start)
    if every_pass:
        return seconds
    return {name: float(np.median(values)) for name, values in seconds.items()}
