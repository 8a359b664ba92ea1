"""Quantization-aware distillation: teach a copy of the model to answer as the fp32 model does through the all-int8
graph that export/variants.py quantize_int8 (scope all) writes.

The student runs the checkpoint's own torch model with each quantised node replaced by its fake-quantised maths,
the same numbers the int8 graph computes:

- an nn.Linear called on token states (rank 3: exported as a MatMul with a constant weight, which
  export/pertoken.py rewrites) quantises its weight per output channel, symmetric int8
  (s = max|w| / 127, round half to even, clipped to +-127), and its input per row (one token) as pertoken.py's
  "auto" mode does: symmetric (s = max|x| / 127, at least 1e-12) except where a GELU feeds it (a layer's
  feed-forward output), which takes the row's own range, zero included (s = (max - min) / 255, x rounded within
  [round(min / s), that + 255] steps). A Linear called on one vector per text (the pooler, a classifier on [CLS])
  is a Gemm in the graph and stays fp32 there, so here too;
- the embedding tables (and the embedding LayerNorm's weights where onnxruntime fuses it into
  EmbedLayerNormalization) are read as onnxruntime's weight-only quantisation stores them: uint8, one asymmetric
  range per table. They are not trained.

Gradients pass the rounding unchanged (straight-through estimator). The teacher is the fp32 model; the loss is the
task's own agreement target on unlabeled text: the label distribution (classify, zero-shot, NER per token), the
start and end distributions over a text's tokens (QA), the order of a query's texts (rerank), cosine to the
teacher's vector (embeddings), and for every float output its squared error relative to the teacher's spread.
Figures: docs/export.md, "int8: quantization-aware distillation".
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

INV127 = torch.tensor(1 / 127, dtype=torch.float32)
INV255 = torch.tensor(1 / 255, dtype=torch.float32)
TINY = 1e-12  # pertoken.py's floor on a row's scale
GELU_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh")
HELD_OUT_EVERY = 4  # every 4th calibration batch of each set is held out of training, for the agreement figure
LEARNING_RATE = 1e-6  # Adam moves every weight about this much a step; more outran int8's own error (docs/export.md)


class DistillError(ValueError):
    """The distillation cannot run as asked (no text to learn from): export/cli.py gives one line and exit 2."""


def _ste(x: torch.Tensor, quantised: torch.Tensor) -> torch.Tensor:
    """quantised's value, x's gradient."""
    return x + (quantised - x).detach()


def fake_weight(w: torch.Tensor) -> torch.Tensor:
    """nn.Linear weight (out, in) as the int8 graph holds it: one symmetric scale per output channel."""
    scale = w.detach().abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _ste(w, torch.clamp(torch.round(w.detach() / scale), -127, 127) * scale)


def fake_rows(x: torch.Tensor, asymmetric: bool) -> torch.Tensor:
    """x quantised with one scale per row (its last axis), as export/pertoken.py's graph does at run time."""
    d = x.detach()
    if not asymmetric:
        scale = torch.clamp(d.abs().amax(dim=-1, keepdim=True) * INV127, min=TINY)
        return _ste(x, torch.clamp(torch.round(d / scale), -128, 127) * scale)
    high = torch.clamp(d.amax(dim=-1, keepdim=True), min=0.0)
    low = torch.clamp(d.amin(dim=-1, keepdim=True), max=0.0)
    scale = torch.clamp((high - low) * INV255, min=TINY)
    offset = torch.round(low / scale)
    steps = torch.clamp(torch.round(d / scale) - offset, 0, 255) + offset
    return _ste(x, steps * scale)


