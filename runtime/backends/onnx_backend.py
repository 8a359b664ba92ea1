"""onnxruntime backend for an exported artifact dir (model.onnx). Imports no torch.

CPU by default; with --device cuda it uses the TensorRT and CUDA execution providers that the
installed onnxruntime offers (onnxruntime-gpu), falling back to CPU for what they cannot run."""

from __future__ import annotations

import logging
import os

import numpy as np

from bert.errors import one_line
from runtime.backends.base import Backend, threads_per_run
from runtime.backends.graph_io import check_model_io
from runtime.backends.outputs import task_outputs
from runtime.model_dir import ModelError, ModelSpec

log = logging.getLogger("bertserve")
_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class OnnxBackend(Backend):
    name = "onnxruntime"
    concurrent_runs = True  # InferenceSession.run is thread-safe; each call computes on its own thread(s)

    def __init__(self, spec: ModelSpec, settings):
        super().__init__(spec)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        threads = threads_per_run(settings, os.cpu_count() or 1)
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        # Idle intra-op threads sleep instead of spinning: in a server they share the cores with the event
        # loop that parses the next requests (measured: docs/serving.md, "Why it is built this way").
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        available = ort.get_available_providers()
        if settings.device == "cuda":
            wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
            providers = [p for p in wanted if p in available]
            if not providers:
                raise ModelError(f"--device cuda: this onnxruntime offers only {available}; install onnxruntime-gpu")
            providers.append("CPUExecutionProvider")
        else:
            providers = ["CPUExecutionProvider"]
        model_file = spec.path / "model.onnx"
        if model_file.stat().st_size == 0:
            raise ModelError(f"{model_file} is empty (0 bytes), not an ONNX model")
        try:
            self.session = ort.InferenceSession(str(model_file), options, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own classes (InvalidProtobuf, Fail, ...)
            raise ModelError(f"onnxruntime cannot load {model_file}: {one_line(e, 300)}") from None
        self.tasks = check_model_io(
            model_file,
            spec,
            inputs={i.name: (i.shape, i.type in _NUMPY_TYPES) for i in self.session.get_inputs()},
            outputs={o.name: o.shape for o in self.session.get_outputs()},
        )
        self.providers = self.session.get_providers()
        self.inputs = {i.name: _NUMPY_TYPES[i.type] for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.precision = str(spec.manifest.get("precision", "fp32"))
        log.info(
            "onnxruntime session on %s; inputs %s; outputs %s", self.providers, list(self.inputs), self.output_names
        )

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {name: np.ascontiguousarray(batch[name], dtype=dtype) for name, dtype in self.inputs.items()}
        values = self.session.run(self.output_names, feed)
        return task_outputs(
            dict(zip(self.output_names, values)), self.tasks, batch["attention_mask"], self.spec.pooling
        )
