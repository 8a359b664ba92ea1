"""The same job on a Ray cluster (--ray auto|ADDRESS): Ray Data reads the files (read_parquet / read_csv, and for
JSONL read tasks that parse the lines with the local job's own parser: batch/inputs.jsonl_chunks), one
model-holding actor per worker runs `batch.Predictor` over `--window-rows` rows at a time (the same codecs,
batching and result columns as the local job), and write_parquet writes the parts, which are then named
part-NNNNN.parquet in input order and recorded in the same _manifest.json. A kept column has the local job's one
type in every part, whatever type Ray Data's reader gave it in a block; a file without a row is in the manifest
and in no read. A Ray job is not resumed part by part: a rerun of an unfinished one starts over (one of
a finished one says so and stops). ray is imported here only, and only under --ray.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batch.inputs import READ_BLOCK, ROW_ERROR, InputFile, Survey, conform, jsonl_chunks
from batch.job import MANIFEST, PART, clear_output, engine, file_sha256, plan_job, write_manifest
from batch.predict import JobError, Predictor, check_task_options, load, predictor_options, settle_precision

RAY_TMP = ".ray-parts"
# A JSONL block's own columns beside the task's (never a JSON key: NUL-prefixed, as ROW_ERROR): a task column's
# values that are not text, as JSON, and a kept column that is also a task column, in its kept type.
NOT_TEXT = "\0json:"
KEPT = "\0kept:"


def _format(files: list[InputFile]) -> str:
    kinds = {f.format for f in files}
    if len(kinds) > 1:
        raise JobError(f"--ray reads one format per job; --input holds {', '.join(sorted(kinds))} files")
    return kinds.pop()


def _dataset(
    ray, files: list[InputFile], kind: str, needed: list[str], blocks: int, jsonl: tuple | None = None, env=None
):
    """The input as `blocks` blocks of about a window's rows, cut by the read tasks themselves (no task of another
    operator): Ray Data splits each read task's output evenly, so files of very different sizes give the larger
    ones bigger blocks. `files` hold rows (a reader refuses some files without one: an empty CSV file). JSONL:
    `jsonl` (columns, kept schema, chunk rows) for _jsonl_dataset, whose read tasks get `env` (_actor_env)."""
    paths = [str(f.path) for f in files]
    if kind == "parquet":
        return ray.data.read_parquet(paths, columns=needed, override_num_blocks=blocks)
    if kind == "jsonl":
        return _jsonl_dataset(ray, paths, *jsonl, blocks, env)
    import pyarrow.csv as csv

    parse = csv.ParseOptions(delimiter="\t" if kind == "tsv" else ",")
    # Text, as the local job reads a CSV file's values, not the types Arrow guesses for each block ("007" -> 7).
    convert = csv.ConvertOptions(column_types={c: pa.string() for c in needed})
    dataset = ray.data.read_csv(paths, parse_options=parse, convert_options=convert, override_num_blocks=blocks)
    return dataset.select_columns(needed)


def _jsonl_dataset(ray, paths: list[str], columns: list[str], kept: pa.Schema, chunk_rows: int, blocks: int, env):
    """JSONL files read by Ray Data's file reading (the files split among `blocks` read tasks, each one's output
    cut evenly into blocks, in order) but parsed as the local job parses them: the rows of batch/inputs.jsonl_chunks
    (json.loads of each line; a blank line none; a line that is not a JSON object a row holding its error), each
    of `chunk_rows` rows a table of _jsonl_tables. Not Ray Data's read_json: pandas' read_json types each block by
    its guesses ("007" -> 7, a text column of "5"s numbers, created_at a timestamp, an int beside nulls a float),
    and one bad line fails the whole read. A file is streamed (a chunk's rows at a time), as the local job reads it.
    The read tasks run bertserve's code: given `env` (_actor_env) where they would not find it."""
    from dataclasses import replace

    from ray.data.datasource import DefaultFileMetadataProvider, FileBasedDatasource

    check_reader_api(FileBasedDatasource, DefaultFileMetadataProvider, ray.__version__)
    ratio = _jsonl_memory_ratio(paths, columns, kept, chunk_rows)

    class TableBytes(DefaultFileMetadataProvider):
        """A read task's size as its tables' bytes, not its files' (Ray Data plans the blocks from it)."""

        def _get_block_metadata(self, paths, **kwargs):
            meta = super()._get_block_metadata(paths, **kwargs)
            return meta if meta.size_bytes is None else replace(meta, size_bytes=max(1, int(meta.size_bytes * ratio)))

    class JsonlLines(FileBasedDatasource):
        def __init__(self, paths: list[str]):
            super().__init__(paths, meta_provider=TableBytes())
            self.needed = (columns, kept, chunk_rows)

        def estimate_inmemory_data_size(self):
            size = super().estimate_inmemory_data_size()
            return None if size is None else max(1, int(size * ratio))

        def resolve_compression(self, path, open_args):
            return None  # the file's bytes, as the local job reads them (Ray Data would gunzip a .gz)

        def _read_stream(self, f, path: str):
            yield from _jsonl_tables(iter(lambda: f.read(READ_BLOCK), b""), *self.needed)

    remote = {"ray_remote_args": {"runtime_env": {"env_vars": env}}} if env else {}
    return ray.data.read_datasource(JsonlLines(paths), override_num_blocks=blocks, **remote)


def check_reader_api(datasource: type, metadata_provider: type, version: str) -> None:
    """JobError, before the cluster reads, where this Ray lacks the file-reading hooks the JSONL reader extends
    (`_read_stream`, `_get_block_metadata`: Ray Data's own file readers are built on them, and they are not part of
    its stable API)."""
    missing = [
        f"{cls.__name__}.{name}"
        for cls, name in ((datasource, "_read_stream"), (metadata_provider, "_get_block_metadata"))
        if not callable(getattr(cls, name, None))
    ]
    if missing:
        raise JobError(
            f"--ray: JSONL input is read through Ray Data's {' and '.join(missing)}, which ray {version} does not "
            "have; convert the input to Parquet (read by Ray Data's read_parquet) or run the job without --ray"
        )


def _jsonl_memory_ratio(paths: list[str], columns: list[str], kept: pa.Schema, chunk_rows: int, sample=1 << 20):
    """The bytes of the read tasks' tables per byte of their files, from the first `sample` bytes of each file
    (whole lines; up to 8 files). Ray Data plans the blocks from a read task's size, the files' bytes by default: a
    read task's output comes in blocks of its target size (128 MiB) that it then cuts in as many pieces as `blocks`
    needs by that size; tables without JSON's keys and without the columns the job does not read are smaller than
    their files, so the files' bytes would leave blocks of more than a window's rows."""
    read = memory = 0
    for path in paths[:8]:
        with open(path, "rb") as f:
            head = f.read(sample)
            if f.read(1):  # more follows: the head's whole lines
                head = head[: head.rfind(b"\n") + 1]
        read += len(head)
        memory += sum(t.nbytes for t in _jsonl_tables([head], columns, kept, chunk_rows))
    return memory / read if read and memory else 1.0


def _jsonl_tables(blocks, columns: list[str], kept: pa.Schema, chunk_rows: int):
    """A JSONL file's bytes (read as `blocks`) -> tables of one schema whatever the values (the blocks of one read
    task are concatenated): each task column as text, with beside it (NOT_TEXT) the JSON of each value that is not
    text (null elsewhere; a number, an object, a string with undecodable bytes), so that the actors see the values
    themselves; ROW_ERROR, each row's reading error (a line that is not JSON) or null; and each kept column as the
    local job has it in its part: the chunk's Arrow column (batch/inputs) in its type of `kept` (the survey's), a
    kept task column under KEPT + its name."""
    keep = kept.names
    for chunk in jsonl_chunks(blocks, columns, keep, chunk_rows):
        n = len(chunk)
        table = {}
        for c in columns:
            table[c], table[NOT_TEXT + c] = _text_and_json(chunk.values[c])
        table[ROW_ERROR] = pa.array(chunk.values.get(ROW_ERROR) or [None] * n, pa.string())
        for field in kept:
            table[KEPT + field.name if field.name in columns else field.name] = conform(
                chunk.keep[field.name], field.type
            )
        yield pa.table(table)


def _text_and_json(values: list) -> tuple[pa.Array, pa.Array]:
    texts, others = [], []
    for v in values:
        if v is None or isinstance(v, str) and _encodes(v):
            texts.append(v)
            others.append(None)
        else:
            texts.append(None)
            others.append(json.dumps(v))  # ensure_ascii: a lone surrogate as \udcXX, which json.loads gives back
    return pa.array(texts, pa.string()), pa.array(others, pa.string())


def _encodes(text: str) -> bool:
    """Whether Arrow can hold `text` (not a string of undecodable bytes kept as lone surrogates: "invalid UTF-8")."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _jsonl_values(batch: pa.Table, column: str) -> list:
    """A task column of a _jsonl_tables block: each row's value as json.loads gave it in the read task."""
    values = batch.column(column).to_pylist()
    for row, other in enumerate(batch.column(NOT_TEXT + column).to_pylist()):
        if other is not None:
            values[row] = json.loads(other)
    return values


class KeptTypes(Predictor):
    """batch.Predictor whose --keep columns come out in the types of `kept` (batch/inputs.survey's: the local
    job's). Ray Data's readers may type a block's column otherwise than the local job does, and parts of
    different schemas do not read as one table. A JSONL block (_jsonl_tables) holds its rows' reading errors and
    its kept columns already in their types."""

    def __init__(self, task: str, model: str, kept: pa.Schema, **options):
        super().__init__(task, model, **options)
        self.kept = kept

    def __call__(self, batch):
        if ROW_ERROR in batch.column_names:
            return self._jsonl(batch)
        return conform_kept(super().__call__(batch), self.kept)

    def _jsonl(self, batch: pa.Table) -> pa.Table:
        """What the local job writes for these rows: a row's reading error is its error (batch/job.py)."""
        errors = batch.column(ROW_ERROR).to_pylist()
        result = self.predict({c: _jsonl_values(batch, c) for c in self.columns}, errors).table
        names = set(self.columns)
        kept = {c: batch.column(KEPT + c if c in names else c) for c in self.options["keep"]}
        return pa.table({**kept, **{n: result[n] for n in result.column_names}})


def conform_kept(table: pa.Table, kept: pa.Schema) -> pa.Table:
    """`table` with each column of `kept` in its type there (batch/inputs.conform: a cast, or text)."""
    for field in kept:
        index = table.schema.get_field_index(field.name)
        table = table.set_column(index, field.name, conform(table.column(index).combine_chunks(), field.type))
    return table


def run(options: dict, log=print) -> int:
    try:
        import ray
    except ImportError:
        raise JobError("--ray needs ray: pip install 'bertserve[ray]'") from None
    columns = check_task_options(options)
    options, choice = settle_precision(options)  # in the driver: every actor runs what the manifest records
    keep = list(options["keep"])
    files, model_path, output, identity, previous, surveyed = plan_job(options, [*columns, *keep])
    readable = [f for f in files if f.rows != 0]  # a file without a row is no read's, whatever its format
    kind = _format(readable) if readable else None
    if previous is not None:
        if previous.get("complete"):
            log(f"{output}: already complete ({previous['rows_done']} rows); --overwrite starts over")
            return 0
    model = load(str(model_path), options, 1)  # refused here, before the cluster is asked for anything
    schema = {"keep": keep, "results": [f"{f.name}: {f.type}" for f in _schema(options, model)]}
    model.backend.close()
    output.mkdir(parents=True, exist_ok=True)
    clear_output(output)
    staging = output / RAY_TMP
    shutil.rmtree(staging, ignore_errors=True)
    if readable:  # else no row at all: a manifest of no parts, as the local job's, and no cluster asked
        _run_on_ray(ray, options, readable, kind, columns, surveyed, model_path, staging)
    parts, at, errors = [], 0, 0
    for index, path in enumerate(sorted(staging.glob("*.parquet"))):  # write tasks' files, named in task order
        metadata = pq.ParquetFile(path).metadata
        name = PART.format(index)
        os.replace(path, output / name)
        rows = metadata.num_rows
        part_errors = int(pq.read_table(output / name, columns=["error"])["error"].drop_null().__len__())
        parts.append(
            {
                "file": name,
                "rows": [at, at + rows],
                "errors": part_errors,
                "bytes": (output / name).stat().st_size,
                "sha256": file_sha256(output / name),
            }
        )
        at += rows
        errors += part_errors
    shutil.rmtree(staging, ignore_errors=True)
    manifest = {
        "format": 1,
        **identity,
        "model": {**identity["model"], **engine(model, choice)},
        "schema": schema,
        "parts": parts,
        "rows_done": at,
        "errors": errors,
        "complete": True,
        "runner": f"ray {ray.__version__} ({options['ray']})",
    }
    write_manifest(output, manifest)
    log(
        f"done on Ray: {at} rows in {len(parts)} parts, {errors} errors; "
        f"{model.backend.name} {model.backend.precision} ({choice.why}); {output / MANIFEST}"
    )
    return 0


def _run_on_ray(
    ray, options: dict, files: list[InputFile], kind: str, columns: list[str], surveyed: Survey, model_path, staging
) -> None:
    """The rows of `files` (their task `columns` and --keep ones) through the model-holding actors, written as
    Parquet files into `staging`."""
    env = _actor_env()
    try:
        ray.init(address=options["ray"], ignore_reinit_error=True, log_to_driver=False)
    except ConnectionError as e:
        raise JobError(f"--ray {options['ray']}: {e}{_auth_hint(e)}") from None
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # parts in input order, as the local job writes them
        context.enable_progress_bars = False
        if hasattr(context, "use_datasource_v2"):
            # Ray 2.5x's Parquet reader starts a pool of footer-reading actors (a process each) to plan a read of a
            # few files; the first reader plans them in this process.
            context.use_datasource_v2 = False
        workers = _actors(ray, options)
        kwargs = predictor_options(options)
        blocks = _blocks(surveyed.rows or 1, options["window_rows"], workers)
        kept = pa.schema(list(surveyed.kept.items()))
        needed = list(dict.fromkeys([*columns, *options["keep"]]))
        dataset = _dataset(ray, files, kind, needed, blocks, (columns, kept, options["window_rows"]), env)
        # One block is one actor call (batch_size None): Ray Data would bundle two blocks smaller than a
        # window into one task. One call in flight per actor: a second one queued behind a busy actor is what
        # leaves the other idle at the end of the job.
        dataset = dataset.map_batches(
            KeptTypes,
            fn_constructor_args=(options["task"], str(model_path), kept),
            fn_constructor_kwargs={**kwargs, "threads": options["threads"] or 1, "passthrough": False},
            batch_size=None,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
            num_cpus=options["threads"] or 1,
            **({"runtime_env": {"env_vars": env}} if env else {}),
        )
        dataset.write_parquet(str(staging), min_rows_per_file=options["part_rows"])
    finally:
        ray.shutdown()


def _actor_env() -> dict:
    """What the model-holding actors need from this process's environment: bertserve's directory where this
    process finds it through PYTHONPATH and a worker would not (Ray puts the driver's working directory on its
    workers' path, and an installed bertserve needs nothing), with the thread count. Given to the actors alone,
    and only when needed: an actor with an environment of its own starts through Ray's setup_worker, which
    execs a second Python before the actor can load the model; a job-wide runtime_env would do that to every
    read and write task too."""
    root = Path(__file__).resolve().parents[1]
    path = [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root == Path.cwd().resolve() or root not in path:
        return {}
    return {k: os.environ[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS") if k in os.environ}


def _blocks(rows: int, window_rows: int, actors: int) -> int:
    """Blocks of at most a window's rows (rows >= 1), as many as a multiple of the actors, never more than rows:
    blocks of one size then end on every actor at about the same time, where one block more would leave all
    but one actor idle at the end."""
    windows = -(-rows // window_rows)
    return min(rows, -(-windows // actors) * actors)


def _auth_hint(error: BaseException) -> str:
    """A cluster that `ray start` gave token authentication (it does once a token is in ~/.ray/auth_token) refuses
    a driver given an explicit address unless that driver is told to send the token: say how."""
    cause = error
    while cause is not None:
        if "AuthToken" in str(cause) or type(cause).__name__ == "AuthenticationError":
            return (
                " (the cluster wants its authentication token: set RAY_AUTH_MODE=token, with the token in "
                "~/.ray/auth_token or RAY_AUTH_TOKEN, or start the cluster with RAY_AUTH_MODE=disabled)"
            )
        cause = cause.__cause__ or cause.__context__
    return ""


def _actors(ray, options: dict) -> int:
    """Model-holding actors: --workers, or one per CPU but one on each node, which reading and writing need
    (actors holding every CPU leave the read tasks none, and the job waits forever)."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    nodes = max(1, sum(1 for n in ray.nodes() if n.get("Alive")))
    per_actor = options["threads"] or 1
    actors = options["workers"] or max(1, (cpus - nodes) // per_actor)
    if actors * per_actor >= cpus:
        raise JobError(
            f"--workers {actors} x {per_actor} CPU leaves none of the cluster's {cpus} CPUs to read and write; "
            f"give at most {max(1, (cpus - 1) // per_actor)}"
        )
    return actors


def _schema(options: dict, model):
    from batch.columns import result_schema

    return result_schema(options["task"], model.dimensions)