def dequantised_table(table: np.ndarray) -> np.ndarray:
    """An embedding table (or LayerNorm weight) as onnxruntime's dynamic quantisation stores it for a Gather or an
    EmbedLayerNormalization: uint8, one asymmetric range over the whole tensor."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    zero_point, scale, q = quantize_data(table.astype(np.float32), TensorProto.UINT8, False)
    return ((q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


def _asymmetric_linears(model: nn.Module, config) -> set[int]:
    """The Linears a fused GELU feeds (each layer's feed-forward output): pertoken.py gives their rows their own
    range. A gated MLP's product or a non-GELU activation feeds them through a Mul or Relu: symmetric."""
    from bert.blocks.mlp import PlainIntermediate

    if config.hidden_act not in GELU_ACTS:
        return set()
    found = set()
    for module in model.modules():
        intermediate = getattr(module, "intermediate", None)
        output = getattr(module, "output", None)
        if isinstance(intermediate, PlainIntermediate) and isinstance(getattr(output, "dense", None), nn.Linear):
            found.add(id(output.dense))
    return found


def _embedding_tensors(model: nn.Module, config) -> list[nn.Parameter]:
    """What the int8 graph reads as uint8 tables: each embedding table, and the embedding LayerNorm's weight and
    bias where onnxruntime fuses them into EmbedLayerNormalization."""
    from bert.model import BertEmbeddings

    from .variants import bert_shaped, embed_fusion

    tensors = []
    for module in model.modules():
        if not isinstance(module, BertEmbeddings):
            continue
        for table in (module.word_embeddings, module.position_embeddings, module.token_type_embeddings):
            if table is not None:
                tensors.append(table.weight)
        norm = module.LayerNorm
        if bert_shaped(config) and embed_fusion(config) and isinstance(norm, nn.LayerNorm):
            tensors += [p for p in (norm.weight, norm.bias) if p is not None]
    return tensors


@contextmanager
def fake_quantised(model: nn.Module, config):
    """Within the block, `model` computes what its all-int8 graph computes (up to float summation order)."""
    asymmetric = _asymmetric_linears(model, config)
    originals: dict[int, torch.Tensor] = {}
    for p in _embedding_tensors(model, config):
        originals[id(p)] = p.data
        p.data = torch.from_numpy(dequantised_table(p.data.numpy()))
    patched = []
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue

        def forward(x, module=module, asym=id(module) in asymmetric):
            weight = module.weight
            if id(weight) in originals:  # a decoder tied to the word table: its MatMul has its own fp32 copy
                weight = _ste(weight, originals[id(weight)])
            if x.dim() < 3:  # one vector per text: a Gemm in the graph, kept fp32
                return F.linear(x, weight, module.bias)
            return F.linear(fake_rows(x, asym), fake_weight(weight), module.bias)

        module.forward = forward
        patched.append(module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward
        for p in _embedding_tensors(model, config):
            p.data = originals[id(p)]


# ------------------------------------------------------------------------------------------------ the loss
def _kl(teacher: torch.Tensor, student: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """KL(teacher || student) of the softmaxes along `dim`, averaged over the other axes."""
    t = F.log_softmax(teacher, dim=dim)
    s = F.log_softmax(student, dim=dim)
    return (t.exp() * (t - s)).sum(dim).mean()


def output_loss(kind: str, token_level: bool, teacher: torch.Tensor, student: torch.Tensor, mask: torch.Tensor):
    """One output's distance from the teacher's, by what its agreement compares (export/sensitivity.py)."""
    if not teacher.is_floating_point():
        return None
    real = mask.bool()
    t, s = (teacher[real], student[real]) if token_level and kind != "positions" else (teacher, student)
    spread = t.var(unbiased=False).clamp(min=1e-6)
    loss = F.mse_loss(s, t) / spread
    if kind == "cosine":
        loss = loss + (1 - F.cosine_similarity(s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1]), dim=-1)).mean()
    elif kind == "positions":  # over each text's real tokens
        neg = torch.finfo(t.dtype).min / 2
        loss = loss + _kl(t.masked_fill(~real, neg), s.masked_fill(~real, neg), dim=1)
    elif kind == "ranked":  # over the query's texts
        loss = loss + _kl(t.reshape(len(t), -1)[:, 0], s.reshape(len(s), -1)[:, 0], dim=0)
    elif kind == "labels" and t.shape[-1] > 1:
        loss = loss + _kl(t, s)
    return loss


# ---------------------------------------------------------------------------------------------- the training
@dataclass
class Distillation:
    steps: int
    seed: int
    learning_rate: float
    seconds: float
    train_inputs: dict[str, int]
    held_out_inputs: dict[str, int]
    before: dict[str, dict]  # held-out figures of the fake-quantised student, undistilled / distilled
    after: dict[str, dict]
    losses: list[float] = field(default_factory=list)
    held_out: object = None  # the held-out Calibration and the teacher's outputs on it, for the graph's own figure
    held_reference: list = field(default_factory=list)
    judged: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    graph_agreement: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {
            "steps": self.steps,
            "seed": self.seed,
            "learning_rate": self.learning_rate,
            "seconds": round(self.seconds, 1),
            "train_inputs": self.train_inputs,
            "held_out_inputs": self.held_out_inputs,
            "held_out_rule": f"every {HELD_OUT_EVERY}th calibration batch of each set, never trained on",
            "fake_quant_agreement_before": self.before,
            "fake_quant_agreement_after": self.after,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
        }


def split(calibration):
    """(train, held out) Calibrations: every HELD_OUT_EVERY-th batch of a set (its 2nd, 6th, ...) is held out; a
    set of one batch trains on it and holds nothing out."""
    from .sensitivity import Calibration

    train, held = Calibration(), Calibration()
    for name, batches in calibration.batches.items():
        out = [i for i in range(len(batches)) if len(batches) > 1 and i % HELD_OUT_EVERY == 1]
        train.batches[name] = [b for i, b in enumerate(batches) if i not in out]
        held.batches[name] = [b for i, b in enumerate(batches) if i in out]
    return train, held


def _tensors(batch: dict) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.asarray(batch[k])) for k in ("input_ids", "attention_mask", "token_type_ids"))


def _outputs(wrapper, batch) -> dict[str, torch.Tensor]:
    return dict(zip(wrapper.output_names, wrapper(*_tensors(batch))))


