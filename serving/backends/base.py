"""The backend interface: what every backend is and does (model directories: model_dir.py; artifact checks:
artifact.py; output names: outputs.py; what a graph must take and give: graph_io.py).

A backend turns one padded batch into the arrays its tasks read:
  run({"input_ids", "attention_mask", "token_type_ids"}: int64 (B, T)) -> {output name: array}
with the outputs of every task it serves, named and shaped as each task declares them (Task.outputs and
output_ranks in bert/tasks: (B, ...) for a per-sequence output, (B, T, ...) for a per-token one); float32,
or int64 for ids (a masked-LM head's top-K token ids).
It knows its `tasks`, runs a `warmup()`, and is called from one inference thread at a time unless it
sets `concurrent_runs = True` (then from up to --inference-workers threads at once).
"""

from __future__ import annotations

import numpy as np

from serving.backends.model_dir import ModelError, ModelSpec

__all__ = ["Backend", "ModelError", "threads_per_run"]  # ModelError: what a backend raises when it cannot serve


class Backend:
    """Base class; subclasses set name, tasks, precision and implement run()."""

    name = "base"
    concurrent_runs = False  # True: run() may be called from several threads at once

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.tasks = list(spec.tasks)
        self.precision = "fp32"
        self.max_batch_size: int | None = spec.manifest_max_batch
        self.max_sequence_length: int | None = spec.manifest_max_sequence

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError

    def warmup(self, max_length: int = 128, max_batch: int = 8) -> None:
        """Run a few shapes once so that the first real request does not pay for lazy initialisation."""
        for batch_size, length in ((1, 8), (min(max_batch, 4), min(max_length, 64)), (min(max_batch, 8), max_length)):
            ids = np.full((batch_size, length), 100, dtype=np.int64)
            ids[:, 0], ids[:, -1] = 101, 102
            self.run({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})

    def close(self) -> None:
        pass


def threads_per_run(settings, available: int) -> int | None:
    """CPU threads for one run: --threads (default: all `available`) shared by the inference workers;
    None when neither is set (the runtime's own choice)."""
    workers = settings.effective_inference_workers
    if workers == 1:
        return settings.threads
    return max(1, (settings.threads or available) // workers)
