"""What an exported graph (ONNX, TensorRT) must take and give to serve its directory's tasks: checked when it
loads, so that a graph that does not fit stops the server at startup with one line naming the file."""

from __future__ import annotations

import logging
from pathlib import Path

from bert.tasks import TASKS, registry
from runtime.backends.outputs import HIDDEN_STATES, graph_outputs
from runtime.model_dir import ModelError, ModelSpec

log = logging.getLogger("bertserve")

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