def torch_agreement(teacher_outputs, student_wrapper, calibration, judged) -> dict[str, dict]:
    """Each judged output's agreement (export/sensitivity.py's rule) and relative RMS error, of the student's
    answers against the teacher's on `calibration`."""
    from .sensitivity import judge

    with torch.no_grad():
        student = [{n: v.numpy() for n, v in _outputs(student_wrapper, b).items()} for _, _, b in calibration.flat()]
    reference = [{n: v.numpy() for n, v in r.items()} for r in teacher_outputs]
    _, _, outputs = judge(reference, student, calibration, _judged_present(judged, calibration))
    return figures(outputs)


def figures(outputs) -> dict[str, dict]:
    """export/sensitivity.py's OutputAgreement per output, as the manifest records it."""
    return {
        name: {"kind": a.kind, "agreement": a.value, "relative_rms": round(a.relative_rms, 6), "rows": a.rows}
        for name, a in outputs.items()
    }


def _judged_present(judged, calibration):
    return {n: j for n, j in judged.items() if calibration.batches.get(j[2])}


def distill(
    model, wrapper, config, calibration, judged, *, steps: int, seed: int = 0, lr: float = LEARNING_RATE, note=print
) -> Distillation:
    """Train `model` (in place; the wrapper's model) against a frozen fp32 copy of itself, for `steps` steps of
    one calibration batch each, through its fake-quantised int8 forward. Deterministic for a seed on one machine
    and thread count."""
    from .wrapper import ExportWrapper

    if steps < 1:
        raise DistillError(f"distillation needs at least 1 step, got {steps}")
    train, held = split(calibration)
    work = [
        (name, b)
        for name, batches in train.batches.items()
        for b in batches
        if any(j[2] == name for j in judged.values())
    ]
    if not work:
        raise DistillError("distillation has no calibration text that any output of this model is judged on")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model.eval()  # no dropout: the student is judged as it is served
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher_wrapper = ExportWrapper(teacher, wrapper.task)
    note(f"the fp32 teacher's outputs on {sum(len(b['input_ids']) for _, b in work)} training inputs ...")
    with torch.no_grad():
        taught = [_outputs(teacher_wrapper, b) for _, b in work]
        held_reference = [_outputs(teacher_wrapper, b) for _, _, b in held.flat()]
    frozen = [p for p in _embedding_tensors(model, config) if p.requires_grad]
    for p in frozen:  # read as uint8 tables, not trained
        p.requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: 1.0 - i / steps)
    losses: list[float] = []
    began = time.perf_counter()
    with fake_quantised(model, config):
        before = torch_agreement(held_reference, wrapper, held, judged) if held.flat() else {}
        started = time.perf_counter()
        order: list[int] = []
        report_every = max(1, steps // 10)
        for step in range(steps):
            if not order:
                order = torch.randperm(len(work), generator=generator).tolist()
            index = order.pop()
            name, batch = work[index]
            student = _outputs(wrapper, batch)
            mask = torch.from_numpy(np.asarray(batch["attention_mask"]))
            terms = [
                output_loss(kind, token_level, taught[index][n], student[n], mask)
                for n, (kind, token_level, judged_on) in judged.items()
                if judged_on == name
            ]
            terms = [t for t in terms if t is not None]
            if not terms:
                raise DistillError(f"no float output of this model is judged on the {name} calibration set")
            loss = sum(terms)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            losses.append(loss.item())
            if step == 0:
                first = time.perf_counter() - started
                note(
                    f"distilling: {steps} steps of one calibration batch, about {first * steps:.0f} s "
                    f"(from the first step, {first:.2f} s); loss {losses[0]:.4g}"
                )
            elif (step + 1) % report_every == 0 or step + 1 == steps:
                spent = time.perf_counter() - started
                left = spent / (step + 1) * (steps - step - 1)
                bar = "#" * round(20 * (step + 1) / steps)
                note(
                    f"[{bar:<20}] step {step + 1}/{steps}, loss {np.mean(losses[-report_every:]):.4g}, "
                    f"{spent:.0f} s, about {left:.0f} s left"
                )
        after = torch_agreement(held_reference, wrapper, held, judged) if held.flat() else {}
    for p in model.parameters():
        p.grad = None
    for p in frozen:
        p.requires_grad_(True)
    if any(not math.isfinite(v) for v in losses):
        raise DistillError("distillation diverged (a loss that is not finite); try fewer steps")
    return Distillation(
        steps=steps,
        seed=seed,
        learning_rate=lr,
        seconds=time.perf_counter() - began,
        train_inputs={n: sum(len(b["input_ids"]) for b in bs) for n, bs in train.batches.items()},
        held_out_inputs=held.size(),
        before=before,
        after=after,
        losses=losses,
        held_out=held,
        held_reference=[{n: v.numpy() for n, v in r.items()} for r in held_reference],
        judged=judged,
    )
