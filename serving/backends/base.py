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

from bert.config import BertConfig, ConfigError
from bert.errors import json_type, one_line

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
    """The JSON object in `path`; {} when there is no such file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise ModelError(f"{path} is not a readable JSON file: {one_line(e, 200)}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} must hold a JSON object, not a JSON {json_type(data)}")
    return data


def _id2label(mapping) -> dict[int, str]:
    if isinstance(mapping, list):
        return dict(enumerate(str(x) for x in mapping))
    if not isinstance(mapping, dict):
        raise ValueError(f"labels must be a list or an id -> label object, got {mapping!r:.80}")
    return {int(k): str(v) for k, v in mapping.items()}


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
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json")
    try:  # the rules, and messages, every part of bertserve has for a config.json (torch-free)
        BertConfig.from_json_file(path / "config.json")
    except ConfigError as e:
        raise ModelError(str(e)) from None
    config = _read_json(path / "config.json")
    manifest = _read_json(path / "manifest.json")
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
        try:
            labels = {t: _id2label(v) for t, v in dict(task_labels).items()}
        except (TypeError, ValueError) as e:
            where = path / ("config.json" if config.get("task_labels") else "manifest.json")
            raise ModelError(f"{where}: task_labels must map each task to its labels: {e}") from None
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


def output_key(name: str, fallback_logits_task: str | None) -> str | None:
    """The task-named output ("classify", "ner", "qa_start", "qa_end") a graph output gives, if any: a
    plain "logits" belongs to the one task of a single-task model."""
    if name == "logits" and fallback_logits_task in ("classify", "ner"):
        return fallback_logits_task
    return OUTPUT_NAMES.get(name)


def _tasks_without_outputs(keys, tasks: list[str]) -> list[str]:
    keys = set(keys)
    return [t for t in tasks if (t != "qa" and t not in keys) or (t == "qa" and not {"qa_start", "qa_end"} <= keys)]


def task_outputs(named: dict[str, Any], tasks: list[str], fallback_logits_task: str | None) -> dict[str, np.ndarray]:
    """Rename a graph's outputs ("logits", "start_logits", "classify_logits", ...) to task names, float32."""
    out: dict[str, np.ndarray] = {}
    for name, value in named.items():
        key = output_key(name, fallback_logits_task)
        if key is None:
            continue
        array = np.asarray(value)
        out[key] = array if array.dtype == np.float32 else array.astype(np.float32)
    missing = _tasks_without_outputs(out, tasks)
    if missing:
        raise ModelError(f"the model gave outputs {sorted(named)}, none for task(s) {missing}")
    return out


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Rank of each task-named output: (batch, labels), (batch, sequence, labels), (batch, sequence).
OUTPUT_RANKS = {"classify": 2, "ner": 3, "qa_start": 2, "qa_end": 2}


def check_model_io(model_file: Path, spec: ModelSpec, inputs: dict[str, tuple[list, bool]],
                   outputs: dict[str, list]) -> None:
    """A graph must take BERT's inputs and give what every task of its directory needs: checked when it
    loads, so that a graph that does not fit stops the server at startup with one line naming the file,
    instead of failing its warm-up or its first request.

    inputs: name -> (shape, whether its element type is an integer type); outputs: name -> shape. Shapes
    are lists whose entries are ints, or names/None for dynamic axes."""
    expected = ", ".join(MODEL_INPUTS)
    unknown = [n for n in inputs if n not in MODEL_INPUTS]
    if unknown or "input_ids" not in inputs:
        raise ModelError(f"{model_file} takes inputs {', '.join(inputs) or 'none'}; a BERT graph takes input_ids "
                         f"and may take attention_mask and token_type_ids ({expected})")
    for name, (shape, integer) in inputs.items():
        if shape is not None and len(shape) != 2:
            raise ModelError(f"{model_file}: input {name} has shape {shape}; it must be (batch, sequence)")
        if not integer:
            raise ModelError(f"{model_file}: input {name} is not an integer tensor (int64 or int32)")
    fallback = spec.tasks[0] if len(spec.tasks) == 1 else None
    keys = {output_key(name, fallback): (name, shape) for name, shape in outputs.items()}
    keys.pop(None, None)
    missing = _tasks_without_outputs(keys, spec.tasks)
    if missing:
        raise ModelError(f"{model_file} gives outputs {', '.join(outputs)}, none for task(s) {', '.join(missing)} "
                         f"that its directory's config.json (or manifest.json) declares")
    for key, (name, shape) in keys.items():
        if shape is None:
            continue
        if len(shape) != OUTPUT_RANKS[key]:
            raise ModelError(f"{model_file}: output {name} has {len(shape)} dimensions; {key} needs "
                             f"{OUTPUT_RANKS[key]}")
        task_labels = spec.labels.get(key)
        if task_labels and isinstance(shape[-1], int) and shape[-1] != len(task_labels):
            raise ModelError(f"{model_file}: output {name} gives {shape[-1]} scores per {key} prediction; "
                             f"{spec.path / 'config.json'} has {len(task_labels)} {key} labels")


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
