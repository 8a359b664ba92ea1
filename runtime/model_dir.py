"""What a model directory says about itself, read without torch: where a model name points (a directory, a name
in the checkpoint store, a Hub id), and its kind, tasks, labels, limits and pooling (ModelSpec)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from bert.checkpoint import CheckpointError
from bert.config import BertConfig, ConfigError, head_layout
from bert.errors import read_json_object
from bert.tasks import TASKS, registry
from bert.tasks.embed import Pooling, PoolingError, read_pooling

log = logging.getLogger("bertserve")


class ModelError(Exception):
    """A model directory cannot be served (missing files, unknown task, backend unavailable)."""


@dataclass
class ModelSpec:
    """What serving needs to know about a checkpoint or artifact directory, read without torch."""

    path: Path
    kind: str  # "checkpoint" | "onnx" | "tensorrt"
    tasks: list[str]  # those with a head, then those any encoder serves (embed); a backend may drop the latter
    labels: dict[str, dict[int, str]]  # task -> id2label ({} for a task without labels)
    max_position_embeddings: int
    problem_type: str | None
    config: dict
    manifest: dict = field(default_factory=dict)
    pooling: Pooling = field(default_factory=Pooling)  # how the embed task pools (bert.tasks.embed)

    @property
    def headed_tasks(self) -> list[str]:
        """The tasks this directory must serve: those it has a head for."""
        return [t for t in self.tasks if TASKS[t].head is not None]

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
    return read_json_object(path, ModelError) or {}


def _id2label(mapping) -> dict[int, str]:
    if isinstance(mapping, list):
        return dict(enumerate(str(x) for x in mapping))
    if not isinstance(mapping, dict):
        raise ValueError(f"labels must be a list or an id -> label object, got {mapping!r:.80}")
    return {int(k): str(v) for k, v in mapping.items()}


def resolve_model_path(name_or_path: str) -> Path:
    from bert.atomic import old_copy

    path = Path(name_or_path).expanduser()
    if not path.is_dir() and old_copy(path).is_dir():
        # A writer killed (or still running) between its two renames (bert/atomic.py) leaves the previous
        # directory whole as NAME.old. Served where it lies: renaming it back could break a writer still at work.
        log.warning("%s is being replaced or its writer was killed; serving the previous copy %s", path, old_copy(path))
        path = old_copy(path)
    if path.is_dir():
        return path.resolve()
    try:  # a name in the checkpoint store ($BERTSERVE_HOME/checkpoints/NAME); torch-free
        from bert.checkpoint import resolve_checkpoint

        return Path(resolve_checkpoint(name_or_path)).resolve()
    except Exception as e:  # noqa: BLE001 - any failure means "not found" here, but a Hub id's says why
        from bert.hub import is_hub_id

        if is_hub_id(name_or_path):
            raise ModelError(str(e)) from None
        raise ModelError(
            f"model {name_or_path!r} not found: not a directory, nor a name in the checkpoint store"
        ) from None


def read_model_spec(path: Path) -> ModelSpec:
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json")
    try:  # the rules, and messages, every part of bertserve has for a config.json (torch-free)
        parsed = BertConfig.from_json_file(path / "config.json")
    except ConfigError as e:
        raise ModelError(str(e)) from None
    config = _read_json(path / "config.json")
    manifest = _read_json(path / "manifest.json")
    if (path / "model.onnx").is_file():
        kind = "onnx"
    elif (path / "model.plan").is_file() or (path / "model.engine").is_file():
        kind = "tensorrt"
    elif (
        (path / "model.safetensors").is_file()
        or (path / "model.safetensors.index.json").is_file()
        or (path / "pytorch_model.bin").is_file()
    ):
        kind = "checkpoint"
    else:
        raise ModelError(f"{path} holds no model.onnx, model.plan or model.safetensors")

    labels: dict[str, dict[int, str]] = {}
    task = None
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
        if not task and isinstance(manifest.get("tasks"), list) and len(manifest["tasks"]) == 1:
            task = manifest["tasks"][0]
        if task in ("encoder", "multi"):  # export's names for a bare encoder graph / a multi-task one
            task = None
        if task is not None and task not in TASKS:
            raise ModelError(f"{path}: config task {task!r} is not one of {', '.join(TASKS)}")
        # The heads of a checkpoint made for one task: every task its architecture serves (one head may serve
        # several), what the torch backend's model holds too.
        try:
            labels = {
                t: _id2label(v)
                for t, v in head_layout(
                    dataclasses.replace(BertConfig.from_json_file(path / "config.json"), task=task)
                )[0].items()
            }
        except (ConfigError, CheckpointError) as e:
            raise ModelError(str(e)) from None
    unknown = [t for t in labels if t not in TASKS or TASKS[t].head is None]
    if unknown:
        raise ModelError(
            f"{path}: task_labels names {unknown}, not tasks with a head ({', '.join(registry.with_heads())})"
        )
    # Any encoder serves the tasks without a head of their own (embed), beside its heads; those served only where
    # asked (not Task.served_by_default) when the directory was made for one (its config's task) or a server asks
    # for one (load_model).
    tasks = list(labels)
    tasks += [t for t in TASKS if TASKS[t].head is None and (TASKS[t].served_by_default or t == task)]
    try:
        pooling = read_pooling(path)
    except PoolingError as e:
        raise ModelError(str(e)) from None
    return ModelSpec(
        path=path,
        kind=kind,
        tasks=tasks,
        labels={t: labels.get(t, {}) for t in tasks},
        # usable positions (RoBERTa's table has pad_token_id + 1 rows more: bert/families/roberta.py)
        max_position_embeddings=parsed.max_position_embeddings,
        problem_type=config.get("problem_type"),
        config=config,
        manifest=manifest,
        pooling=pooling,
    )
