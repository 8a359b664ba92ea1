"""The backend interface and what a model directory says about itself.

A backend turns one padded batch into task-named arrays:
  run({"input_ids", "attention_mask", "token_type_ids"}: int64 (B, T))
    -> {"classify": (B, L), "ner": (B, T, L), "qa_start": (B, T), "qa_end": (B, T)} (the tasks it has), float32.
It knows its `tasks`, runs a `warmup()`, and is called from one inference thread at a time unless it
sets `concurrent_runs = True` (then from up to --inference-workers threads at once).
"""
from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("bertserve")

TASKS = ("classify", "ner", "qa")
# Output names of an exported graph -> our task-named outputs.
OUTPUT_NAMES = {
    "classify_logits": "classify", "ner_logits": "ner",
    "qa_start_logits": "qa_start", "qa_end_logits": "qa_end",
    "start_logits": "qa_start", "end_logits": "qa_end",
}
_ARCHITECTURE_TASKS = {"BertForSequenceClassification": "classify", "BertForTokenClassification": "ner",
                       "BertForQuestionAnswering": "qa"}


class ModelError(Exception):
    """A model directory cannot be served (missing files, unknown task, backend unavailable)."""


@dataclass
class ModelSpec:
    """What serving needs to know about a checkpoint or artifact directory, read without torch."""

    path: Path
    kind: str  # "checkpoint" | "onnx" | "tensorrt"
    tasks: list[str]
    labels: dict[str, dict[int, str]]  # task -> id2label (qa: {})
    max_position_embeddings: int
    problem_type: str | None
    config: dict
    manifest: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.manifest.get("name") or self.path.name

    @property
    def manifest_max_sequence(self) -> int | None:
        for key in ("max_sequence_length", "max_seq_len", "max_seq", "max_sequence"):
            if isinstance(self.manifest.get(key), int):
                return self.manifest[key]
        shape = self.manifest.get("shape_range") or self.manifest.get("shapes") or {}
        if isinstance(shape, dict):
            for key in ("max_sequence_length", "max_seq_len", "max_seq", "max_sequence"):
                if isinstance(shape.get(key), int):
                    return shape[key]
        return None

    @property
    def manifest_max_batch(self) -> int | None:
        for source in (self.manifest, self.manifest.get("shape_range") or self.manifest.get("shapes") or {}):
            if isinstance(source, dict):
                for key in ("max_batch_size", "max_batch"):
                    if isinstance(source.get(key), int):
                        return source[key]
        return None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelError(f"{path} is not valid JSON: {e}") from None


def _id2label(mapping) -> dict[int, str]:
    if isinstance(mapping, list):
        return dict(enumerate(str(x) for x in mapping))
    return {int(k): str(v) for k, v in (mapping or {}).items()}


def resolve_model_path(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.resolve()
    try:  # a name in the checkpoint store ($BERTSERVE_HOME/checkpoints/NAME); torch-free
        from bert.checkpoint import resolve_checkpoint
        return Path(resolve_checkpoint(name_or_path)).resolve()
    except Exception:  # noqa: BLE001 - any failure means "not found" here
        raise ModelError(f"model {name_or_path!r} not found: not a directory, nor a name in the checkpoint store")


def read_model_spec(path: Path) -> ModelSpec:
    config = _read_json(path / "config.json")
    manifest = _read_json(path / "manifest.json")
    if not config:
        raise ModelError(f"{path} has no config.json")
    if (path / "model.onnx").is_file():
        kind = "onnx"
    elif (path / "model.plan").is_file() or (path / "model.engine").is_file():
        kind = "tensorrt"
    elif (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file() \
            or (path / "pytorch_model.bin").is_file():
        kind = "checkpoint"
    else:
        raise ModelError(f"{path} holds no model.onnx, model.plan or model.safetensors")

    labels: dict[str, dict[int, str]] = {}
    task_labels = config.get("task_labels") or manifest.get("task_labels")
    if task_labels:
        labels = {t: _id2label(v) for t, v in task_labels.items()}
    else:
        task = config.get("task") or manifest.get("task")
        if isinstance(task, list) and len(task) == 1:
            task = task[0]
        if not task:
            task = next((_ARCHITECTURE_TASKS[a] for a in config.get("architectures") or [] if a in _ARCHITECTURE_TASKS),
                        None)
        if not task and isinstance(manifest.get("tasks"), list) and len(manifest["tasks"]) == 1:
            task = manifest["tasks"][0]
        if task not in TASKS:
            raise ModelError(f"{path}: cannot tell which task the model serves (config task {task!r}; "
                             f"expected one of {', '.join(TASKS)} or task_labels)")
        id2label = _id2label(config.get("id2label"))
        if task != "qa" and not id2label:
            id2label = {i: f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}
        labels = {task: id2label if task != "qa" else {}}
    unknown = [t for t in labels if t not in TASKS]
    if unknown:
        raise ModelError(f"{path}: unknown task(s) {unknown}")
    return ModelSpec(path=path, kind=kind, tasks=list(labels), labels=labels,
                     max_position_embeddings=int(config.get("max_position_embeddings", 512)),
                     problem_type=config.get("problem_type"), config=config, manifest=manifest)


def task_outputs(named: dict[str, Any], tasks: list[str], fallback_logits_task: str | None) -> dict[str, np.ndarray]:
    """Rename a graph's outputs ("logits", "start_logits", "classify_logits", ...) to task names, float32."""
    out: dict[str, np.ndarray] = {}
    for name, value in named.items():
        key = OUTPUT_NAMES.get(name)
        if name == "logits" and fallback_logits_task in ("classify", "ner"):
            key = fallback_logits_task
        if key is None:
            continue
        array = np.asarray(value)
        out[key] = array if array.dtype == np.float32 else array.astype(np.float32)
    missing = [t for t in tasks if (t != "qa" and t not in out) or (t == "qa" and not {"qa_start", "qa_end"} <= set(out))]
    if missing:
        raise ModelError(f"the model gave outputs {sorted(named)}, none for task(s) {missing}")
    return out


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


def create_backend(spec: ModelSpec, settings) -> Backend:
    choice = settings.backend
    if ":" in choice:  # "package.module:factory" — a custom backend (tests use one that fails on purpose)
        module_name, _, attr = choice.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        return factory(spec, settings)
    if choice == "auto":
        choice = {"onnx": "onnxruntime", "tensorrt": "tensorrt", "checkpoint": "torch"}[spec.kind]
    if choice == "torch":
        if spec.kind != "checkpoint":
            raise ModelError(f"the torch backend needs a checkpoint dir (model.safetensors); {spec.path} is an "
                             f"{spec.kind} artifact")
        from serving.backends.torch_backend import TorchBackend
        return TorchBackend(spec, settings)
    if choice == "onnxruntime":
        if not (spec.path / "model.onnx").is_file():
            raise ModelError(f"the onnxruntime backend needs {spec.path}/model.onnx")
        from serving.backends.onnx_backend import OnnxBackend
        return OnnxBackend(spec, settings)
    if choice == "tensorrt":
        from serving.backends.tensorrt_backend import TensorRTBackend
        return TensorRTBackend(spec, settings)
    raise ModelError(f"unknown backend {choice!r}")
