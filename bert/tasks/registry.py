"""The task registry: every task object (bert/tasks/<name>.py, `TASK = ...`), found once, read everywhere else.

A task module joins by defining `TASK`, an instance of `bert.tasks.base.Task`; nothing else in bertserve
lists tasks. Training, export, the model's heads, the backends, the batcher, the engine, the routes, the
middleware and the metrics read this table. An unknown name is `UnknownTask`, one line naming the known ones.

torch-free at import time (the task modules it imports need numpy and tokenizers, never torch).
"""

from __future__ import annotations

from pathlib import Path

from bert.discovery import declarations
from bert.tasks.base import Task, UnknownTask

TASKS: dict[str, Task] = {}
_NOT_TASKS = {"base", "common", "registry"}


def register(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is registered twice")
    if (type(task).margins is not Task.margins) != (task.verify_margin is not None):
        raise ValueError(f"task {task.name!r}: a task declares verify_margin if and only if it has margins")
    TASKS[task.name] = task
    return task


def _discover() -> None:
    for task in declarations("bert.tasks", Path(__file__).parent, "TASK", Task, _NOT_TASKS):
        register(task)


_discover()


def canonical(name):
    """A task's registry name, given it or its route's spelling (fill-mask, zero-shot: hyphens for underscores), as
    the commands that name a task read it; anything else is returned as it is, for the caller to refuse."""
    if isinstance(name, str) and name not in TASKS and name.replace("-", "_") in TASKS:
        return name.replace("-", "_")
    return name


def get(name: str) -> Task:
    """The task called `name`, or UnknownTask naming the known ones."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise UnknownTask(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}") from None


# ---- derived tables (read these; never re-declare them) -------------------------------------------
def names(*, trainable: bool | None = None, labelled: bool | None = None) -> tuple[str, ...]:
    """Task names in registration order, optionally only the trainable / labelled ones."""
    return tuple(
        t.name
        for t in TASKS.values()
        if (trainable is None or t.trainable == trainable) and (labelled is None or t.labelled == labelled)
    )


def with_heads() -> tuple[str, ...]:
    """Tasks that need a head of their own (a task without one is served by any encoder)."""
    return tuple(t.name for t in TASKS.values() if t.head is not None)


def per_token_outputs() -> frozenset[str]:
    return frozenset(o for t in TASKS.values() if t.per_token for o in t.outputs)


def tasks_of_architecture(architecture: str, config: dict | None = None) -> tuple[str, ...]:
    """The tasks a checkpoint made for one task alone serves, by its architecture (and, where one architecture
    serves several, what its config says: a one-output sequence classifier is also a reranker)."""
    return tuple(
        t.name
        for t in TASKS.values()
        if t.head is not None and architecture in t.architectures and t.serves(config or {})
    )


def task_of_architecture(architecture: str) -> str | None:
    """The task whose own checkpoints have this architecture first (the one we write for it)."""
    return next((t.name for t in TASKS.values() if t.head is not None and t.architecture == architecture), None)


def routes() -> dict[str, str]:
    """HTTP route -> task."""
    return {route.path: t.name for t in TASKS.values() for route in t.routes}


def missing_outputs(tasks: list[str], present) -> list[str]:
    """The tasks among `tasks` whose outputs are not all in `present`."""
    return [t for t in tasks if not set(TASKS[t].outputs) <= set(present)]
