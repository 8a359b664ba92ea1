"""TensorRT backend: runs an engine plan (model.plan) built by `python -m export.tensorrt`.

The engine runtime (bert/tensorrt_runtime.py, shared with export) needs the `tensorrt` package and a CUDA
device; both are imported only when this backend is chosen, and their absence is a clear error."""

from __future__ import annotations

import numpy as np

from runtime.backends.base import Backend
from runtime.backends.graph_io import servable_tasks
from runtime.backends.outputs import task_outputs
from runtime.model_dir import ModelError, ModelSpec


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(self, spec: ModelSpec, settings):
        super().__init__(spec)
        plan = next((spec.path / n for n in ("model.plan", "model.engine") if (spec.path / n).is_file()), None)
        if plan is None:
            raise ModelError(f"the tensorrt backend needs {spec.path}/model.plan (python -m export.tensorrt)")
        try:
            import tensorrt  # noqa: F401  - checked first for a clearer message than the runtime's
        except ImportError:
            raise ModelError(
                "the tensorrt backend needs the `tensorrt` package (pip install tensorrt) "
                "and an NVIDIA GPU; use --backend onnxruntime or torch instead"
            ) from None
        from bert.tensorrt_runtime import TrtEngine

        self.engine = TrtEngine(str(plan))
        self.tasks = servable_tasks(spec, self.engine.output_names, plan)
        self.precision = str(spec.manifest.get("precision", "fp16"))

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {
            k: np.ascontiguousarray(batch[k], dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")
        }
        return task_outputs(self.engine.run(feed), self.tasks, feed.get("attention_mask"), self.spec.pooling)
