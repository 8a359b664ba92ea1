"""One task on a model over rows: the Python API (`Predictor`), what every worker of a batch job runs, and the
callable a Ray Data `map_batches` takes (a class-based UDF: built once per actor, called on each batch).

A row becomes the task's item (batch/columns.py); the inference runtime does the rest as it does for the server
(runtime/inference.py): the task's codec encodes the items, the sequences of a window of rows are sorted by length
and cut into token-budget batches (runtime.batching), the backend runs them unpadded (runtime/backends), and the
codec decodes each row's outputs. A bad row (null, not a string, empty, invalid UTF-8, too long without --truncate)
gets its `error` and the others their answers: one row never fails the rest.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batch.columns import COLUMNS, result_schema, result_table
from batch.options import BatchOptions
from batch.precision import AUTO, Choice, choose_precision
from bert.options import take_values
from bert.precision import cpu_flags
from bert.tasks import TASKS
from bert.tasks.common import Limits
from bert.tasks.registry import canonical
from runtime.artifact import verify_graph
from runtime.batching import BatchShape
from runtime.inference import Encoded, Inference, run_planned
from runtime.loading import LoadedModel, LoadOptions, exact_model_problem, load_model
from runtime.model_dir import ModelError, read_model_spec, resolve_model_path

# Items encoded by one call of the codec: a row that fails sends only its own chunk through one by one.
ENCODE_CHUNK = 64
# python -m batch's options about the job around the model (its files, processes, parts and Ray): a Predictor is
# one model over the batches it is given, so it takes none of them. Its caller sets those: Ray Data's actors by
# map_batches' ActorPoolStrategy, the rows of a call by the batch it passes.
JOB_ONLY = ("input", "output", "format", "workers", "overwrite", "progress_interval", "ray", "window_rows", "part_rows")


class JobError(Exception):
    """What makes a job impossible before any work (a missing column, a model without the task): one line."""


def load_options(options: dict, threads: int | None) -> LoadOptions:
    """How the runtime loads the job's model, from the job's options only (a BERTSERVE_ variable set for a server
    does not change a job)."""
    return LoadOptions(
        backend=options["backend"],
        device=options["device"],
        precision=options["precision"],
        pooling=options["pooling"],
        allow_unverified=options["allow_unverified"],
        max_input_length=options["max_input_length"],
        max_batch_tokens=options["max_batch_tokens"],
        threads=threads,
        inference_workers=concurrent_runs(options, threads),
    )


def default_batch_size(device: str, backend: str) -> int:
    """Most sequences in a batch when --max-batch-size is not given. On CPU onnxruntime's kernels cost about the same
    per sequence at any batch size and a bigger batch mostly adds padding, while torch pays its per-operator Python
    cost once a batch (figures: docs/benchmarks.md, "Batch shape")."""
    if device == "cuda":
        return 64
    return 32 if backend == "torch" else 8


def concurrent_runs(options: dict, threads: int | None) -> int:
    """Batches one process runs at once. On CPU two runs sharing the threads beat one run on all of them (small
    batches use one thread well and two poorly: the server's rule, --inference-workers), so two threads or more
    are two runs; one on cuda, or when the thread count is the runtime's choice."""
    if options["device"] == "cuda" or not threads or threads < 2:
        return 1
    return 2


def default_options(**given) -> dict:
    """Every option a Predictor reads: BatchOptions' defaults, with `given` in their place, each as its
    declaration takes it (bert.options.Option.take: kind, choices, bounds; JobError). The task and the model are
    checked where they are read."""
    values = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(BatchOptions)}
    unknown = set(given) - set(values)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    try:
        values.update(take_values(BatchOptions, {k: v for k, v in given.items() if k not in ("task", "model")}))
    except ValueError as e:  # of the wrong kind (top_k="3", truncate="false"), choice or bounds
        raise JobError(str(e)) from None
    values.update({k: given[k] for k in ("task", "model") if k in given})
    for name in ("column", "keep", "candidate_labels"):
        if isinstance(values[name], str):
            values[name] = [x for x in values[name].split(",") if x]
    return values


