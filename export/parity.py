"""Parity: run the shipped sample text through the torch model and through an ONNX file, compare.

Token-level outputs are compared on real tokens only (padding positions carry no meaning).
Figures per output: max and mean absolute difference, relative RMS error, and agreement of the
predicted label (argmax) where the output is a score over labels or positions. An output of token ids (an mlm
head's candidates, int64) is no magnitude: it is held to the agreement of its first (likeliest) id, since two
candidates whose probabilities differ in the last bits may trade places in a graph that sums in another order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .samples import QUESTION_CONTEXTS, SENTENCES

# Tolerances by precision. fp32 must match torch to float rounding; fp16 and int8 change the
# numbers by design, so they are held to a relative error and label agreement instead.
TOLERANCES = {
    "fp32": {"max_abs_diff": 1e-4},
    "fp16": {"relative_rms": 0.02, "label_agreement": 0.95},
    "int8": {"relative_rms": 0.25, "label_agreement": 0.90},
    "bf16": {"relative_rms": 0.05, "label_agreement": 0.95},
}
ID_AGREEMENT = 0.99  # of an ids output's first id, where the precision sets no label agreement (fp32)


def sample_batches(tokenizer, max_seq: int, batch_size: int = 8) -> list[dict[str, np.ndarray]]:
    """Sentences and (question, context) pairs in padded batches, plus one batch that reaches
    max_seq (long text cut to the limit, next to a short row), so the largest position is checked."""
    keys = ("input_ids", "attention_mask", "token_type_ids")
    batches = []
    sentences = list(SENTENCES)
    for start in range(0, len(sentences), batch_size):
        encoded = tokenizer(sentences[start : start + batch_size], max_length=max_seq, truncation=True)
        batches.append({k: encoded[k] for k in keys})
    questions = [q for q, _ in QUESTION_CONTEXTS]
    contexts = [c for _, c in QUESTION_CONTEXTS]
    encoded = tokenizer(questions, contexts, max_length=max_seq, truncation="only_second")
    batches.append({k: encoded[k] for k in keys})
    once = " ".join(sentences)
    pieces = max(1, len(tokenizer([once], max_length=None, truncation=False)["input_ids"][0]) - 2)
    long_text = " ".join([once] * (1 + max_seq // pieces))  # just past max_seq: cut there, as before
    encoded = tokenizer([long_text, sentences[3]], max_length=max_seq, truncation=True)
    batches.append({k: encoded[k] for k in keys})
    return batches


# Sample batches wider than this are verified one row at a time (see row_by_row).
ROW_BY_ROW_WIDTH = 512


def row_by_row(batches: list[dict], width: int = ROW_BY_ROW_WIDTH) -> list[dict]:
    """The parity batches, each one wider than `width` tokens split into one-row batches of the same width (the
    padding kept, so a short row still sits in a long padded one). Attention in an exported graph that did not
    fuse (rotary, windowed or relative attention) holds (batch, heads, T, T) scores: for a long-context model's
    batch that reaches max_seq (ModernBERT: 8,192 positions, 3.2 GB of scores per row per tensor at 12 heads)
    two rows took twice what the artifact needs to serve its longest input. The same rows and padding are
    compared; only the peak memory halves."""
    out = []
    for batch in batches:
        rows, wide = len(batch["input_ids"]), batch["input_ids"].shape[1] > width
        out.extend([{k: v[i : i + 1] for k, v in batch.items()} for i in range(rows)] if wide and rows > 1 else [batch])
    return out


def torch_outputs(wrapper, batches) -> list[dict[str, np.ndarray]]:
    import torch

    results = []
    with torch.inference_mode():
        for batch in batches:
            outputs = wrapper(*(torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
            results.append({name: t.float().numpy() for name, t in zip(wrapper.output_names, outputs)})
    return results


def session(path: Path, precision: str = "fp32"):
    """An onnxruntime session; fp16 prefers the CUDA provider when onnxruntime-gpu is installed."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    providers = ["CPUExecutionProvider"]
    if precision == "fp16" and "CUDAExecutionProvider" in available:
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=providers)


def onnx_outputs(sess, batches, output_names) -> list[dict[str, np.ndarray]]:
    input_names = {i.name for i in sess.get_inputs()}
    results = []
    for batch in batches:
        values = sess.run(list(output_names), {k: v for k, v in batch.items() if k in input_names})
        results.append({name: np.asarray(v, dtype=np.float32) for name, v in zip(output_names, values)})
    return results


def _valid(name: str, value: np.ndarray, mask: np.ndarray, token_level: bool) -> np.ndarray:
    """Rows (sequence outputs) or real tokens (token-level outputs), flattened to (N, ...)."""
    if not token_level:
        return value
    return value[mask.astype(bool)]


