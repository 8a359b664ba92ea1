"""The backend interface: what every backend is and does (model directories: runtime/model_dir.py; artifact
checks: runtime/artifact.py; output names: outputs.py; what a graph must take and give: graph_io.py).

A backend is handed a batch's sequences as they are, unpadded, and answers the whole batch at once:
  run_batch([Features]) -> BatchOutputs: {output name: array} over the batch, never cut per sequence
with the outputs of every task it serves, named and shaped as each task declares them (Task.outputs and
output_ranks in bert/tasks): (B, ...) for a per-sequence output, a per-token one either padded (B, T, ...) or
packed (N, ...) over the batch's N real tokens; float32, or int64 for ids (a masked-LM head's top-K token ids).
Padding or packing is the backend's own business: by default the sequences are right-padded into one batch for
`run`; a backend that packs (torch's fast path) overrides run_batch and never pads. A caller takes one
sequence's rows from BatchOutputs when it decodes that sequence, and only the outputs it reads.
  run({"input_ids", "attention_mask", "token_type_ids"}: int64 (B, T)) -> {output name: (B, ...) array}
It knows its `tasks`, runs a `warmup()`, and is called from one inference thread at a time unless it
sets `concurrent_runs = True` (then from several threads at once).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bert.tasks import Features, pad_batch, registry
from runtime.model_dir import ModelError, ModelSpec

# ModelError: what a backend raises when it cannot serve; BackendError: a batch it ran gave what it must not
__all__ = ["Backend", "BackendError", "BatchOutputs", "ModelError", "threads_per_run"]
PER_TOKEN_OUTPUTS = registry.per_token_outputs()  # a row per token: each sequence gets its own length's rows


class BackendError(Exception):
    """A batch's outputs do not fit the batch (another number of rows, a per-token output without a token axis):
    the batch fails, never a silent mismatch."""


class BatchOutputs:
    """A batch's outputs whole, as the backend computed them: per-sequence outputs (B, ...); per-token ones padded
    (B, T, ...), or packed (N, ...) when `offsets` (B + 1 token offsets, cu_seqlens) is given. `sequence(i)`: the
    rows of the i-th sequence, cut from the arrays only for the outputs its decoder reads."""

    __slots__ = ("arrays", "lengths", "offsets")

    def __init__(self, arrays: dict[str, np.ndarray], lengths: list[int], offsets: list[int] | None = None):
        rows = len(lengths)
        for key, value in arrays.items():
            per_token = key in PER_TOKEN_OUTPUTS
            expected = offsets[-1] if per_token and offsets is not None else rows
            if np.ndim(value) < (2 if per_token and offsets is None else 1) or len(value) != expected:
                raise BackendError(
                    f"backend returned {len(value) if np.ndim(value) else 0} rows of {key!r} (shape "
                    f"{np.shape(value)}) for {rows} sequences"
                )
        self.arrays, self.lengths, self.offsets = arrays, lengths, offsets

    def __len__(self) -> int:
        return len(self.lengths)

    def sequence(self, i: int) -> SequenceOutputs:
        return SequenceOutputs(self, i)

    def rows(self, key: str, i: int) -> np.ndarray:
        value = self.arrays[key]
        if key not in PER_TOKEN_OUTPUTS:
            return value[i]
        if self.offsets is not None:
            return value[self.offsets[i] : self.offsets[i + 1]]
        return value[i, : self.lengths[i]]


class SequenceOutputs(Mapping):
    """One sequence's outputs ({output name: its rows}), each cut from its batch's array when read."""

    __slots__ = ("_batch", "_i")

    def __init__(self, batch: BatchOutputs, i: int):
        self._batch, self._i = batch, i

    def __getitem__(self, key: str) -> np.ndarray:
        return self._batch.rows(key, self._i)

    def __iter__(self):
        return iter(self._batch.arrays)

    def __len__(self) -> int:
        return len(self._batch.arrays)


class Backend:
    """Base class; subclasses set name, tasks, precision and implement run() (or run_batch())."""

    name = "base"
    concurrent_runs = False  # True: run_batch() may be called from several threads at once
    pad_token_id = 0  # what padding is made of (the engine sets its tokenizer's)
    pad_to_multiple_of: int | None = None  # padded widths rounded up to a multiple of this (tensor-core shapes)
    # Sequences a batch holds on a CPU when --max-batch-requests is not given. Small for onnxruntime, whose kernels
    # cost little per batch, so a bigger batch of short texts mostly adds padding; the torch backend pays its
    # per-operator cost once per batch and sets more (figures: docs/serving.md, --max-batch-requests).
    cpu_batch_requests = 4
    # A batch's padded tokens on a CPU when --max-batch-tokens is not given (None: the flag's default). The torch
    # backend's 32 sequences are for short texts; 32 long windows make one batch that every request queued behind
    # it waits for, and run slower than small batches of them (docs/serving.md, "Batch size on a CPU, per backend").
    cpu_batch_tokens: int | None = None

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.tasks = list(spec.tasks)
        self.precision = "fp32"
        self.max_batch_size: int | None = spec.manifest_max_batch
        self.max_sequence_length: int | None = spec.manifest_max_sequence

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError

    def run_batch(self, sequences: list[Features]) -> BatchOutputs:
        """The batch's outputs: the sequences right-padded into one batch for run(). Outputs of another number of
        rows, or a per-token output without a token axis, fail the batch (BackendError)."""
        batch = pad_batch(sequences, self.pad_token_id, self.pad_to_multiple_of)
        return BatchOutputs(self.run(batch), [len(s) for s in sequences])

    def warmup(self, max_length: int = 128, max_batch: int = 8) -> None:
        """Run a few shapes once so that the first real request does not pay for lazy initialisation."""
        for batch_size, length in ((1, 8), (min(max_batch, 4), min(max_length, 64)), (min(max_batch, 8), max_length)):
            ids = ([101] + [100] * (length - 2) + [102])[-length:]
            self.run_batch([Features(ids, [0] * length) for _ in range(batch_size)])

    def close(self) -> None:
        pass


def threads_per_run(settings, available: int) -> int | None:
    """CPU threads for one run: --threads (default: all `available`) shared by the inference workers;
    None when neither is set (the runtime's own choice)."""
    workers = settings.effective_inference_workers
    if workers == 1:
        return settings.threads
    return max(1, (settings.threads or available) // workers)