def predictor_options(options: dict) -> dict:
    """The job's `options` a Predictor takes as keywords: all but the task, the model and the job's own."""
    return {k: v for k, v in options.items() if k not in ("task", "model", *JOB_ONLY)}


def _names(values) -> list[str]:
    """A list option's names with the spaces around them gone ('question, context'), empty ones dropped."""
    values = values.split(",") if isinstance(values, str) else values
    return [v.strip() for v in values if v.strip()]


def check_task_options(options: dict) -> list[str]:
    """The job's columns, as the task reads them (defaults filled in); JobError for a contradiction. A task given in
    its route's spelling (fill-mask) is set to its registry name (fill_mask) in `options`."""
    task = options["task"] = canonical(options["task"])
    if task not in TASKS:
        raise JobError(f"--task {task!r} is not one of {', '.join(TASKS)}")
    options["column"], options["keep"] = _names(options["column"]), _names(options["keep"])
    spec = COLUMNS[task]
    columns = list(options["column"]) or list(spec.inputs)
    keep = options["keep"]
    twice = sorted({c for c in keep if keep.count(c) > 1})
    if twice:
        raise JobError(f"--keep names {', '.join(map(repr, twice))} more than once")
    results = result_schema(task, 1).names  # the names, whatever the width
    clash = [c for c in keep if c in results]
    if clash:
        raise JobError(
            f"--keep {', '.join(map(repr, clash))}: a result column's name (a {task} job writes "
            f"{', '.join(results)}); rename it in the input"
        )
    if len(columns) not in spec.arity:
        want = " or ".join(str(n) for n in spec.arity)
        raise JobError(f"--column: {task} reads {want} column(s), got {len(columns)} ({','.join(columns)})")
    problems = TASKS[task].job_problems(options)  # the task's own options, as its route checks them
    if problems:
        raise JobError("; ".join(problems))
    return columns


def settle_precision(options: dict, flags: frozenset[str] | None = None) -> tuple[dict, Choice]:
    """The options with --precision auto replaced by what this job runs in (batch/precision.py), and why: the
    manifest records the precision itself, so a rerun on a machine that would choose otherwise is refused."""
    if options["precision"] is None:  # the backend's own default
        return options, Choice(None, "--precision default")
    try:
        path = resolve_model_path(options["model"])
        spec = read_model_spec(Path(path))
    except ModelError as e:
        raise JobError(str(e)) from None
    if options["precision"] != AUTO:
        if spec.kind in ("onnx", "tensorrt"):  # its precision is fixed at export: the backend runs that one
            fixed = str(spec.manifest.get("precision", "fp32"))
            if options["precision"] != fixed:
                raise JobError(
                    f"--precision {options['precision']}: {path} is a {spec.kind} export in {fixed}, a precision "
                    f"is fixed at export time; leave --precision out (auto) or export the model in "
                    f"{options['precision']}"
                )
        return options, Choice(options["precision"], f"--precision {options['precision']}")
    # a bf16 export is a checkpoint directory whose manifest fixes its precision, as an ONNX export's does
    kind = "artifact" if (spec.manifest or {}).get("runtime") == "torch" else spec.kind
    choice = choose_precision(
        options["precision"],
        task=options["task"],
        device=options["device"],
        kind=kind,
        backend=options["backend"],
        flags=cpu_flags() if flags is None else flags,
    )
    return {**options, "precision": choice.precision}, choice


def check_text(value) -> tuple[str | None, str | None]:
    """(text, None) for a usable value, else (None, why not)."""
    if value is None:
        return None, "null"
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None, "invalid UTF-8"
    if not isinstance(value, str):
        return None, f"not a string ({type(value).__name__})"
    try:
        value.encode("utf-8")  # a text read with surrogateescape keeps its undecodable bytes as lone surrogates
    except UnicodeEncodeError:
        return None, "invalid UTF-8"
    if not value.strip():
        return None, "empty"
    return value, None


