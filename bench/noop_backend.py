"""A backend that runs no model: outputs of the shapes the tasks expect, at once.

Zeros for classify and ner, unit vectors for embed, and for qa start/end logits that vary with each token and its
position (a fixed hash of both, the same whatever a sequence is batched with), so that the span search and the
answers' widening to words do the work real logits give them rather than the degenerate work of all-equal ones.

    python -m serving --model serving/demo_model --backend bench.noop_backend:NoopBackend
    python -m bench.server_profile --model serving/demo_model --serving-args "--backend bench.noop_backend:NoopBackend"

Everything a request costs but the model (HTTP, validation, tokenising, batching, decoding, metrics): the
server's CPU per request with this backend is the share of the time outside the model (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from runtime.backends.base import Backend


class NoopBackend(Backend):
    name = "noop"
    concurrent_runs = True

    def __init__(self, spec, settings):
        super().__init__(spec)
        self.labels = {task: max(1, len(spec.labels.get(task, {}))) for task in self.tasks}
        self.hidden = int(spec.config.get("hidden_size", 384))

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, width = batch["input_ids"].shape
        out = {}
        if "classify" in self.tasks:
            out["classify"] = np.zeros((rows, self.labels["classify"]), np.float32)
        if "ner" in self.tasks:
            out["ner"] = np.zeros((rows, width, self.labels["ner"]), np.float32)
        if "qa" in self.tasks:
            out["qa_start"], out["qa_end"] = qa_logits(batch["input_ids"])
        if "embed" in self.tasks:
            out["embed"] = np.full((rows, self.hidden), self.hidden**-0.5, np.float32)
        return out


def qa_logits(input_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits in [-4, 4) for (rows, width) token ids: a multiplicative hash of each id and its
    position, so a row's logits depend on that row alone (batched answers equal single ones)."""
    ids = input_ids.astype(np.uint64)
    positions = np.arange(input_ids.shape[1], dtype=np.uint64)
    start = (ids * np.uint64(2654435761) + positions * np.uint64(40503)) % np.uint64(65521)
    end = (ids * np.uint64(40503) + positions * np.uint64(2654435761)) % np.uint64(65519)
    scale = np.float32(8.0 / 65521)
    return start.astype(np.float32) * scale - 4.0, end.astype(np.float32) * scale - 4.0
