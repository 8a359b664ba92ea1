"""Output names: a model's outputs ("logits", "start_logits", "classify_logits", "embedding", ...) -> ours
("classify", "qa_start", "embed", ...), as each task declares them (Task.graph_outputs, single_graph_outputs in
bert/tasks). Every backend hands its model's outputs through task_outputs."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import numpy as np

from bert.pooling import pool
from bert.tasks import TASKS, registry
from bert.tasks.embed import Pooling
from runtime.model_dir import ModelError

HIDDEN_STATES = "last_hidden_state"  # an encoder graph's token states: tasks without a head derive theirs from it


def graph_outputs(tasks: list[str]) -> dict[str, list[str]]:
    """Output names a model serving `tasks` may give -> the output names of ours each one feeds: every task's
    multi-task names ("classify_logits", what the torch model's table and a multi-task graph use) and
    single-task names ("logits"). One output may feed several tasks: a one-output classifier's "logits" is both
    classify's and rerank's (one head serves both)."""
    return {name: list(ours) for name, ours in _mapping(tuple(tasks)).items()}


@functools.lru_cache(maxsize=64)
def _mapping(tasks: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    table: dict[str, list[str]] = defaultdict(list)
    for task in tasks:
        for name, ours in {**TASKS[task].graph_outputs, **TASKS[task].single_graph_outputs}.items():
            if ours not in table[name]:
                table[name].append(ours)
    return {name: tuple(ours) for name, ours in table.items()}


def task_outputs(
    named: dict[str, Any], tasks: list[str], attention_mask: np.ndarray | None = None, pooling: Pooling | None = None
) -> dict[str, np.ndarray]:
    """A model's outputs ("logits", "start_logits", "classify_logits", "embedding", ...) under our names, float32
    (what every backend hands back). A task without a head whose output the model lacks is derived from its
    token states (the embed task pools `last_hidden_state` with the batch's attention mask)."""
    mapping = _mapping(tuple(tasks))
    out: dict[str, np.ndarray] = {}
    for name, value in named.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.dtype != np.float32:
            array = array.astype(np.float32)  # float16 graphs; integer outputs (token ids) stay integers
        for key in mapping.get(name, ()):
            out[key] = array
    if HIDDEN_STATES in named:  # an encoder graph: the pooled embedding is computed here, the token states are it
        for task in registry.missing_outputs([t for t in tasks if TASKS[t].head is None], out):
            states = named[HIDDEN_STATES]
            if TASKS[task].encoder_output != HIDDEN_STATES:
                states = pool(states, attention_mask, (pooling or Pooling()).mode)
            out.update(dict.fromkeys(TASKS[task].outputs, states))
    missing = registry.missing_outputs(tasks, out)
    if missing:
        raise ModelError(f"the model gave outputs {sorted(named)}, none for task(s) {missing}")
    return out