@dataclass
class Result:
    table: pa.Table  # result columns + error, one row per input row, in input order
    tokens: int = 0
    errors: int = 0
    sequences: int = 0
    padded: int = 0
    verified: int = 0  # rows answered again by the verify model


@dataclass
class _Prepared:
    """A window's rows checked and encoded (Predictor._prepare): the items that encoded, their sequences and rows."""

    count: int  # rows
    items: list
    features: list  # each item's sequences
    rows: list[int]  # each item's row
    errors: list  # each row's error so far (None: good)


class Predictor:
    """`task` on `model` over rows: `Predictor("embed", "DIR")(batch)` -> the batch's rows with the result columns
    and `error`. A batch is a dict of columns (lists or numpy arrays: Ray Data's default), a pyarrow Table or
    RecordBatch, or a pandas DataFrame (answered as a DataFrame on its own index, its columns untouched; anything
    else as a pyarrow Table). A missing value (None, NaN, pd.NA) is a `null` row. Options are python -m batch's by
    their names (column, keep, truncate, backend, ...), checked for kind, choice and bounds here (JobError). Calls
    from several threads at once are safe. Built once per Ray actor, it loads the model once:

        ds.map_batches(Predictor, fn_constructor_kwargs={"task": "embed", "model": DIR},
                       compute=ray.data.ActorPoolStrategy(size=2))
    """

    def __init__(self, task: str, model: str | os.PathLike | LoadedModel, passthrough: bool = True, **options):
        job_only = [name for name in JOB_ONLY if name in options]
        if job_only:  # taken and ignored, each would promise what it cannot do here
            raise TypeError(
                f"{', '.join(job_only)}: python -m batch's option(s), not a Predictor's: a Predictor runs one model "
                "over the batches it is given (with Ray Data, map_batches' compute=ActorPoolStrategy(size=N) sets "
                "the actors)"
            )
        self.passthrough = passthrough  # without --keep, the batch's own columns come back beside the results
        self.options = default_options(task=task, model=str(model), **options)
        self.columns = check_task_options(self.options)
        self.task = task = self.options["task"]  # the registry's name (check_task_options)
        if not isinstance(model, LoadedModel):  # a loaded model's precision is what it was loaded in
            self.options, self.precision_choice = settle_precision(self.options)
        self.shape = COLUMNS[task]
        self._owns_model = not isinstance(model, LoadedModel)  # a model given loaded is its caller's to close
        if isinstance(model, LoadedModel):
            self.model = model
        else:
            self.model = load(str(model), self.options, self.options["threads"])
        self.codec_options = self.shape.options(self.options)
        self.inference = Inference(self.model, TASKS[task])
        self.batches = BatchShape(
            self.options["max_batch_tokens"],
            self.options["max_batch_size"] or default_batch_size(self.options["device"], self.model.backend.name),
            self.options["max_padding"],
        )
        # Batches run at once in this process: as many as the model was loaded for, if its backend allows.
        self.runs = concurrent_runs(self.options, self.options["threads"]) if self.model.backend.concurrent_runs else 1
        # made here, not at the first call, so that calls from two threads at once share one pool
        self._pool = ThreadPoolExecutor(self.runs, thread_name_prefix="batch-run") if self.runs > 1 else None
        try:
            self.verify, self.verify_margin = self._verify_model()
        except JobError:  # what was loaded and started here goes with the refusal
            self.close()
            raise
        serve_defaults = {o.name: o.default for o in self.inference.task.serve_options}
        self.limit_options = {
            f"{task}_{name}": value
            for name, value in serve_defaults.items()
            if f"{task}_{name}" in Limits.__dataclass_fields__
        }

    def close(self) -> None:
        """Stop the batch-run threads and let go of the model (a model loaded here is closed: its memory goes
        with the last reference); a closed Predictor is not called again. `with Predictor(...) as p:` closes on
        leaving. Closing twice is harmless."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        model, self.model = getattr(self, "model", None), None
        if model is not None and self._owns_model:
            model.backend.close()
        verify, self.verify = getattr(self, "verify", None), None
        if verify is not None:
            verify.backend.close()

    def _verify_model(self) -> tuple[LoadedModel | None, float | None]:
        """--verify-model, loaded in its own precision (an artifact's; a checkpoint's fp32 on a CPU) and checked
        against the model; the margin."""
        name, margin = self.options["verify_model"], self.options["verify_margin"]
        task = TASKS[self.task]
        if name is None and task.verify_margin is not None and not self.options["ignore_verify_graph"]:
            try:  # an int8 artifact's own fp32 graph (export's --verify-graph)
                name = verify_graph(self.model.spec, check=not self.options["allow_unverified"])
            except ModelError as e:
                raise JobError(str(e)) from None
        if name is None:
            if margin is not None:
                raise JobError("--verify-margin needs --verify-model (or a --model exported with --verify-graph)")
            return None, None
        if task.verify_margin is None:
            can = ", ".join(t.name for t in TASKS.values() if t.verify_margin is not None)
            raise JobError(
                f"--verify-model: {self.task} has no notion of an unsure answer to verify (those that do: {can})"
            )
        if resolve_model_path(str(name)) == self.model.spec.path:  # before loading it a second time
            raise JobError(
                f"--verify-model {name}: it is --model itself; give the exact one (e.g. the fp32 export beside an "
                "int8 --model)"
            )
        exact = load(str(name), {**self.options, "precision": None}, self.options["threads"])
        problem = exact_model_problem(exact, self.model)
        if problem:
            exact.backend.close()
            raise JobError(f"--verify-model {name}: {problem}")
        return exact, task.verify_margin.default if margin is None else margin

    def _check_open(self) -> None:
        if self.model is None:
            raise JobError("this Predictor was closed: make a new one")

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- what the output looks like ---------------------------------------------------------------
    @property
    def width(self) -> int | None:
        return self.model.dimensions

    @property
    def schema(self) -> pa.Schema:
        return result_schema(self.task, self.width)

    # ---- the API ---------------------------------------------------------------------------------
    def __call__(self, batch):
        self._check_open()
        columns, kind = _columns_of(batch, self.columns)
        missing = [c for c in [*self.columns, *self.options["keep"]] if c not in columns]
        if missing:
            have = ", ".join(map(repr, columns)) or "no columns"
            raise KeyError(f"the batch has no column {', '.join(map(repr, missing))}; it has {have}")
        results = self.schema.names
        keep = self.options["keep"] or (list(columns) if self.passthrough else [])
        clash = [c for c in keep if c in results]
        if clash:  # only where passed through without `keep` (check_task_options refuses a kept result name)
            raise ValueError(
                f"the batch's column(s) {', '.join(map(repr, clash))} have a result column's name (a {self.task} "
                f"Predictor writes {', '.join(results)}): rename them, or name the columns to pass through with keep=[...] "
                "(passthrough=False: none)"
            )
        lengths = {c: len(columns[c]) for c in dict.fromkeys([*self.columns, *keep])}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                "the batch's columns differ in length: " + ", ".join(f"{c!r} {n}" for c, n in lengths.items())
            )
        texts = {c: _texts(columns[c]) for c in self.columns}
        result = self.predict(texts).table
        if kind == "pandas":
            return _pandas_answer(batch, keep, result)
        return pa.table({**{c: _arrow(columns[c]) for c in keep}, **{n: result[n] for n in result.column_names}})

    def predict(self, columns: dict[str, list], row_errors: list | None = None) -> Result:
        """Rows given as {column: values} (the task's columns) -> their results in order. `row_errors`: rows
        already known bad (their error; None for the others)."""
        self._check_open()
        prepared = self._prepare(columns, row_errors)
        outputs, stats = self._run(prepared.features, prepared.rows, prepared.errors)
        return self._finish(prepared, outputs, stats)

    def predict_share(
        self, columns: dict[str, list], row_errors: list | None, share: int, shares: int
    ) -> tuple[list, list, dict]:
        """One of `shares` processes' part of `predict` on the same rows: the model outputs of every `shares`-th
        batch from the `share`-th, the batches cut exactly as `predict` cuts them (None for the others), with the
        rows' errors and the batches' counts. `join_shares` of all of them answers what `predict` answers: a
        window split across processes at the end of a job, so that no process sits idle while another works."""
        prepared = self._prepare(columns, row_errors)
        outputs, stats = self._run(prepared.features, prepared.rows, prepared.errors, (share, shares))
        return outputs, prepared.errors, stats

    def join_shares(self, columns: dict[str, list], row_errors: list | None, shares: list[tuple]) -> Result:
        """`predict`'s answer from every share's `predict_share` on the same rows."""
        prepared = self._prepare(columns, row_errors)
        outputs = [[None] * len(item) for item in prepared.features]
        stats = {"tokens": 0, "sequences": 0, "padded": 0}
        for share_outputs, errors, share_stats in shares:
            for item, share_item in zip(outputs, share_outputs):
                for j, output in enumerate(share_item):
                    if output is not None:
                        item[j] = output
            for row, error in enumerate(errors):
                prepared.errors[row] = prepared.errors[row] or error  # a share's failed batch
            for name, count in share_stats.items():
                stats[name] += count
        return self._finish(prepared, outputs, stats)

    # ---- the steps -------------------------------------------------------------------------------
    def _prepare(self, columns: dict[str, list], row_errors: list | None) -> _Prepared:
        """The rows' checks and encoding: each kept item's sequences, and each row's error so far."""
        values = [list(_values(columns[c])) for c in self.columns]
        rows = len(values[0]) if values else 0
        errors: list[str | None] = list(row_errors) if row_errors is not None else [None] * rows
        items, where = [], []
        for row in range(rows):
            if errors[row] is not None:
                continue
            texts = []
            for name, column in zip(self.columns, values):
                text, why = check_text(column[row])
                if why is not None:
                    errors[row] = f"{name}: {why}" if len(self.columns) > 1 else why
                    break
                texts.append(text)
            else:
                items.append(self.shape.to_item(texts, self.options))
                where.append(row)
        features = self._encode(items, where, errors)
        kept = [i for i, f in enumerate(features) if f is not None]
        return _Prepared(rows, [items[i] for i in kept], [features[i] for i in kept], [where[i] for i in kept], errors)

    def _finish(self, prepared: _Prepared, outputs: list, stats: dict) -> Result:
        if self.verify is not None:
            stats = {**stats, "verified": self._verify(prepared, outputs)}
        answers: list = [None] * prepared.count
        decoded = self._decode(prepared.items, prepared.features, outputs, prepared.rows, prepared.errors)
        for row, answer in zip(prepared.rows, decoded):
            if prepared.errors[row] is None:
                answers[row] = answer
        table = result_table(self.task, self.width, answers, prepared.errors)
        return Result(table, errors=sum(e is not None for e in prepared.errors), **stats)

    def _limits(self, items: int) -> Limits:
        return Limits(
            max_length=self.model.max_length,
            max_sequences=self.options["max_row_sequences"] * max(items, 1),
            **self.limit_options,
        )

    def _encode(self, items: list, where: list[int], errors: list) -> list:
        """Each item's sequences (None where it was refused, with its row's error)."""
        encoded: list = []
        options = self.codec_options
        for start in range(0, len(items), ENCODE_CHUNK):
            chunk = items[start : start + ENCODE_CHUNK]
            try:
                encoded.extend(self.inference.encode(chunk, self._limits(len(chunk)), options).features)
                continue
            except Exception:  # noqa: BLE001 - some row of the chunk is refused: find which, one by one
                pass
            for offset, item in enumerate(chunk):
                try:
                    encoded.extend(self.inference.encode([item], self._limits(1), options).features)
                except Exception as e:  # noqa: BLE001 - the codec's refusal is this row's error
                    encoded.append(None)
                    errors[where[start + offset]] = _refusal(e)
        return encoded

    def _run(
        self, features: list[list], rows: list[int], errors: list, share: tuple[int, int] | None = None
    ) -> tuple[list, dict]:
        """Every item's sequences run in length-sorted, token-budget batches; outputs per item, in order. `share`
        (k, n): only every n-th batch from the k-th runs (the others' outputs stay None)."""
        encoded = Encoded([None] * len(features), features)
        sequences = encoded.sequences
        item_of = [i for i, item in enumerate(features) for _ in item]
        mapper = self._pool.map if self.runs > 1 else map
        planned = run_planned(self.model.backend, sequences, self.batches, share=share, mapper=mapper)
        for batch, error in planned.failures:
            for k in batch:
                row = rows[item_of[k]]
                errors[row] = errors[row] or f"inference failed: {type(error).__name__}: {str(error)[:200]}"
        stats = {"tokens": planned.tokens, "sequences": planned.sequences, "padded": planned.padded}
        return encoded.per_item(planned.outputs), stats

    def _verify(self, prepared: _Prepared, outputs: list) -> int:
        """The items whose margins are under the verify margin run again on the verify model; their outputs are
        replaced in place (as the server's engine does). How many ran again."""
        encoded = Encoded(prepared.items, prepared.features)
        ok = [i for i, row in enumerate(prepared.rows) if prepared.errors[row] is None]
        try:
            found = self.inference.unsure(
                encoded.subset(ok), [outputs[i] for i in ok], self.codec_options, self.verify_margin
            )
            unsure = [ok[k] for k in found]
        except Exception:  # noqa: BLE001 - margins that fail: every row is answered again, and decoding judges each
            unsure = ok
        if not unsure:
            return 0
        again = encoded.subset(unsure)
        mapper = self._pool.map if self.runs > 1 else map
        planned = run_planned(self.verify.backend, again.sequences, self.batches, mapper=mapper)
        item_of = [i for i, item in zip(unsure, again.features) for _ in item]
        for batch, error in planned.failures:
            for k in batch:
                row = prepared.rows[item_of[k]]
                prepared.errors[row] = (
                    prepared.errors[row] or f"verify model failed: {type(error).__name__}: {str(error)[:200]}"
                )
        for i, item_outputs in zip(unsure, again.per_item(planned.outputs)):
            outputs[i] = item_outputs
        return len(unsure)

    def _decode(self, items: list, features: list, outputs: list, rows: list[int], errors: list) -> list:
        ok = [i for i in range(len(items)) if errors[rows[i]] is None]
        answers: list = [None] * len(items)
        try:
            encoded = Encoded([items[i] for i in ok], [features[i] for i in ok])
            decoded = self.inference.decode(encoded, [outputs[i] for i in ok], self.codec_options)
            for i, answer in zip(ok, decoded):
                answers[i] = answer
            return answers
        except Exception:  # noqa: BLE001 - one row's decoding failed: find which
            pass
        for i in ok:
            try:
                answers[i] = self.inference.decode(
                    Encoded([items[i]], [features[i]]), [outputs[i]], self.codec_options
                )[0]
            except Exception as e:  # noqa: BLE001 - this row's error
                errors[rows[i]] = f"decoding failed: {type(e).__name__}: {str(e)[:200]}"
        return answers


def load(model: str, options: dict, threads: int | None = None) -> LoadedModel:
    """The model as the server loads it (runtime.loading), refusing one that does not serve the task."""
    try:
        path = resolve_model_path(model)
        return load_model(Path(path), load_options(options, threads), [options["task"]])
    except ModelError as e:
        raise JobError(str(e)) from None


def _refusal(error: Exception) -> str:
    text = " ".join(str(error).split())
    if type(error).__name__ == "InputTooLong":
        text = text.replace('(send "truncate": true to cut it)', "(--truncate cuts it)").replace("input 0 has", "has")
    return text[:500] or type(error).__name__


def _columns_of(batch, reads: list[str]) -> tuple[dict[str, Any], str]:
    """A batch's columns by name, and what kind of batch it was (`reads`: the task's columns, for the hint a batch
    of another shape gets)."""
    if isinstance(batch, (pa.Table, pa.RecordBatch)):
        names = batch.column_names
        _refuse_twice(names)
        return {name: batch.column(i) for i, name in enumerate(names)}, "arrow"
    if hasattr(batch, "to_dict") and hasattr(batch, "columns") and hasattr(batch, "iloc"):  # pandas, duck-typed
        names = list(batch.columns)
        _refuse_twice(names)
        return {name: batch.iloc[:, i] for i, name in enumerate(names)}, "pandas"
    if isinstance(batch, dict):
        columns = {}
        for name, column in batch.items():
            if isinstance(column, (str, bytes)) or not hasattr(column, "__iter__"):
                raise TypeError(
                    f"column {name!r} is a {type(column).__name__}, not a column of values: give a list, "
                    f"{{{name!r}: [{column!r}]}} for one row"
                )
            # one pass over a generator: it is read for the task and again to be passed through
            columns[name] = column if hasattr(column, "__len__") else list(column)
        return columns, "dict"
    like = f"{{{', '.join(f'{c!r}: [...]' for c in reads)}}}"
    if hasattr(batch, "to_frame") and hasattr(batch, "name"):  # a pandas Series
        hint = f"give it by its column's name, {like}, or series.to_frame({reads[0]!r})"
    elif isinstance(batch, (list, tuple)) and batch and all(isinstance(row, dict) for row in batch):
        hint = "a list of rows is pyarrow.Table.from_pylist(rows) or pandas.DataFrame(rows)"
    elif isinstance(batch, (list, tuple, str)):
        hint = f"give the values by their column's name, {like}"
    else:
        hint = "a batch is a dict of columns, a pyarrow Table or RecordBatch, or a pandas DataFrame"
    raise TypeError(f"a {type(batch).__name__} is not a batch: {hint}")


def _refuse_twice(names: list) -> None:
    twice = [n for n in dict.fromkeys(names) if names.count(n) > 1]
    if twice:
        raise ValueError(f"the batch has column(s) {', '.join(map(repr, twice))} more than once")


def _values(column) -> list:
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return column.to_pylist()
    if hasattr(column, "tolist"):  # numpy arrays, pandas Series
        return column.tolist()
    return list(column)


def _missing(value) -> bool:
    """None, or what pandas and numpy hold for a missing value: NaN, pd.NA, NaT."""
    return (
        value is None
        or (isinstance(value, (float, np.floating)) and value != value)
        or type(value).__name__ in ("NAType", "NaTType")
    )


def _texts(column) -> list:
    """A task column's values, a missing value (NaN in a pandas or numpy column, pd.NA) as None: the row's error
    is `null`. An Arrow column's nulls are None already (and a NaN in it is a float, as the job reads it)."""
    values = _values(column)
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return values
    return [None if _missing(v) else v for v in values]


def _arrow(column) -> pa.Array | pa.ChunkedArray:
    """A passed-through column as Arrow: a numpy array in its own type (datetime64, float32, a 2-D array as fixed-size
    lists), a pandas Series as pyarrow converts one (NaN is null), other values as pyarrow infers them."""
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return column
    try:
        if isinstance(column, np.ndarray) and column.dtype != object and column.ndim in (1, 2):
            if column.ndim == 1:
                return pa.array(column)
            return pa.FixedSizeListArray.from_arrays(pa.array(column.reshape(-1)), column.shape[1])
        if hasattr(column, "isna") and hasattr(column, "dtype"):  # a pandas Series
            return pa.Array.from_pandas(column)
        return pa.array(_values(column))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # mixed kinds of values: passed through as their text, a missing one as null
        return pa.array([None if _missing(v) else str(v) for v in _values(column)], pa.string())


def _pandas_answer(frame, keep: list, result: pa.Table):
    """A DataFrame's answer: its `keep` columns as they were (dtypes, names) and the results, on its own index; an
    integer result (qa start/end) a nullable integer, so that a failed row does not make the column float."""
    import pandas as pd

    mapping = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}
    answers = result.to_pandas(types_mapper=mapping.get)
    if keep:
        passed = frame.iloc[:, [frame.columns.get_loc(c) for c in keep]].reset_index(drop=True)
        answers = pd.concat([passed, answers], axis=1)
    answers.index = frame.index
    return answers
