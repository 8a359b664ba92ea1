"""Quantization-aware distillation: teach a copy of the model to answer as the fp32 model does through the all-int8
graph that export/variants.py quantize_int8 (scope all) writes.

The student runs the checkpoint's own torch model with each quantised node replaced by its fake-quantised maths,
the same numbers the int8 graph computes:

- an nn.Linear called on token states (rank 3: exported as a MatMul with a constant weight, which
  export/pertoken.py rewrites) quantises its weight per output channel, symmetric int8
  (s = max|w| / 127, round half to even, clipped to +-127), and its input per row (one token) as pertoken.py's
  "auto" mode does: symmetric (s = max|x| / 127, at least 1e-12) except where a GELU feeds it (a layer's
  feed-forward output), which takes the row's own range, zero included (s = (max - min) / 255, x rounded within
  [round(min / s), that + 255] steps). A Linear with a bias called on one vector per text (the pooler, a
  classifier on [CLS]) is a Gemm in the graph and stays fp32 there, so here too (bert.precision.quantised_linears
  tells them apart, as for the torch backend's int8); one without a bias (ModernBERT's
  head) is a MatMul there, quantised per row (one text), so here too;
- the embedding tables (and the embedding LayerNorm's weights where onnxruntime fuses it into
  EmbedLayerNormalization) are read as onnxruntime's weight-only quantisation stores them: uint8, one asymmetric
  range per table. They are not trained.

Gradients pass the rounding unchanged (straight-through estimator). The teacher is the fp32 model. The recipe is
block-wise reconstruction: one encoder layer at a time, in order, the student's layer is fed what the student's
layers before it (already trained) give on unlabeled text, and learns, through its fake-quantised forward, to give
what the teacher's same layer gives on the teacher's own input (squared error over the teacher's variance, real
tokens only). The embeddings and whatever follows the last layer (pooler, heads) are not trained.
Figures: docs/export.md, "int8: quantization-aware distillation".
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bert.precision import asymmetric_linears, int8_rows, int8_weights, quantised_linears

HELD_OUT_EVERY = 4  # every 4th calibration batch of each set is held out of training, for the agreement figure
LEARNING_RATE = 3e-5  # Adam's step on a layer's weights; the measured recipe (docs/export.md)
RECIPE = "block-wise reconstruction"


class DistillError(ValueError):
    """The distillation cannot run as asked (no text to learn from): export/cli.py gives one line and exit 2."""


def _ste(x: torch.Tensor, quantised: torch.Tensor) -> torch.Tensor:
    """quantised's value, x's gradient."""
    return x + (quantised - x).detach()


def fake_weight(w: torch.Tensor) -> torch.Tensor:
    """nn.Linear weight (out, in) as the int8 graph holds it: one symmetric scale per output channel."""
    q, scale = int8_weights(w.detach())
    return _ste(w, q * scale)


def fake_rows(x: torch.Tensor, asymmetric: bool) -> torch.Tensor:
    """x quantised with one scale per row (its last axis), as export/pertoken.py's graph does at run time."""
    steps, scale, shift = int8_rows(x.detach(), asymmetric)
    return _ste(x, (steps if shift is None else steps + shift) * scale)


def dequantised_table(table: np.ndarray) -> np.ndarray:
    """An embedding table (or LayerNorm weight) as onnxruntime's dynamic quantisation stores it for a Gather or an
    EmbedLayerNormalization: uint8, one asymmetric range over the whole tensor."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    zero_point, scale, q = quantize_data(table.astype(np.float32), TensorProto.UINT8, False)
    return ((q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


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
def fake_quantised(model: nn.Module, config, tables: bool = True):
    """Within the block, `model` computes what its all-int8 graph computes (up to float summation order); with
    `tables` False, its embedding tables stay fp32 (what bert.precision.low_precision_matmuls computes)."""
    asymmetric = asymmetric_linears(model, config)
    quantised = {id(m) for m in quantised_linears(model)}  # what the graph quantises: the others stay fp32
    originals: dict[int, torch.Tensor] = {}
    for p in _embedding_tensors(model, config) if tables else ():
        originals[id(p)] = p.data
        p.data = torch.from_numpy(dequantised_table(p.data.numpy()))
    patched = []
    for module in model.modules():
        if id(module) not in quantised:
            continue

        def forward(x, module=module, asym=id(module) in asymmetric):
            weight = module.weight
            if id(weight) in originals:  # a decoder tied to the word table: its MatMul has its own fp32 copy
                weight = _ste(weight, originals[id(weight)])
            return F.linear(fake_rows(x, asym), fake_weight(weight), module.bias)

        module.forward = forward
        patched.append(module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward
        for p in _embedding_tensors(model, config) if tables else ():
            p.data = originals[id(p)]


# ------------------------------------------------------------------------------------------------ the loss
def relative_error(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A layer's output against the teacher's, over the batch's real tokens: squared error over the teacher's
    variance."""
    s, t = student[mask], teacher[mask]
    return F.mse_loss(s, t) / t.var(unbiased=False).clamp(min=1e-6)


