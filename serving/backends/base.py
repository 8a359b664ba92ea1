"""The backend interface: what every backend is and does (model directories: model_dir.py; artifact checks:
artifact.py; output names: outputs.py; what a graph must take and give: graph_io.py).

The batcher hands a backend a batch's sequences as they are, unpadded, and gets each sequence's outputs back:
  run_sequences([Features]) -> [{output name: array}], one dict per sequence
with the outputs of every task it serves, named and shaped as each task declares them (Task.outputs and
output_ranks in bert/tasks: (...) for a per-sequence output, (L, ...) for a per-token one, L the sequence's
length); float32, or int64 for ids (a masked-LM head's top-K token ids). Padding or packing is the backend's
own business: by default the sequences are right-padded into one batch for `run` and each sequence's rows
are sliced back once; a backend that packs (torch's fast path) overrides run_sequences and never pads.
  run({"input_ids", "attention_mask", "token_type_ids"}: int64 (B, T)) -> {output name: (B, ...) array}
It knows its `tasks`, runs a `warmup()`, and is called from one inference thread at a time unless it
sets `concurrent_runs = True` (then from up to --inference-workers threads at once).
"""

from __future__ import annotations

import numpy as np

from bert.tasks import Features, pad_batch, registry
from serving.backends.model_dir import ModelError, ModelSpec
from serving.errors import BackendFailure

__all__ = ["Backend", "ModelError", "threads_per_run"]  # ModelError: what a backend raises when it cannot serve
PER_TOKEN_OUTPUTS = registry.per_token_outputs()  # a row per token: each sequence gets its own length's rows


class Backend:
    """Base class; subclasses set name, tasks, precision and implement run() (or run_sequences())."""

    name = "base"
    concurrent_runs = False  # True: run_sequences() may be called from several threads at once
    pad_token_id = 0  # what padding is made of (the engine sets its tokenizer's)
    pad_to_multiple_of: int | None = None  # padded widths rounded up to a multiple of this (tensor-core shapes)

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.tasks = list(spec.tasks)
        self.precision = "fp32"
        self.max_batch_size: int | None = spec.manifest_max_batch
        self.max_sequence_length: int | None = spec.manifest_max_sequence

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError

    def run_sequences(self, sequences: list[Features]) -> list[dict[str, np.ndarray]]:
        """Each sequence's outputs: the sequences right-padded into one batch for run(), each one's rows sliced
        back (per-token outputs to its own length). Outputs of another number of rows, or a per-token output
        without a token axis, fail the batch: never a silent mismatch."""
        batch = pad_batch(sequences, self.pad_token_id, self.pad_to_multiple_of)
        return rows_of_each(self.run(batch), [len(s) for s in sequences])

    def warmup(self, max_length: int = 128, max_batch: int = 8) -> None:
        """Run a few shapes once so that the first real request does not pay for lazy initialisation."""
        for batch_size, length in ((1, 8), (min(max_batch, 4), min(max_length, 64)), (min(max_batch, 8), max_length)):
            ids = ([101] + [100] * (length - 2) + [102])[-length:]
            self.run_sequences([Features(ids, [0] * length) for _ in range(batch_size)])

    def close(self) -> None:
        pass


def threads_per_run(settings, available: int) -> int | None:
    """CPU threads for one run: --threads (default: all `available`) shared by the inference workers;
    None when neither is set (the runtime's own choice)."""
    workers = settings.effective_inference_workers
    if workers == 1:
        return settings.threads
    return max(1, (settings.threads or available) // workers)


def rows_of_each(outputs: dict[str, np.ndarray], lengths: list[int]) -> list[dict[str, np.ndarray]]:
    """A padded batch's outputs -> each sequence's rows (per-token outputs cut to the sequence's length)."""
    rows = len(lengths)
    for key, value in outputs.items():
        per_token = key in PER_TOKEN_OUTPUTS
        if np.ndim(value) < (2 if per_token else 1) or len(value) != rows:
            raise BackendFailure(
                f"backend returned {len(value) if np.ndim(value) else 0} rows of {key!r} (shape "
                f"{np.shape(value)}) for {rows} sequences"
            )
    return [
        {k: (v[i, :length] if k in PER_TOKEN_OUTPUTS else v[i]) for k, v in outputs.items()}
        for i, length in enumerate(lengths)
    ]
