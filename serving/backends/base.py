"""The backend interface and what a model directory says about itself.

A backend turns one padded batch into the arrays its tasks read:
  run({"input_ids", "attention_mask", "token_type_ids"}: int64 (B, T)) -> {output name: array}
with the outputs of every task it serves, named and shaped as each task declares them (Task.outputs and
output_ranks in bert/tasks: (B, ...) for a per-sequence output, (B, T, ...) for a per-token one); float32,
or int64 for ids (a masked-LM head's top-K token ids).
It knows its `tasks`, runs a `warmup()`, and is called from one inference thread at a time unless it
sets `concurrent_runs = True` (then from up to --inference-workers threads at once).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bert.checkpoint import CheckpointError
from bert.config import BertConfig, ConfigError, head_layout
from bert.digest import listed_entries, mismatches
from bert.errors import read_json_object
from bert.tasks import TASKS, registry
from bert.tasks.embed import Pooling, PoolingError, pool, read_pooling

log = logging.getLogger("bertserve")

HIDDEN_STATES = "last_hidden_state"  # an encoder graph's token states: tasks without a head derive theirs from it


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
    # Any encoder serves the tasks without a head of their own (embed), beside its heads.
    tasks = list(labels) + [t for t in TASKS if TASKS[t].head is None]
    try:
        pooling = read_pooling(path)
    except PoolingError as e:
        raise ModelError(str(e)) from None
    return ModelSpec(
        path=path,
        kind=kind,
        tasks=tasks,
        labels={t: labels.get(t, {}) for t in tasks},
        # usable positions (RoBERTa's table has pad_token_id + 1 rows more: bert/families.py)
        max_position_embeddings=parsed.max_position_embeddings,
        problem_type=config.get("problem_type"),
        config=config,
        manifest=manifest,
        pooling=pooling,
    )


# What the server reads from an artifact directory: each must be in its manifest, with the same size and sha256.
ARTIFACT_GRAPHS = ("model.onnx", "model.plan", "model.engine")
ARTIFACT_READS = (
    *ARTIFACT_GRAPHS,
    "config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
)
UNVERIFIED_HINT = (
    "re-export it (python -m export.onnx), or pass --allow-unverified (BERTSERVE_ALLOW_UNVERIFIED=1) "
    "to serve it as it is"
)


def verify_artifact(spec: ModelSpec) -> None:
    """An artifact directory is served only as its manifest describes it: a directory whose manifest is missing,
    lists no files, or does not match them (a copy cut short, a file edited or swapped, a graph from another
    export beside this config) is refused with one line. Checkpoint directories are not artifacts."""
    path = spec.path
    if spec.kind == "checkpoint":
        return
    graphs = ", ".join(n for n in ARTIFACT_GRAPHS if (path / n).is_file())
    if not (path / "manifest.json").is_file():
        raise ModelError(
            f"{path} holds {graphs} but no manifest.json, so nothing says its files are whole and "
            f"belong together; {UNVERIFIED_HINT}"
        )
    listed = listed_entries(spec.manifest.get("files"))
    if not listed:
        raise ModelError(
            f"{path / 'manifest.json'} lists no size and sha256 of the files (an older or hand-made "
            f"manifest); {UNVERIFIED_HINT}"
        )
    problems = mismatches(path, listed, ARTIFACT_READS)
    if problems:
        raise ModelError(f"{path} does not match its manifest.json: {'; '.join(problems)}; {UNVERIFIED_HINT}")


def graph_outputs(tasks: list[str]) -> dict[str, list[str]]:
    """Output names a graph serving `tasks` may have -> the output names of ours each one feeds: every task's
    multi-task names ("classify_logits") and single-task names ("logits"). One graph output may feed several
    tasks: a one-output classifier's "logits" is both classify's and rerank's (one head serves both)."""
    table: dict[str, list[str]] = defaultdict(list)
    for task in tasks:
        for name, ours in {**TASKS[task].graph_outputs, **TASKS[task].single_graph_outputs}.items():
            if ours not in table[name]:
                table[name].append(ours)
    return dict(table)


