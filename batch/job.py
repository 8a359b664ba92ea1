"""A local batch job: the input read a window at a time, each window's rows run by a Predictor (in this process
or in --workers processes), results written as Parquet parts in input order, each part written aside and renamed,
then recorded in _manifest.json. A rerun reads the manifest and continues after its last part: windows are cut
at fixed row numbers within each part, so a resumed job batches every row as an uninterrupted one does and writes
the same bytes.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batch.inputs import ROW_ERROR, InputError, InputFile, Survey, check_columns, conform, expand, read_rows, survey
from batch.options import RESULT_OPTIONS
from batch.predict import JobError, Predictor, Result, check_task_options, load, predictor_options, settle_precision
from batch.progress import Progress
from bert.atomic import fsync_dir, pause_point, write_file_atomic
from bert.digest import sha256_files
from runtime.model_dir import ModelError, resolve_model_path

MANIFEST = "_manifest.json"
RAY_STAGING = ".ray-parts"  # batch/ray_job.py's RAY_TMP
PART = "part-{:05d}.parquet"
FORMAT = 1


# ---- the manifest ------------------------------------------------------------------------------------
def model_digest(path: Path) -> str:
    """sha256 over the model directory's files (names and contents, sorted): the model a part was computed by."""
    return sha256_files(sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")))


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def job_identity(options: dict, files: list[InputFile], sha256: list[str], model_path: Path, digest: str) -> dict:
    """What the parts are a function of: a rerun must match it to continue."""
    return {
        "task": options["task"],
        "input": {
            "spec": options["input"],
            # sha256: a file rewritten in place with as many bytes is another input (its rows, other results)
            "files": [
                {"path": str(f.path), "format": f.format, "bytes": f.bytes, "sha256": sha}
                for f, sha in zip(files, sha256, strict=True)
            ],
        },
        "model": {"path": str(model_path), "digest": digest},
        "options": {name: options[name] for name in RESULT_OPTIONS if name != "task"},
        **({"verify_model": verify_identity(options["verify_model"])} if options.get("verify_model") else {}),
    }


def verify_identity(name: str) -> dict:
    """The verify model's path and digest (a rerun with other exact weights answers its unsure rows otherwise)."""
    try:
        path = resolve_model_path(name)
    except ModelError as e:
        raise JobError(f"--verify-model: {e}") from None
    return {"path": str(path), "digest": model_digest(path)}


def read_manifest(output: Path) -> dict | None:
    path = output / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise JobError(f"{path}: unreadable ({e}); pass --overwrite to start over") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise JobError(f"{path} is not a manifest this version writes; pass --overwrite to start over")
    return manifest


def difference(old: dict, new: dict) -> str | None:
    """What differs between the job that wrote a manifest and this one, in a few words; None when nothing."""
    if old.get("task") != new["task"]:
        return f"task {old.get('task')} (now {new['task']})"
    if old.get("model", {}).get("digest") != new["model"]["digest"]:
        return (
            f"another model ({old.get('model', {}).get('path')}, digest {str(old.get('model', {}).get('digest'))[:12]})"
        )
    if old.get("input") != new["input"]:
        return _input_difference(old.get("input") or {}, new["input"])
    changed = [k for k, v in new["options"].items() if old.get("options", {}).get(k) != v]
    if changed:
        name = changed[0]
        return f"--{name.replace('_', '-')} {old.get('options', {}).get(name)!r} (now {new['options'][name]!r})"
    return None


def _input_difference(old: dict, new: dict) -> str:
    before = {f.get("path"): f for f in old.get("files") or []}
    if old.get("spec") != new["spec"] or list(before) != [f["path"] for f in new["files"]]:
        return f"another input ({old.get('spec')}, or its files changed)"
    for file in new["files"]:
        was = before[file["path"]]
        if "sha256" not in was:  # a manifest of a version that recorded only the sizes: the content is unknown
            return f"an input whose content it did not record (no sha256 for {file['path']}: an older version)"
        if was != file:
            return f"{file['path']} as it was then (sha256 {str(was['sha256'])[:12]}; it changed: now {file['sha256'][:12]})"
    return f"another input ({old.get('spec')}, or its files changed)"


def write_manifest(output: Path, manifest: dict) -> None:
    write_file_atomic(output / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def verified_parts(output: Path, parts: list[dict]) -> list[dict]:
    """The manifest's parts whose files are there and match their sha256, up to the first that does not."""
    good = []
    for part in parts:
        path = output / part["file"]
        if not path.is_file() or path.stat().st_size != part.get("bytes") or file_sha256(path) != part.get("sha256"):
            break
        good.append(part)
    return good


def clear_output(output: Path) -> None:
    """--overwrite: the parts, temporaries and manifest a job writes (nothing else in the directory); the manifest
    last, so that a job killed meanwhile leaves a directory that is still its own."""
    for path in output.iterdir():
        if path.name.startswith(("part-", ".part-")) and ".parquet" in path.name:
            path.unlink()
    (output / MANIFEST).unlink(missing_ok=True)


def check_output(output: Path, spec: str) -> None:
    """JobError unless `output` can be a job's directory: new, empty, or holding a job's manifest (a directory of
    other files is never written into, --overwrite or not); not under a file; not inside the input's directory."""
    above = output.absolute()
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        what = "is a file" if above == output.absolute() else f"is under {above}, a file"
        raise JobError(f"--output {output} {what}, not a directory")
    if output.is_dir() and not (output / MANIFEST).is_file():
        names = sorted(p.name for p in output.iterdir())
        if names and RAY_STAGING not in names:  # a Ray job writes its manifest last: its staging marks its own
            raise JobError(
                f"--output {output} holds files ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) but no "
                f"{MANIFEST}: not a job's output; give a new or empty directory"
            )
    if _inside_input(output, spec):
        raise JobError(f"--output {output} is inside --input {spec}: a rerun would read the parts as input")


def _inside_input(output: Path, spec: str) -> bool:
    """Whether the job's parts would be among the input files `spec` names (batch/inputs.expand)."""
    given = Path(spec).expanduser()
    if given.is_dir():
        base = given.resolve()
        return output.resolve() == base or base in output.resolve().parents
    if given.is_file() or not any(c in spec for c in "*?["):
        return False
    pattern = Path(os.path.abspath(given))
    magic = [i for i, part in enumerate(pattern.parts) if "**" in part]
    part = Path(os.path.abspath(output)) / PART.format(0)
    if magic:  # recursive: anything under the directory before the first **
        base = Path(*pattern.parts[: magic[0]])
        return base in part.parents
    return part.match(str(pattern))


# ---- windows: fixed row ranges within each part -------------------------------------------------------
@dataclass
class Window:
    part: int
    start: int
    values: dict[str, list]
    keep: dict[str, list]  # column -> Arrow arrays to concatenate

    def __len__(self) -> int:
        return len(next(iter(self.values.values())))


def windows(chunks, columns: list[str], keep: list[str], first_row: int, part_rows: int, window_rows: int):
    """Chunks of rows (any sizes) -> windows of `window_rows` starting at each part's first row, cut at parts'
    ends: the same windows whatever the chunks, so a resumed job batches as an uninterrupted one."""
    names = [*columns, ROW_ERROR]
    pending: dict[str, list] = {c: [] for c in names}
    pending_keep: dict[str, list] = {c: [] for c in keep}
    start = first_row
    count = 0

    def cut(n: int) -> Window:
        nonlocal start, count
        values = {c: pending[c][:n] for c in names}
        for c in names:
            del pending[c][:n]
        kept = {}
        for c in keep:
            arrays, taken, rest = pending_keep[c], [], []
            need = n
            for a in arrays:
                if need >= len(a):
                    taken.append(a)
                    need -= len(a)
                elif need > 0:
                    taken.append(a.slice(0, need))
                    rest.append(a.slice(need))
                    need = 0
                else:
                    rest.append(a)
            pending_keep[c] = rest
            kept[c] = taken
        window = Window(start // part_rows, start, values, kept)
        start += n
        count -= n
        return window

    for chunk in chunks:
        n = len(chunk)
        for c in columns:
            pending[c].extend(chunk.values[c])
        pending[ROW_ERROR].extend(chunk.values.get(ROW_ERROR) or [None] * n)
        for c in keep:
            pending_keep[c].append(chunk.keep[c])
        count += n
        while count:
            part_end = (start // part_rows + 1) * part_rows
            size = min(window_rows - (start - (start // part_rows) * part_rows) % window_rows, part_end - start)
            if count < size:
                break
            yield cut(size)
    while count:
        part_end = (start // part_rows + 1) * part_rows
        yield cut(min(count, window_rows, part_end - start))


def _concat(arrays: list, kind: pa.DataType) -> pa.Array:
    """A kept column's arrays as one of type `kind`: the same in every part (batch/inputs.survey)."""
    chunks = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return pa.concat_arrays([conform(a, kind) for a in chunks]) if chunks else pa.array([], kind)


# ---- the work of one window (in this process or a worker) ---------------------------------------------
_WORKER: Predictor | None = None


def _start_worker(options: dict, threads: int | None) -> None:
    global _WORKER
    # Ctrl-C reaches every process of the terminal's group: the job's process stops the job (one line, exit 130:
    # batch/__main__.py); a worker finishes the window it runs and goes with the pool, without a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER = Predictor(options["task"], options["model"], **predictor_options({**options, "threads": threads}))


def _row_errors(values: dict[str, list]) -> list | None:
    row_errors = values.get(ROW_ERROR)
    return row_errors if any(e is not None for e in row_errors or ()) else None


def _run_window(values: dict[str, list], predictor: Predictor | None = None) -> Result:
    return (predictor or _WORKER).predict(values, _row_errors(values))


def _run_share(values: dict[str, list], share: int, shares: int) -> tuple:
    return _WORKER.predict_share(values, _row_errors(values), share, shares)


# ---- the job --------------------------------------------------------------------------------------------


def plan_job(options: dict, columns: list[str]) -> tuple:
    """What a job reads and writes, checked before any work (JobError: one line): its input files (holding
    `columns`; a file without a row holds none and is read as 0 rows), the model's directory, the output
    directory, the job's identity, the manifest of an earlier run of the same job to continue (None: start
    afresh; a different job's manifest is refused), and the input's Survey (one read of each file: the sha256s
    the identity records, the rows, the --keep columns' types)."""
    try:
        files = expand(options["input"], options["format"])
        check_columns(files, columns)
        model_path = resolve_model_path(options["model"])
    except (InputError, ModelError) as e:
        raise JobError(str(e)) from None
    output = Path(options["output"])
    check_output(output, options["input"])
    surveyed: Survey = survey(files, list(options["keep"]), options["window_rows"])
    identity = job_identity(options, files, surveyed.sha256, model_path, model_digest(model_path))
    previous = None if options["overwrite"] else (read_manifest(output) if output.is_dir() else None)
    if previous is not None:
        changed = difference(previous, identity)
        if changed:
            raise JobError(f"{output} was written by a job with {changed}; pass --overwrite to start over")
    return files, model_path, output, identity, previous, surveyed


def run(options: dict, log=print) -> int:
    """Run (or continue) the job; 0 when every row has its result or error. JobError: nothing was done."""
    started = time.monotonic()
    columns = check_task_options(options)
    options, choice = settle_precision(options)
    keep = list(options["keep"])
    files, model_path, output, identity, previous, surveyed = plan_job(options, [*columns, *keep])
    workers = options["workers"] or os.cpu_count() or 1
    threads = options["threads"] or max(1, (os.cpu_count() or 1) // workers)
    model = load(str(model_path), options, threads)  # before any work: a model without the task is refused here
    predictor = Predictor(options["task"], model, **predictor_options({**options, "threads": threads}))
    types = surveyed.kept  # each kept column's, the same in every part
    output.mkdir(parents=True, exist_ok=True)
    if options["overwrite"]:
        clear_output(output)
    for stale in output.glob(".part-*"):
        stale.unlink()  # a part a killed job was writing
    parts = verified_parts(output, previous["parts"]) if previous else []
    done = parts[-1]["rows"][1] if parts else 0
    manifest = {
        "format": FORMAT,
        **identity,
        "model": {**identity["model"], **engine(model, choice)},
        "schema": {"keep": keep, "results": [f"{f.name}: {f.type}" for f in predictor.schema]},
        "parts": parts,
        "rows_done": done,
        "errors": sum(p["errors"] for p in parts),
        "verified": sum(p.get("verified", 0) for p in parts),
        "complete": bool(previous and previous.get("complete") and len(parts) == len(previous["parts"])),
    }
    if manifest["complete"]:
        log(f"{output}: already complete ({done} rows, {manifest['errors']} errors); --overwrite starts over")
        return 0
    write_manifest(output, manifest)
    total = surveyed.rows
    if done:
        log(f"continuing after row {done} ({len(parts)} parts done)")
    progress = Progress(total, done, options["progress_interval"])
    chunks = read_rows(files, columns, keep, options["window_rows"], skip=done)
    source = _prefetch(windows(chunks, columns, keep, done, options["part_rows"], options["window_rows"]))
    writer = _PartWriter(output, manifest, predictor, types)
    try:
        if workers == 1:
            for window in source:
                writer.add(window, _run_window(window.values, predictor))
                progress.update(len(window), writer.last_tokens)
        else:
            _run_pool(source, workers, threads, options, writer, progress, predictor, total)
        writer.finish()
    finally:
        writer.close()
        progress.close()
    manifest["complete"] = True
    write_manifest(output, manifest)
    elapsed = time.monotonic() - started
    computing = max(time.monotonic() - progress.started, 1e-9)  # after the model loaded
    rows = manifest["rows_done"] - done
    log(
        f"done: {manifest['rows_done']} rows in {len(manifest['parts'])} parts, {manifest['errors']} errors"
        + (f", {manifest['verified']} answered again by --verify-model" if predictor.verify is not None else "")
        + "; "
        f"{rows} rows this run in {elapsed:.1f}s, {computing:.1f}s of it after loading the model "
        f"({rows / computing:.1f} rows/s, {progress.tokens / computing:.0f} tokens/s); "
        f"{model.backend.name} {model.backend.precision} ({choice.why}); {output / MANIFEST}"
    )
    return 0


def engine(model, choice) -> dict:
    """What ran the rows, for the manifest: the backend, its precision and the rule that chose it."""
    return {"backend": model.backend.name, "precision": model.backend.precision, "precision_choice": choice.why}


def _run_pool(source, workers: int, threads: int, options: dict, writer, progress, predictor, total: int) -> None:
    """Windows run by `workers` processes, at most two each in flight, written back in input order. The windows
    that start in the job's last `workers` windows' rows are split: each process runs a share of their batches
    (cut as one process cuts them, so the answers are the same) and this one joins them, so that the job's end
    does not leave all but one process idle for up to a window's time."""
    import multiprocessing

    tail = total - workers * options["window_rows"]
    context = multiprocessing.get_context("spawn")  # never fork a process that holds a model and threads
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(options, threads)
    ) as pool:
        flight: collections.deque[tuple[Window, list[Future]]] = collections.deque()

        def write_first() -> None:
            done, futures = flight.popleft()
            if len(futures) == 1:
                result = futures[0].result()
            else:
                result = predictor.join_shares(done.values, _row_errors(done.values), [f.result() for f in futures])
            writer.add(done, result)
            progress.update(len(done), writer.last_tokens)

        try:
            for window in source:
                if window.start >= tail:
                    futures = [pool.submit(_run_share, window.values, k, workers) for k in range(workers)]
                else:
                    futures = [pool.submit(_run_window, window.values)]
                flight.append((window, futures))
                if len(flight) >= 2 * workers:
                    write_first()
            while flight:
                write_first()
        except BaseException:  # Ctrl-C, a failure: the windows not started are not waited for
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _prefetch(iterator, depth: int = 2):
    """`iterator`'s items, read ahead in a thread: reading the next window overlaps computing this one."""
    items: queue.Queue = queue.Queue(depth)
    end = object()

    def fill():
        try:
            for item in iterator:
                items.put(item)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            items.put(e)
        items.put(end)

    threading.Thread(target=fill, name="batch-read", daemon=True).start()
    while (item := items.get()) is not end:
        if isinstance(item, BaseException):
            raise item
        yield item


class _PartWriter:
    """Collects each part's windows; a complete part is written aside, fsync'd, renamed, then recorded in the
    manifest (in a thread: writing overlaps computing the next windows)."""

    def __init__(self, output: Path, manifest: dict, predictor: Predictor, keep: dict[str, pa.DataType]):
        self.output, self.manifest, self.predictor, self.keep = output, manifest, predictor, keep
        self.part: int | None = None
        self.start = 0
        self.tables: list[pa.Table] = []
        self.kept: dict[str, list] = {}
        self.errors = 0
        self.verified = 0
        self.last_tokens = 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="batch-write")
        self.pending: Future | None = None

    def add(self, window: Window, result: Result) -> None:
        pause_point(f"batch:window-{window.start}")
        if self.part is not None and window.part != self.part:
            self._flush()
        if self.part is None:
            self.part, self.start = window.part, window.start
        self.tables.append(result.table)
        for c in self.keep:
            self.kept.setdefault(c, []).extend(window.keep[c])
        self.errors += result.errors
        self.verified += result.verified
        self.last_tokens = result.tokens

    def finish(self) -> None:
        if self.part is not None:
            self._flush()
        if self.pending is not None:
            self.pending.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _flush(self) -> None:
        results = pa.concat_tables(self.tables)
        columns = {c: _concat(self.kept[c], kind) for c, kind in self.keep.items()}
        table = pa.table({**columns, **{n: results[n] for n in results.column_names}})
        entry = {"part": self.part, "start": self.start, "errors": self.errors, "verified": self.verified}
        if self.pending is not None:
            self.pending.result()  # parts are recorded in order
        self.pending = self.pool.submit(self._write, table, entry)
        self.part, self.tables, self.kept, self.errors, self.verified = None, [], {}, 0, 0

    def _write(self, table: pa.Table, entry: dict) -> None:
        name = PART.format(entry["part"])
        tmp = self.output / f".{name}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        pause_point(f"batch:{name}:aside", tmp)
        os.replace(tmp, self.output / name)
        fsync_dir(self.output)
        pause_point(f"batch:{name}:renamed")
        rows = [entry["start"], entry["start"] + table.num_rows]
        self.manifest["parts"].append(
            {
                "file": name,
                "rows": rows,
                "errors": entry["errors"],
                "verified": entry["verified"],
                "bytes": (self.output / name).stat().st_size,
                "sha256": file_sha256(self.output / name),
            }
        )
        self.manifest["rows_done"] = rows[1]
        self.manifest["errors"] += entry["errors"]
        self.manifest["verified"] += entry["verified"]
        write_manifest(self.output, self.manifest)
