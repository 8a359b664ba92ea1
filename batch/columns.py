"""Per task: which input columns it reads, how a row becomes the codec's item, and how the codec's answers
become typed Arrow columns, as each task declares them (`Task.job`, bert/tasks); the codecs themselves are the
tasks' own, as the server runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from bert.tasks import TASKS

_SCALARS = {"string": pa.string(), "float32": pa.float32(), "int32": pa.int32(), "int64": pa.int64()}


def arrow_type(kind, width: int | None) -> pa.DataType:
    """A result column's declared type (bert/tasks/base.py, JobColumns) as Arrow's; "vector" is `width` float32."""
    if kind == "vector":
        return pa.list_(pa.float32(), width)
    if isinstance(kind, tuple) and kind[0] == "list":
        return pa.list_(arrow_type(kind[1], width))
    if isinstance(kind, tuple) and kind[0] == "struct":
        return pa.struct([(name, arrow_type(inner, width)) for name, inner in kind[1]])
    return _SCALARS[kind]


@dataclass(frozen=True)
class TaskColumns:
    inputs: tuple[str, ...]  # the default --column
    arity: tuple[int, ...]  # how many columns it may read
    to_item: Callable[[list[str], dict], Any]  # the row's texts, the job's options -> the codec's item
    options: Callable[[dict], dict]  # the job's options -> the codec's options
    fields: Callable[[int | None], list[pa.Field]]  # result columns (given the encoder's width)
    to_columns: Callable[[list, int], dict[str, list]]  # answers (None for a failed row) -> column values


def columns_of(task) -> TaskColumns:
    """What a task declares for batch jobs (`Task.job`), as the job reads it."""
    job = task.job
    return TaskColumns(
        job.inputs,
        job.arity,
        job.to_item,
        task.job_options,
        lambda width: [pa.field(name, arrow_type(kind, width)) for name, kind in job.results],
        lambda answers, width: job.values(answers),
    )


COLUMNS: dict[str, TaskColumns] = {name: columns_of(task) for name, task in TASKS.items() if task.job is not None}


def result_schema(task: str, width: int | None) -> pa.Schema:
    """The result columns of `task` and the `error` column (null for a good row)."""
    return pa.schema([*COLUMNS[task].fields(width), pa.field("error", pa.string())])


def result_table(task: str, width: int | None, answers: list, errors: list) -> pa.Table:
    """Answers (None where the row failed) and errors as a table of result_schema."""
    schema = result_schema(task, width)
    values = COLUMNS[task].to_columns(answers, width)
    arrays = []
    for field in schema:
        if field.name == "error":
            arrays.append(pa.array(errors, pa.string()))
        elif pa.types.is_fixed_size_list(field.type):
            arrays.append(_fixed_size(values[field.name], field.type))
        else:
            arrays.append(pa.array(values[field.name], field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _fixed_size(vectors: list, kind: pa.FixedSizeListType) -> pa.Array:
    """Vectors (None for a failed row) as a fixed-size list array, built from one float32 buffer."""
    width = kind.list_size
    flat = np.zeros((len(vectors), width), dtype=np.float32)
    valid = np.array([v is not None for v in vectors], dtype=bool)
    if valid.any():
        flat[valid] = np.asarray([v for v in vectors if v is not None], dtype=np.float32)
    mask = pa.array(~valid) if not valid.all() else None
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width, mask=mask)