def servable_tasks(spec: ModelSpec, output_names, model_file: Path | str = "the model") -> list[str]:
    """The spec's tasks a graph with these outputs can serve: every headed task must find its outputs (else
    ModelError naming them); a task without a head is served when the graph has its outputs, or token states
    to derive them from, and left out otherwise."""
    names = list(output_names)
    mapped = {ours for name, feeds in graph_outputs(spec.tasks).items() if name in names for ours in feeds}
    missing = registry.missing_outputs(spec.headed_tasks, mapped)
    if missing:
        raise ModelError(
            f"{model_file} gives outputs {', '.join(names)}, none for task(s) {', '.join(missing)} that "
            f"its directory's config.json (or manifest.json) declares"
        )
    optional = [t for t in spec.tasks if TASKS[t].head is None]
    served = [t for t in optional if not registry.missing_outputs([t], mapped) or HIDDEN_STATES in names]
    for task in set(optional) - set(served):
        log.info(
            "%s: no %s output in the graph (re-export with --task %s, or multi), so %s is not served",
            spec.path,
            "/".join(TASKS[task].graph_outputs),
            task,
            task,
        )
    return spec.headed_tasks + served


def task_outputs(
    named: dict[str, Any], tasks: list[str], attention_mask: np.ndarray | None = None, pooling: Pooling | None = None
) -> dict[str, np.ndarray]:
    """A graph's outputs ("logits", "start_logits", "classify_logits", "embedding", ...) under our names, float32.
    A task without a head whose output the graph lacks is derived from its token states (the embed task pools
    `last_hidden_state` with the batch's attention mask)."""
    mapping = graph_outputs(tasks)
    out: dict[str, np.ndarray] = {}
    for name, value in named.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.dtype != np.float32:
            array = array.astype(np.float32)  # float16 graphs; integer outputs (token ids) stay integers
        for key in mapping.get(name, ()):
            out[key] = array
    if HIDDEN_STATES in named:  # an encoder graph: the pooled embedding is computed here
        for task in registry.missing_outputs([t for t in tasks if TASKS[t].head is None], out):
            out.update(
                {
                    name: pool(named[HIDDEN_STATES], attention_mask, (pooling or Pooling()).mode)
                    for name in TASKS[task].outputs
                }
            )
    missing = registry.missing_outputs(tasks, out)
    if missing:
        raise ModelError(f"the model gave outputs {sorted(named)}, none for task(s) {missing}")
    return out


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def check_model_io(
    model_file: Path, spec: ModelSpec, inputs: dict[str, tuple[list, bool]], outputs: dict[str, list]
) -> list[str]:
    """A graph must take BERT's inputs and give what every task of its directory needs: checked when it
    loads, so that a graph that does not fit stops the server at startup with one line naming the file,
    instead of failing its warm-up or its first request. Returns the tasks it serves (servable_tasks).

    inputs: name -> (shape, whether its element type is an integer type); outputs: name -> shape. Shapes
    are lists whose entries are ints, or names/None for dynamic axes."""
    expected = ", ".join(MODEL_INPUTS)
    unknown = [n for n in inputs if n not in MODEL_INPUTS]
    if unknown or "input_ids" not in inputs:
        raise ModelError(
            f"{model_file} takes inputs {', '.join(inputs) or 'none'}; a BERT graph takes input_ids "
            f"and may take attention_mask and token_type_ids ({expected})"
        )
    for name, (shape, integer) in inputs.items():
        if shape is not None and len(shape) != 2:
            raise ModelError(f"{model_file}: input {name} has shape {shape}; it must be (batch, sequence)")
        if not integer:
            raise ModelError(f"{model_file}: input {name} is not an integer tensor (int64 or int32)")
    mapping = graph_outputs(spec.tasks)
    mapping[HIDDEN_STATES] = [HIDDEN_STATES]
    ranks = {out: rank for t in TASKS.values() for out, rank in zip(t.outputs, t.output_ranks)}
    ranks[HIDDEN_STATES] = 3
    owner = {out: t.name for t in TASKS.values() for out in t.outputs}
    for name, shape in outputs.items():
        if shape is None:
            continue
        for key in mapping.get(name, ()):
            if len(shape) != ranks[key]:
                raise ModelError(f"{model_file}: output {name} has {len(shape)} dimensions; {key} needs {ranks[key]}")
            # an output with a score per label: the labels of the task it belongs to
            task = owner.get(key)
            labels = spec.labels.get(task) if task is not None and TASKS[task].labelled else None
            if labels and isinstance(shape[-1], int) and shape[-1] != len(labels):
                raise ModelError(
                    f"{model_file}: output {name} gives {shape[-1]} scores per {key} prediction; "
                    f"{spec.path / 'config.json'} has {len(labels)} {key} labels"
                )
    return servable_tasks(spec, outputs, model_file)


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