# ---------------------------------------------------------------------------------------------- the training
@dataclass
class Distillation:
    steps: int  # per layer
    layers: int
    seed: int
    learning_rate: float
    seconds: float
    train_inputs: dict[str, int]
    held_out_inputs: dict[str, int]
    before: dict[str, dict]  # held-out figures of the fake-quantised student, undistilled / distilled
    after: dict[str, dict]
    losses: list[float] = field(default_factory=list)
    layer_losses: list[tuple[float, float]] = field(default_factory=list)  # per layer: its first / last tenth
    held_out: object = None  # the held-out Calibration and the teacher's outputs on it, for the graph's own figure
    held_reference: list = field(default_factory=list)
    judged: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    graph_agreement: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {
            "recipe": RECIPE,
            "steps": self.steps * self.layers,
            "steps_per_layer": self.steps,
            "layers": self.layers,
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
            "layer_loss_first_last_tenth": [[round(a, 8), round(b, 8)] for a, b in self.layer_losses],
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


class _Stop(Exception):
    """Raised from a hook once it has what it came for: the rest of the forward is not needed."""


def _layers(model: nn.Module) -> list[nn.Module]:
    from bert.model import BertLayer

    return [m for m in model.modules() if isinstance(m, BertLayer)]


def _layer_inputs(wrapper, layers, batches, first_only: bool):
    """Per batch, what the first layer reads (the embeddings' output) and, unless first_only, each layer's other
    arguments (its mask, rotary tables, relative positions: a windowed layer has its own mask)."""
    hidden: list[torch.Tensor] = []
    extra: list[list] = [[] for _ in layers]

    def grab(index, module, args, kwargs):
        if index == 0:
            hidden.append(args[0])
        if not first_only:
            extra[index].append((args[1:], kwargs))
        if first_only or index == len(layers) - 1:
            raise _Stop

    hooks = [layer.register_forward_pre_hook(partial(grab, i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    wrapper(*_tensors(batch))
                except _Stop:
                    pass
    finally:
        for hook in hooks:
            hook.remove()
    return hidden, extra


def _fit_layer(layer, inputs, taught, extra, masks, steps: int, lr: float, generator):
    """Train `layer` alone (AdamW, lr decayed linearly to 0) so that on each batch's input it gives the teacher's
    output, one batch a step in a seeded order; yields each step's loss. Its weights are trainable only meanwhile."""
    trained = list(layer.parameters())
    for p in trained:
        p.requires_grad_(True)
    optimiser = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: 1.0 - i / steps)
    order: list[int] = []
    try:
        for _ in range(steps):
            if not order:
                order = torch.randperm(len(inputs), generator=generator).tolist()
            j = order.pop()
            args, kwargs = extra[j]
            loss = relative_error(layer(inputs[j], *args, **kwargs), taught[j], masks[j])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            yield loss.item()
    finally:
        for p in trained:
            p.requires_grad_(False)
            p.grad = None


def distill(
    model, wrapper, config, calibration, judged, *, steps: int, seed: int = 0, lr: float = LEARNING_RATE, note=print
) -> Distillation:
    """Train `model` (in place; the wrapper's model) layer by layer, `steps` steps of one calibration batch each
    per encoder layer: each layer, fed what the layers before it (already trained) give through their
    fake-quantised int8 forward, learns to give what the frozen fp32 teacher's same layer gives on the teacher's
    own input. Deterministic for a seed on one machine and thread count."""
    from .wrapper import ExportWrapper

    if steps < 1:
        raise DistillError(f"distillation needs at least 1 step, got {steps}")
    train, held = split(calibration)
    work = [b for name, batches in train.batches.items() for b in batches if any(j[2] == name for j in judged.values())]
    if not work:
        raise DistillError("distillation has no calibration text that any output of this model is judged on")
    layers = _layers(model)
    if not layers:
        raise DistillError("distillation found no encoder layer to train in this model")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model.eval()  # no dropout: the student is judged as it is served
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher_wrapper = ExportWrapper(teacher, wrapper.task)
    teacher_layers = _layers(teacher)
    note(
        f"the fp32 teacher's outputs on {sum(held.size().values())} held-out inputs and its first layer's input on "
        f"{sum(len(b['input_ids']) for b in work)} training inputs ..."
    )
    with torch.no_grad():
        held_reference = [_outputs(teacher_wrapper, b) for _, _, b in held.flat()]
    taught, _ = _layer_inputs(teacher_wrapper, teacher_layers, work, first_only=True)
    masks = [torch.from_numpy(np.asarray(b["attention_mask"])).bool() for b in work]
    trainable = {p: p.requires_grad for p in model.parameters()}
    for p in trainable:
        p.requires_grad_(False)
    total = steps * len(layers)
    report_every = max(1, total // 10)
    warm = 1 if steps > 1 else 0  # the first step builds the kernels and buffers the rest reuse: not timed
    timed = min(10, steps - warm)
    losses: list[float] = []
    layer_losses: list[tuple[float, float]] = []
    began = time.perf_counter()
    try:
        with fake_quantised(model, config):
            before = torch_agreement(held_reference, wrapper, held, judged) if held.flat() else {}
            started = time.perf_counter()
            inputs, extra = _layer_inputs(wrapper, layers, work, first_only=False)
            for index, (layer, teacher_layer) in enumerate(zip(layers, teacher_layers)):
                prepared = time.perf_counter()
                with torch.no_grad():
                    taught = [teacher_layer(x, *a, **k) for x, (a, k) in zip(taught, extra[index])]
                prepared = time.perf_counter() - prepared
                mark = len(losses)
                stepping = time.perf_counter()
                for loss in _fit_layer(layer, inputs, taught, extra[index], masks, steps, lr, generator):
                    losses.append(loss)
                    step = len(losses) - mark - 1
                    done = index * steps + step + 1
                    spent = time.perf_counter() - started
                    if index == 0 and step + 1 == warm:
                        stepping = time.perf_counter()
                    if index == 0 and step + 1 == warm + timed:
                        # each layer: its steps, and two passes over the text (the teacher's layer, then the
                        # trained student's, to feed the next)
                        per_step = (time.perf_counter() - stepping) / timed
                        estimate = len(layers) * (steps * per_step + 2 * prepared)
                        note(
                            f"distilling: {len(layers)} layers x {steps} steps of one calibration batch, about "
                            f"{estimate:.0f} s (from {timed} steps after the first, {per_step:.2f} s a step); "
                            f"loss {losses[0]:.4g}"
                        )
                    if done % report_every == 0 or step + 1 == steps:
                        left = spent / done * (total - done)
                        bar = "#" * round(20 * done / total)
                        since = losses[max(mark, len(losses) - report_every) :]
                        note(
                            f"[{bar:<20}] layer {index + 1}/{len(layers)}, step {done}/{total}, "
                            f"loss {np.mean(since):.4g}, {spent:.0f} s, about {left:.0f} s left"
                        )
                tenth = max(1, steps // 10)
                layer_losses.append((float(np.mean(losses[mark : mark + tenth])), float(np.mean(losses[-tenth:]))))
                if not all(math.isfinite(v) for v in losses[mark:]):
                    raise DistillError("distillation diverged (a loss that is not finite); try a lower --distill-lr")
                with torch.no_grad():
                    inputs = [layer(x, *a, **k) for x, (a, k) in zip(inputs, extra[index])]
            after = torch_agreement(held_reference, wrapper, held, judged) if held.flat() else {}
    finally:
        for p, flag in trainable.items():
            p.requires_grad_(flag)
            p.grad = None
    return Distillation(
        steps=steps,
        layers=len(layers),
        seed=seed,
        learning_rate=lr,
        seconds=time.perf_counter() - began,
        train_inputs={n: sum(len(b["input_ids"]) for b in bs) for n, bs in train.batches.items()},
        held_out_inputs=held.size(),
        before=before,
        after=after,
        losses=losses,
        layer_losses=layer_losses,
        held_out=held,
        held_reference=[{n: v.numpy() for n, v in r.items()} for r in held_reference],
        judged=judged,
    )
