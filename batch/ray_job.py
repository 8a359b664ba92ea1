"""The same job on a Ray cluster (--ray auto|ADDRESS): Ray Data reads the files (read_parquet / read_json /
read_csv), one model-holding actor per worker runs `batch.Predictor` over `--window-rows` rows at a time (the
same codecs, batching and result columns as the local job), and write_parquet writes the parts, which are then
named part-NNNNN.parquet in input order and recorded in the same _manifest.json. A kept column has the local
job's one type in every part, whatever type Ray Data's reader gave it in a block; a file without a row is in the
manifest and in no read. A Ray job is not resumed part by part: a rerun of an unfinished one starts over (one of
a finished one says so and stops). ray is imported here only, and only under --ray.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batch.inputs import InputFile, Survey, conform
from batch.job import MANIFEST, PART, clear_output, engine, file_sha256, plan_job, write_manifest
from batch.predict import JobError, Predictor, check_task_options, load, settle_precision

RAY_TMP = ".ray-parts"


def _format(files: list[InputFile]) -> str:
    kinds = {f.format for f in files}
    if len(kinds) > 1:
        raise JobError(f"--ray reads one format per job; --input holds {', '.join(sorted(kinds))} files")
    return kinds.pop()


def _dataset(ray, files: list[InputFile], kind: str, needed: list[str], blocks: int):
    """The input as `blocks` blocks of about a window's rows, cut by the read tasks themselves (no task of another
    operator): Ray Data splits each read task's output evenly, so files of very different sizes give the larger
    ones bigger blocks. `files` hold rows (a reader refuses some files without one: an empty CSV file)."""
    paths = [str(f.path) for f in files]
    if kind == "parquet":
        return ray.data.read_parquet(paths, columns=needed, override_num_blocks=blocks)
    if kind == "jsonl":
        return ray.data.read_json(paths, lines=True, override_num_blocks=blocks).select_columns(needed)
    import pyarrow.csv as csv

    parse = csv.ParseOptions(delimiter="\t" if kind == "tsv" else ",")
    # Text, as the local job reads a CSV file's values, not the types Arrow guesses for each block ("007" -> 7).
    convert = csv.ConvertOptions(column_types={c: pa.string() for c in needed})
    dataset = ray.data.read_csv(paths, parse_options=parse, convert_options=convert, override_num_blocks=blocks)
    return dataset.select_columns(needed)


class KeptTypes(Predictor):
    """batch.Predictor whose --keep columns come out in the types of `kept` (batch/inputs.survey's: the local
    job's). Ray Data's readers type each block on its own (a JSONL block's ids ints, the next one's strings, a
    column of nulls), and parts of different schemas do not read as one table."""

    def __init__(self, task: str, model: str, kept: pa.Schema, **options):
        super().__init__(task, model, **options)
        self.kept = kept

    def __call__(self, batch):
        return conform_kept(super().__call__(batch), self.kept)


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
        _run_on_ray(ray, options, readable, kind, [*columns, *keep], surveyed, model_path, staging)
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
    ray, options: dict, files: list[InputFile], kind: str, needed: list[str], surveyed: Survey, model_path, staging
) -> None:
    """The rows of `files` through the model-holding actors, written as Parquet files into `staging`."""
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
        kwargs = {k: v for k, v in options.items() if k not in ("task", "model", "threads")}
        blocks = _blocks(surveyed.rows or 1, options["window_rows"], workers)
        dataset = _dataset(ray, files, kind, list(dict.fromkeys(needed)), blocks)
        # One block is one actor call (batch_size None): Ray Data would bundle two blocks smaller than a
        # window into one task. One call in flight per actor: a second one queued behind a busy actor is what
        # leaves the other idle at the end of the job.
        dataset = dataset.map_batches(
            KeptTypes,
            fn_constructor_args=(options["task"], str(model_path), pa.schema(list(surveyed.kept.items()))),
            fn_constructor_kwargs={**kwargs, "threads": options["threads"] or 1, "carry": False},
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
