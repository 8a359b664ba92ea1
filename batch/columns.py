"""Per task: which input columns it reads, how a row becomes the codec's item, and how the codec's answers
become typed Arrow columns. The codecs themselves are the tasks' own (bert/tasks), as the server runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

ENTITY = pa.struct(
    [
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("word", pa.string()),
        ("entity_group", pa.string()),
        ("score", pa.float32()),
    ]
)
CANDIDATE = pa.struct(
    [("token", pa.int64()), ("token_str", pa.string()), ("score", pa.float32()), ("sequence", pa.string())]
)


@dataclass(frozen=True)
class TaskColumns:
    inputs: tuple[str, ...]  # the default --column
    arity: tuple[int, ...]  # how many columns it may read
    to_item: Callable[[list[str], dict], Any]  # the row's texts, the job's options -> the codec's item
    options: Callable[[dict], dict]  # the job's options -> the codec's options
    fields: Callable[[int | None], list[pa.Field]]  # result columns (given the encoder's width)
    to_columns: Callable[[list, int], dict[str, list]]  # answers (None for a failed row) -> column values
    check: Callable[[dict], None] | None = None  # the job's options checked (ValueError), lists cleaned in place


def _single(texts: list[str], options: dict):
    return texts[0] if len(texts) == 1 else list(texts)


def _pair(texts: list[str], options: dict):
    return list(texts)


def _qa_item(texts: list[str], options: dict) -> dict:
    item = {"question": texts[0], "context": texts[1], "top_k": 1, "max_answer_len": options["max_answer_len"]}
    if options.get("doc_stride") is not None:
        item["doc_stride"] = options["doc_stride"]
    if options.get("truncate"):
        item["truncate"] = True
    return item


def _zero_shot_options(options: dict) -> None:
    from bert.tasks.zero_shot import check_labels, check_template

    labels = options["candidate_labels"]
    labels = labels.split(",") if isinstance(labels, str) else labels
    options["candidate_labels"] = labels = [v.strip() for v in labels if v.strip()]  # "sports, food": no " food"
    if not labels:
        raise ValueError("--candidate-labels is required for zero_shot")
    check_labels(labels, "--candidate-labels: label {}")  # as /zero-shot checks them
    try:
        check_template(options["hypothesis_template"])
    except ValueError as e:
        raise ValueError(f"--hypothesis-template: {e}") from None


def _field(name, kind):
    return pa.field(name, kind)


def _column(answers: list, get) -> list:
    return [None if a is None else get(a) for a in answers]


def _classify(answers: list, width: int) -> dict:
    return {"label": _column(answers, lambda a: a[0]["label"]), "score": _column(answers, lambda a: a[0]["score"])}


def _entities(answers: list, width: int) -> dict:
    def entities(found):
        return [
            {
                "start": e["start"],
                "end": e["end"],
                "word": e["word"],
                "entity_group": e.get("entity_group", e.get("entity")),  # aggregation "none": per-token "entity"
                "score": e["score"],
            }
            for e in found
        ]

    return {"entities": _column(answers, entities)}


def _qa(answers: list, width: int) -> dict:
    return {key: _column(answers, lambda a, key=key: a[0][key]) for key in ("answer", "score", "start", "end")}


def _embed(answers: list, width: int) -> dict:
    return {"embedding": answers}


def _masks(answers: list, width: int) -> dict:
    return {"masks": answers}


def _zero_shot(answers: list, width: int) -> dict:
    return {"labels": _column(answers, lambda a: a["labels"]), "scores": _column(answers, lambda a: a["scores"])}


COLUMNS: dict[str, TaskColumns] = {
    "classify": TaskColumns(
        ("text",),
        (1, 2),
        _single,
        lambda o: {"truncate": o["truncate"], "top_k": 1},
        lambda width: [_field("label", pa.string()), _field("score", pa.float32())],
        _classify,
    ),
    "ner": TaskColumns(
        ("text",),
        (1,),
        _single,
        lambda o: {"truncate": o["truncate"], "aggregation": o["aggregation"]},
        lambda width: [_field("entities", pa.list_(ENTITY))],
        _entities,
    ),
    "qa": TaskColumns(
        ("question", "context"),
        (2,),
        _qa_item,
        lambda o: {},
        lambda width: [
            _field("answer", pa.string()),
            _field("score", pa.float32()),
            _field("start", pa.int32()),
            _field("end", pa.int32()),
        ],
        _qa,
    ),
    "embed": TaskColumns(
        ("text",),
        (1,),
        _single,
        lambda o: {"truncate": o["truncate"], "normalize": o["normalize"]},
        lambda width: [_field("embedding", pa.list_(pa.float32(), width))],
        _embed,
    ),
    "rerank": TaskColumns(
        ("query", "document"),
        (2,),
        _pair,
        lambda o: {"truncate": o["truncate"], "raw_scores": o["raw_scores"]},
        lambda width: [_field("score", pa.float32())],
        lambda answers, width: {"score": answers},
    ),
    "fill_mask": TaskColumns(
        ("text",),
        (1,),
        _single,
        lambda o: {"truncate": o["truncate"], "top_k": o["top_k"]},
        lambda width: [_field("masks", pa.list_(pa.list_(CANDIDATE)))],
        _masks,
    ),
    "zero_shot": TaskColumns(
        ("text",),
        (1,),
        _single,
        lambda o: {
            "truncate": o["truncate"],
            "candidate_labels": list(o["candidate_labels"]),
            "hypothesis_template": o["hypothesis_template"],
            "multi_label": o["multi_label"],
        },
        lambda width: [_field("labels", pa.list_(pa.string())), _field("scores", pa.list_(pa.float32()))],
        _zero_shot,
        check=_zero_shot_options,
    ),
}


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