@dataclass
class OutputParity:
    max_abs_diff: float
    mean_abs_diff: float
    relative_rms: float
    label_agreement: float | None  # None where the output is not a score (encoder states)
    ids: bool = False  # the output holds token ids: only label_agreement (of the first id) is judged


def compare(
    reference, candidate, batches, token_level: dict[str, bool], scores: dict[str, str]
) -> dict[str, OutputParity]:
    """scores: output name -> 'labels' (argmax over the last axis) | 'positions' (argmax over real
    tokens, e.g. QA start/end) | 'ids' (token ids, best first: the first compared) | 'none'."""
    figures = {}
    for name in reference[0]:
        diffs, refs, agree, total = [], [], 0, 0
        for ref, cand, batch in zip(reference, candidate, batches):
            mask = batch["attention_mask"]
            r, c = ref[name], cand[name]
            if r.shape != c.shape:
                raise ValueError(f"output {name}: shape {c.shape} from ONNX, {r.shape} from torch")
            diffs.append(np.abs(_valid(name, r - c, mask, token_level[name])).ravel())
            refs.append(_valid(name, r, mask, token_level[name]).ravel())
            if scores[name] == "ids":
                rv, cv = _valid(name, r, mask, token_level[name]), _valid(name, c, mask, token_level[name])
                agree += int((rv[..., 0] == cv[..., 0]).sum())
                total += int(rv[..., 0].size)
                diffs[-1] = np.zeros(0)
                refs[-1] = np.zeros(0)
            elif scores[name] == "labels":
                rv, cv = _valid(name, r, mask, token_level[name]), _valid(name, c, mask, token_level[name])
                agree += int((rv.argmax(-1) == cv.argmax(-1)).sum())
                total += rv.shape[0] if rv.ndim > 1 else 1
            elif scores[name] == "positions":
                masked_r = np.where(mask.astype(bool), r, -np.inf)
                masked_c = np.where(mask.astype(bool), c, -np.inf)
                agree += int((masked_r.argmax(-1) == masked_c.argmax(-1)).sum())
                total += r.shape[0]
        diff = np.concatenate(diffs)
        ref_all = np.concatenate(refs)
        rms_ref = (float(np.sqrt(np.mean(ref_all.astype(np.float64) ** 2))) if ref_all.size else 0.0) or 1.0
        figures[name] = OutputParity(
            max_abs_diff=float(diff.max(initial=0.0)),
            mean_abs_diff=float(diff.mean()) if diff.size else 0.0,
            relative_rms=float(np.sqrt(np.mean(diff.astype(np.float64) ** 2)) / rms_ref) if diff.size else 0.0,
            label_agreement=(agree / total) if total else None,
            ids=scores[name] == "ids",
        )
    return figures


def judge(figures: dict[str, OutputParity], precision: str, atol: float | None = None) -> tuple[bool, list[str]]:
    """(passed, problems) against TOLERANCES[precision] (atol overrides the fp32 bound)."""
    limits = dict(TOLERANCES[precision])
    if atol is not None and "max_abs_diff" in limits:
        limits["max_abs_diff"] = atol
    problems = []
    for name, f in figures.items():
        if f.ids:
            needed = limits.get("label_agreement", ID_AGREEMENT)
            if f.label_agreement is not None and f.label_agreement < needed:
                problems.append(f"{name}: first-id agreement {f.label_agreement:.3f} < {needed}")
            continue
        if "max_abs_diff" in limits and not f.max_abs_diff <= limits["max_abs_diff"]:
            problems.append(f"{name}: max abs diff {f.max_abs_diff:.3g} > {limits['max_abs_diff']:.3g}")
        if "relative_rms" in limits and not f.relative_rms <= limits["relative_rms"]:
            problems.append(f"{name}: relative RMS error {f.relative_rms:.3g} > {limits['relative_rms']:.3g}")
        if (
            "label_agreement" in limits
            and f.label_agreement is not None
            and f.label_agreement < limits["label_agreement"]
        ):
            problems.append(f"{name}: label agreement {f.label_agreement:.3f} < {limits['label_agreement']}")
    return not problems, problems


def report(
    figures: dict[str, OutputParity],
    precision: str,
    passed: bool,
    problems: list[str],
    provider: str,
    atol: float | None = None,
) -> dict:
    limits = dict(TOLERANCES[precision])
    if atol is not None and "max_abs_diff" in limits:
        limits["max_abs_diff"] = atol
    return {
        "precision": precision,
        "provider": provider,
        "tolerance": limits,
        "passed": passed,
        "problems": problems,
        "outputs": {name: vars(f) for name, f in figures.items()},
        "max_abs_diff": max((f.max_abs_diff for f in figures.values()), default=0.0),
    }
