"""python -m batch's options (bert/options.py: each is also an env var BERTSERVE_BATCH_<NAME>)."""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from bert.options import option
from bert.tasks import TASKS


def task_options() -> dict[str, tuple]:
    """The tasks' request fields a job offers as its own options (`Param.job`), declared once on the task:
    name -> (type, default, help, bounds); a name two tasks declare must mean the same to both."""
    found: dict[str, tuple] = {}
    owners: dict[str, list[str]] = {}
    for task in TASKS.values():
        for param in task.job_fields().values():
            help = param.job_help or param.help
            declared = (param.job_kind or param.kind, param.job_value, help, param.minimum, param.maximum)
            if found.setdefault(param.name, declared) != declared:
                raise ValueError(f"the job option {param.name!r} is declared twice, differently ({task.name})")
            owners.setdefault(param.name, []).append(task.name)
    return {name: (*value[:2], f"{', '.join(owners[name])}: {value[2]}", *value[3:]) for name, value in found.items()}


TASK_OPTIONS = tuple(task_options())
# What a part's rows are computed from: a rerun must have these as the run that wrote the manifest (the other
# options — workers, threads, progress — change how fast, not what).
RESULT_OPTIONS = (
    "task",
    "column",
    "keep",
    *TASK_OPTIONS,
    "truncate",
    "backend",
    "device",
    "precision",
    "pooling",
    "max_input_length",
    "max_batch_tokens",
    "max_batch_size",
    "max_padding",
    "max_row_sequences",
    "window_rows",
    "part_rows",
    "verify_model",
    "verify_margin",
    "ignore_verify_graph",
)


@dataclass
class _JobOptions:
    """python -m batch's options that every job has; BatchOptions adds the tasks' (task_options)."""

    env_prefix = "BERTSERVE_BATCH_"  # bert/options.py: an env var belongs to one command

    task: str = option(metavar="{" + ",".join(TASKS) + "}", help="the task to run on every row (the registry's names)")
    model: str = option(
        metavar="DIR|ORG/NAME",
        help="checkpoint or export artifact directory, a name in the checkpoint store, or a Hub id "
        "org/name[@revision], as the server's --model",
    )
    input: str = option(
        metavar="PATH",
        help="a Parquet, JSONL or CSV/TSV file, a directory of them, or a glob ('data/*.parquet'); files are read "
        "in sorted order and their rows numbered across them",
    )
    output: str = option(metavar="DIR", help="directory of Parquet part files and _manifest.json")
    column: list[str] = option(
        [],
        help="input column(s) the task reads: the text (default text); classify a pair as a,b; qa question,context "
        "(default); rerank query,document (default); zero_shot its premise, with --candidate-labels",
    )
    keep: list[str] = option([], help="input columns copied unchanged into the output beside the results (an id)")
    format: str = option(
        "auto",
        choices=("auto", "parquet", "jsonl", "csv", "tsv"),
        help="how to read the input files (auto: by each file's suffix .parquet .jsonl .json .csv .tsv)",
    )
    truncate: bool = option(
        False,
        help="cut inputs longer than the model takes; without it such a row gets an error and the job goes on",
    )
    backend: str = option("auto", help="auto | torch | onnxruntime | tensorrt, as the server's --backend")
    device: str = option("cpu", choices=("cpu", "cuda"), help="cpu | cuda")
    precision: str | None = option(
        "auto",
        choices=("auto", "fp32", "fp16", "bf16", "int8", "fp8"),
        help="torch backend: fp32 | fp16 | bf16 | int8 | fp8 (as the server's --precision); auto: bf16 matmuls for an embed job on a checkpoint on a CPU with "
        "AMX or AVX512-BF16 (over 2x fp32 there, cosine >= 0.99 with fp32), else fp32 on cpu, fp16 on cuda; "
        "an artifact's precision is fixed at export time (an int8 export is an int8 job)",
    )
    pooling: str | None = option(
        None, choices=("cls", "mean", "max"), help="embed: pooling for a model directory that does not say"
    )
    allow_unverified: bool = option(False, help="run an artifact directory whose manifest.json does not match it")
    verify_model: str | None = option(
        None,
        metavar="DIR",
        help="an exact model (the fp32 export beside an int8 --model) that answers again the rows whose answer "
        "--model is unsure of, as the server's --TASK-verify-model (classify, ner, qa, rerank, zero_shot, fill_mask: the tasks with margins; "
        "rerank's rows of one query are judged together within a window)",
    )
    ignore_verify_graph: bool = option(
        False,
        help="run an int8 artifact exported with --verify-graph without its verify/ fp32 graph (by default the rows "
        "it is unsure of are answered again on it, as with --verify-model)",
    )
    verify_margin: float | None = option(
        None,
        metavar="X",
        help="with --verify-model: a row whose margin is under this is answered again (default: the task's, as the "
        "server's --TASK-verify-margin)",
        minimum=0,
    )
    max_input_length: int | None = option(None, help="longest input in tokens (default: the model's)", minimum=1)
    max_batch_tokens: int = option(16384, help="token budget of one batch: padded length x sequences", minimum=1)
    max_batch_size: int | None = option(
        None,
        help="most sequences in one batch (default on cpu: 8 with onnxruntime, where a bigger batch mostly adds "
        "padding, 32 with torch, whose per-operator cost is paid once a batch; 64 on cuda)",
        minimum=1,
    )
    max_padding: float | None = option(
        0.25,
        help="most padding a batch may carry, as a share of its padded tokens (None, from Python: no limit)",
        minimum=0,
        maximum=1,
    )
    max_row_sequences: int = option(
        64,
        help="qa, zero_shot: most model inputs one row may fan out to (windows, labels); more is the row's error",
        minimum=1,
    )
    window_rows: int = option(
        2048, help="rows whose sequences are sorted by length together, so that batches carry little padding", minimum=1
    )
    part_rows: int = option(20000, help="rows per output part file (the unit a rerun resumes at)", minimum=1)
    workers: int = option(
        1,
        help="worker processes, each holding the model (0: as many as CPU cores); with --ray, model-holding actors "
        "(0: one per CPU of the cluster but one per node, left to reading and writing)",
        minimum=0,
    )
    threads: int | None = option(
        None, help="CPU threads per worker (default: the cores shared by the workers)", minimum=0
    )
    overwrite: bool = option(False, help="start over: remove the output directory's parts and manifest first")
    progress_interval: float = option(
        10.0,
        help="seconds between progress lines when stderr is not a terminal (a terminal gets a live bar)",
        minimum=0,
    )
    ray: str | None = option(
        None,
        metavar="auto|ADDRESS",
        help="run the job on a Ray cluster with Ray Data (auto: the local or RAY_ADDRESS cluster); ray is imported "
        "only with this option",
    )


BatchOptions = make_dataclass(
    "BatchOptions",
    [
        (name, kind, option(default, help, minimum=minimum, maximum=maximum))
        for name, (kind, default, help, minimum, maximum) in task_options().items()
    ],
    bases=(_JobOptions,),
    namespace={"__doc__": "python -m batch's options: the job's own, then the tasks' (bert/tasks, `Param.job`)."},
)
BatchOptions.__module__ = __name__
