"""`--precision auto`'s verified candidate: every group int8 with the fp32 graph beside it, which answers again what
the int8 graph is unsure of, as the server and batch jobs run an artifact written with `--verify-graph`
(docs/serving.md, "Fast answers"). Measured here the way they run it, on the calibration inputs: each task that can
tell an unsure answer encodes its inputs as requests, both graphs run them (runtime/), the items whose int8 margins
fall under the task's default verify margin take fp32's outputs, and the answers' decisions (a label, entity spans,
an answer, a query's top text) are compared with fp32's. The outputs of a task that cannot be verified (an embedding)
are judged as the int8 search judges them (export/sensitivity.py)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bert.tasks import TASKS
from bert.tasks.base import Task


@dataclass
class Verified:
    """What the pair gave on the calibration inputs: per task its items, those answered again and the share of
    decisions equal to fp32's; the largest share of calibration tokens any task ran again on fp32."""

    tasks: dict[str, dict] = field(default_factory=dict)
    unverified_agreement: float | None = None  # the other outputs' (int8 alone), as the search measures them
    again_share: float = 0.0

    @property
    def agreement(self) -> float | None:
        values = [t["agreement"] for t in self.tasks.values() if t["agreement"] is not None]
        if self.unverified_agreement is not None:
            values.append(self.unverified_agreement)
        return min(values) if values else None

    def describe(self) -> dict:
        return {
            "tasks": self.tasks,
            "unverified_outputs_agreement": self.unverified_agreement,
            "answered_again_token_share": round(self.again_share, 4),
        }


def verifiable(task: Task) -> bool:
    """A task the pair can answer for: it has margins, says what decides its answers, and turns a calibration row
    into a request item (its batch job's columns)."""
    return task.verify_margin is not None and type(task).decisions is not Task.decisions and task.job is not None


def calibration_items(task: Task, extra: dict | None, rows: list | None = None) -> list:
    """The task's calibration rows (export/sensitivity.py's sets), or `rows` (texts, or tuples of texts as the
    task's batch job reads them), as its requests' items."""
    from .sensitivity import CALIBRATION_SETS

    extra = extra or {"sentences": [], "pairs": [], "groups": []}
    options = task.job_defaults(truncate=True)  # a --calibration line longer than the graph: its start
    if rows is None:
        rows = [row for block in CALIBRATION_SETS[task.calibration].items(extra) for row in block]
    rows = [(row,) if isinstance(row, str) else tuple(row) for row in rows]
    return [task.job.to_item(list(row), options) for row in rows if len(row) in task.job.arity]


def candidate_dir(directory: Path, graph: Path, write_config) -> Path:
    """A model directory for the runtime: the artifact's config and tokenizer (`write_config(directory)`) and
    `graph` (with its external data) linked in as model.onnx."""
    from .variants import data_file

    directory.mkdir()
    write_config(directory)
    _link(graph, directory / "model.onnx")
    data = data_file(graph)
    if data.exists():  # the graph names its data file: it keeps that name
        _link(data, directory / data.name)
    return directory


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)


def measure(
    fast_dir: Path,
    exact_dir: Path,
    tasks: list[str],
    extra: dict | None,
    max_length: int,
    rows: dict[str, list] | None = None,
) -> Verified:
    """The pair's answers against the exact graph's, for each of `tasks` that is verifiable: on its calibration
    inputs, or on `rows[task]` where given (held-out data, evals)."""
    from bert.tasks.common import Limits
    from runtime.inference import Inference, run_encoded
    from runtime.loading import LoadOptions, load_model

    settings = LoadOptions(allow_unverified=True, inference_workers=1)
    fast, exact = load_model(fast_dir, settings), load_model(exact_dir, settings)
    found = Verified()
    limits = Limits(
        max_length=min(max_length, fast.max_length),
        max_sequences=1 << 20,
        qa_max_length=min(max_length, 384),
        qa_max_question_length=64,
    )
    try:
        for name in tasks:
            task = TASKS[name]
            if not verifiable(task) or name not in fast.backend.tasks:  # before its items: it may have no job
                continue
            items = calibration_items(task, extra, (rows or {}).get(name))
            if not items:
                continue
            options = task.job_options(task.job_defaults(truncate=True))
            inference = Inference(fast, task)
            encoded = inference.encode(items, limits, options)

            quick, reference = (run_encoded(model.backend, encoded) for model in (fast, exact))
            unsure = set(inference.unsure(encoded, quick, options, task.verify_margin.default))
            answered = [reference[i] if i in unsure else quick[i] for i in range(len(items))]
            want = task.decisions(items, inference.decode(encoded, reference, options))
            got = task.decisions(items, inference.decode(encoded, answered, options))
            tokens = [sum(len(f) for f in features) for features in encoded.features]
            share = sum(tokens[i] for i in unsure) / max(sum(tokens), 1)
            found.again_share = max(found.again_share, share)
            found.tasks[name] = {
                "items": len(items),
                "answered_again": len(unsure),
                "decisions": len(want),
                "agreement": sum(a == b for a, b in zip(want, got)) / len(want) if want else None,
                "verify_margin": task.verify_margin.default,
            }
    finally:
        fast.backend.close()
        exact.backend.close()
    return found
