"""A backend that runs no model: zeros (and unit vectors for embed) of the shapes the tasks expect, at once.

    python -m serving --model serving/demo_model --backend bench.noop_backend:NoopBackend
    python -m bench.server_profile --model serving/demo_model --serving-args "--backend bench.noop_backend:NoopBackend"

Everything a request costs but the model (HTTP, validation, tokenising, batching, decoding, metrics): the
server's CPU per request with this backend is the share of the time outside the model (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from serving.backends.base import Backend


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
            out["qa_start"] = np.zeros((rows, width), np.float32)
            out["qa_end"] = np.zeros((rows, width), np.float32)
        if "embed" in self.tasks:
            out["embed"] = np.full((rows, self.hidden), self.hidden**-0.5, np.float32)
        return out
