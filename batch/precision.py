"""--precision auto: what a job runs its model in on this machine.

A batch job's batches are large and its texts many, which is where bf16 on a CPU that multiplies it in hardware
pays: torch with the encoder layers' matmuls in bfloat16 (bert/precision.py) ran an embed job on a checkpoint
faster than fp32 by far on AMX and on AVX512-BF16 alone (with AMX, faster than the int8 ONNX export too), every
embedding within cosine 0.99 of fp32 (docs/benchmarks.md, "Batch jobs"). So on such a CPU auto runs an embed job on
a checkpoint in bf16; everywhere else the backend's own default (an artifact's precision, fixed at export; fp32 for a
checkpoint on CPU; fp16 on CUDA). An explicit --precision always wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from bert.precision import bf16_units

AUTO = "auto"
# Tasks whose bf16 answers were checked against fp32 (embed: cosine >= 0.99 on every row). A head's scores and
# labels in bf16 (classify, ner, qa, ...) would no longer equal what the server answers in fp32.
BF16_TASKS = ("embed",)


@dataclass(frozen=True)
class Choice:
    precision: str | None  # None: the backend's own default
    why: str  # a few words for the manifest and the closing line


def choose_precision(
    requested: str | None, *, task: str, device: str, kind: str, backend: str, flags: frozenset[str]
) -> Choice:
    """The precision a job runs in. `kind`: the model directory's (ModelSpec.kind: checkpoint, onnx, tensorrt);
    `backend`: --backend; `flags`: the CPU's (cpu_flags())."""
    if requested != AUTO:
        return Choice(requested, f"--precision {requested or 'default'}")
    if device != "cpu":
        return Choice(None, "auto: the device's default")
    if kind != "checkpoint" or backend not in (AUTO, "torch"):
        return Choice(None, "auto: the artifact's own")
    units = bf16_units(flags)
    if task in BF16_TASKS and units:
        return Choice("bf16", f"auto: bf16 matmuls ({units[0]})")
    if task not in BF16_TASKS:
        return Choice(None, f"auto: fp32 ({task} is not checked in bf16)")
    return Choice(None, "auto: fp32 (no bf16 units on this CPU: neither AMX nor AVX512-BF16)")
