"""Server settings: one pydantic-settings model read from `BERTSERVE_*` env vars, overridable by flags.

Every field's description is also its `--help` line: `python -m serving` reads this model through bert/options.py,
as every command reads its options (flag > env var > default), so the two never drift.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import Field, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bert.tasks import registry
from bert.tasks.base import Task
from runtime.backends import BACKENDS

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
# Old setting -> the one that replaced it: deployed configurations still set the old names, which are read (with
# a warning) into the new ones.
DEPRECATED = {"qa_max_windows": "max_request_sequences"}


def _dashed(name: str) -> str:
    return name.replace("_", "-")


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BERTSERVE_", extra="ignore", protected_namespaces=())

    # ---- what to serve
    model: Optional[str] = Field(
        None,
        description="checkpoint or artifact dir (or checkpoint store name, or Hub id org/name[@revision]) serving "
        "every task it has; "
        "default: the built-in demo model",
    )
    verify_model: Optional[str] = Field(
        None,
        description="an exact model (e.g. the fp32 export beside an int8 --model) for every served task that can "
        "tell an unsure answer (classify, ner, qa, rerank, zero-shot, fill-mask) and has no --TASK-verify-model of its own: what "
        '--TASK-verify-model does for each (docs/serving.md, "Fast answers")',
    )
    ignore_verify_graph: bool = Field(
        False,
        description="serve an int8 artifact exported with --verify-graph without its verify/ fp32 graph (by "
        "default the server answers again on it, as --verify-model, what the int8 graph is unsure of)",
    )
    backend: str = Field(
        "auto",
        description="auto | torch | onnxruntime | tensorrt (auto: onnxruntime for an artifact dir with "
        "model.onnx, tensorrt for one with only model.plan, torch for a checkpoint); "
        "or 'package.module:factory' for a custom backend",
    )
    pooling: Optional[Literal["cls", "mean", "max"]] = Field(
        None,
        description="how /embed pools token states, for a model directory that does not say (no "
        'sentence-transformers modules.json, no "pooling" in config.json): default mean',
    )
    allow_unverified: bool = Field(
        False,
        description="serve an artifact directory (model.onnx / model.plan) even when its manifest.json is "
        "missing or does not match its files (sizes and sha256); without it such a directory "
        "is refused at startup",
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu | cuda")
    precision: Optional[Literal["fp32", "fp16", "bf16", "int8", "fp8"]] = Field(
        None,
        description="fp32 | fp16 | bf16 | int8 | fp8 for the torch backend (default fp32 on cpu, fp16 on cuda; "
        "int8: int8 matrix products, each activation row its own scale, on cpu or cuda; fp8: the same in fp8 "
        "on a GPU of compute capability 8.9+); an artifact's precision is fixed at export time",
    )
    threads: Optional[int] = Field(None, ge=1, description="CPU threads for inference (default: the runtime's choice)")
    inference_workers: Optional[int] = Field(
        None,
        ge=1,
        description="batches that run at once, each on threads/workers CPU threads (default: 2 on "
        "cpu, 1 on cuda; 1 for a backend whose runs cannot overlap, such as tensorrt)",
    )
    torch_packed: Optional[bool] = Field(
        None,
        description="torch backend: run only the real tokens of a batch (varlen attention), once that has "
        "matched the padded path on a probe batch at load time; when it does not, the log says why and batches "
        "run padded (default: on for cuda, off for cpu)",
    )
    torch_cuda_graphs: Optional[bool] = Field(
        None,
        description="torch backend, packed path: replay one CUDA graph per shape bucket (default: on for cuda)",
    )
    torch_gelu_epilogue: Optional[bool] = Field(
        None,
        description="torch backend, packed path: the feed-forward GELU inside the matmul (cuBLASLt's tanh "
        "approximation); default: only for models trained with tanh GELU, true applies it to exact-GELU models too",
    )

    # ---- network
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 for all interfaces)")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on")
    api_key: Optional[str] = Field(
        None,
        description="require 'Authorization: Bearer KEY' on every request but "
        "/health, /ready, /metrics and the API docs; an empty or "
        "blank key is a startup error, never 'auth off'",
    )
    max_body_bytes: int = Field(2_000_000, ge=1024, description="largest request body accepted (413 beyond)")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a connection that has not sent a request's complete "
        "headers this long after connecting (or after its "
        "first byte) is closed with 408",
    )
    body_timeout_s: float = Field(30.0, gt=0, description="longest a request may take to send its body (408 beyond)")

    # ---- batching and admission
    max_concurrent_requests: int = Field(512, ge=1, description="requests admitted at once; more get 429 at once")
    max_batch_tokens: int = Field(16384, ge=1, description="token budget of one batch: padded length x sequences")
    max_batch_requests: Optional[int] = Field(
        None,
        ge=1,
        description="most sequences in one batch (default on cpu: 4 for onnxruntime, where a bigger batch of "
        "short texts mostly adds padding, 32 for the torch backend; 32 on cuda)",
    )
    max_padding: Optional[float] = Field(
        None,
        ge=0,
        le=1,
        description="most padding a batch may carry, as a share of its padded tokens; longer or "
        "shorter sequences wait for a batch of their own (default 0.25 on cpu, where a "
        "pad token costs as much as a real one; none on cuda)",
    )
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        description="longest a sequence waits for more to join its batch while the model is idle "
        "(0: run at once; batches still form from what queues while the model is busy)",
    )
    max_input_length: Optional[int] = Field(
        None,
        ge=8,
        description="longest input in tokens (default: the model's max_position_embeddings); "
        'longer inputs get 422 unless the request sends "truncate": true',
    )
    max_client_batch_size: int = Field(32, ge=1, description="most inputs in one request (413 beyond)")
    max_request_sequences: int = Field(
        256,
        ge=1,
        description="most model inputs one request may fan out to, over all its items (413 beyond), counted "
        "before any is built (a QA context's windows: contexts are windowed, never cut)",
    )
    qa_max_windows: Optional[int] = Field(
        None,
        ge=1,
        description="deprecated: the old name of --max-request-sequences (it capped every task's fan-out, not "
        "only QA's); still read, with a warning",
    )
    shutdown_timeout_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM, how long admitted requests may take "
        "to finish; those still running then get a JSON 503 "
        "and the server exits (a second signal: at once)",
    )
    drain_delay_s: float = Field(
        5.0,
        ge=0,
        description="on SIGTERM, how long /ready answers 503 while requests are still served, so load "
        'balancers stop sending before admission closes (docs/serving.md, "Shutdown"); the '
        "default leaves half of docker stop's 10 s grace for the requests then in flight",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info", description="uvicorn's and the server's log level"
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text | json (one JSON object per line: time, level, request id, route, task, status, "
        "items, tokens, queue/inference/total ms)",
    )
    access_log: bool = Field(
        False,
        description="log one line per request (request id from x-request-id, route, "
        "task, status, items, tokens, times)",
    )

    # ---- tracing
    otlp_endpoint: Optional[str] = Field(
        None,
        description="export one OpenTelemetry trace per request (its queue wait, tokenize, inference and decode as "
        "child spans) over OTLP/HTTP (protobuf) to this collector URL, e.g. http://localhost:4318 (its "
        "/v1/traces is added when the URL has no path); needs the otlp extra (pip install 'bertserve[otlp]'); "
        'default: no tracing, at no cost (docs/serving.md, "Tracing")',
    )
    otlp_service_name: str = Field(
        "bertserve", min_length=1, description="the service.name the traces of --otlp-endpoint are reported under"
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_endpoint(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(r"^https?://[^/\s]+", value.strip()):
            raise ValueError(f"expected an http:// or https:// URL of an OTLP/HTTP collector, got {value!r}")
        return value.strip() if value is not None else None

    @field_validator("api_key")
    @classmethod
    def _no_blank_key(cls, value: Optional[str]) -> Optional[str]:
        # An empty Secret or a stray `BERTSERVE_API_KEY=` must not silently open every route.
        if value is not None and not value.strip():
            raise ValueError(
                "BERTSERVE_API_KEY / --api-key is set but empty or blank; set a real key, "
                "or unset the variable to run without authentication"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> "_Settings":
        for old, new in DEPRECATED.items():
            if getattr(self, old) is None:
                continue
            if new in self.model_fields_set:
                raise ValueError(f"{old} is the deprecated name of {new}: give only {new}")
            warnings.warn(
                f"--{_dashed(old)} (BERTSERVE_{old.upper()}) is deprecated: use --{_dashed(new)} "
                f"(BERTSERVE_{new.upper()})",
                FutureWarning,
                stacklevel=2,
            )
            setattr(self, new, getattr(self, old))
        names = ("auto", *BACKENDS)
        if self.backend not in names and ":" not in self.backend:
            raise ValueError(f"backend must be one of {', '.join(names)} or 'module:factory', got {self.backend!r}")
        for task in registry.TASKS.values():
            values = self.task_values(task)
            problems = task.serve_problems(values) if values else []
            if problems:
                raise ValueError("; ".join(problems))
        return self

    # ------------------------------------------------------------------ derived
    def task_models(self) -> dict[str, list["NamedModel"]]:
        """Task -> the models asked for it with --TASK-model, in the order given (the first is the default);
        a task without the flag is missing (whatever --model / the demo model offers serves it)."""
        wanted = {task: parse_models(getattr(self, f"{task}_model", None) or []) for task in registry.names()}
        return {task: models for task, models in wanted.items() if models}

    def task_values(self, task: Task) -> dict:
        """A task's serve_options as set here, by their names in the task (max_length for --qa-max-length)."""
        return {o.name: getattr(self, f"{task.name}_{o.name}") for o in task.serve_options}

    @property
    def max_doc_stride(self) -> int | None:
        """The largest doc_stride a request may send: the narrowest of the tasks' own (Task.max_doc_stride)."""
        strides = [task.max_doc_stride(self.task_values(task)) for task in registry.TASKS.values()]
        return min((s for s in strides if s is not None), default=None)

    @property
    def effective_inference_workers(self) -> int:
        # Two single-threaded runs at once beat one run on two threads on CPU (figures: docs/serving.md,
        # --inference-workers).
        return self.inference_workers or (1 if self.device == "cuda" else 2)

    def effective_max_batch_tokens(self, cpu_default: int | None = None) -> int:
        """The flag when given, else on a CPU the backend's own `cpu_default` where it has one (the torch backend's
        3,072: docs/serving.md, "Batch size on a CPU, per backend"), else the flag's default."""
        if "max_batch_tokens" in self.model_fields_set or self.device == "cuda" or cpu_default is None:
            return self.max_batch_tokens
        return min(self.max_batch_tokens, cpu_default)

    def effective_max_batch_requests(self, cpu_default: int = 4) -> int:
        """The flag, else 32 on a GPU (the batch is the point) and on a CPU the backend's own `cpu_default`
        (onnxruntime's 4: a batch buys it little per sequence and costs padding; figures: docs/serving.md,
        --max-batch-requests)."""
        return self.max_batch_requests or (32 if self.device == "cuda" else cpu_default)

    @property
    def effective_max_padding(self) -> float | None:
        if self.max_padding is not None:
            return self.max_padding
        return None if self.device == "cuda" else 0.25

    @property
    def effective_precision(self) -> str:
        return self.precision or ("fp16" if self.device == "cuda" else "fp32")


# A model's name in `--TASK-model NAME=DIR`: what requests send as "model" (OpenAI's names have dots, colons and
# slashes: "text-embedding-3-small", "org/name").
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}")


@dataclass(frozen=True)
class NamedModel:
    """One --TASK-model value: the name requests select it by, the directory (or store name, or Hub id) to load,
    and whether the name was given (NAME=DIR) or taken from the directory (a plain DIR)."""

    name: str
    source: str
    named: bool


def default_model_name(source: str) -> str:
    """The name of a model given without one: a local directory's own name, else the store name or Hub id
    without its @revision."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve().name
    return source.split("@", 1)[0].rstrip("/") or source


def parse_models(values: list[str]) -> list[NamedModel]:
    """--TASK-model values: `NAME=DIR` or a plain `DIR` (named by default_model_name); a whole value that is an
    existing directory is a plain DIR even with an "=" in it. ValueError, one line: a bad name, an empty DIR, a
    name given twice."""
    models: list[NamedModel] = []
    for value in values:
        name, sep, source = value.partition("=")
        if not sep or Path(value).expanduser().is_dir():
            models.append(NamedModel(default_model_name(value), value, False))
            continue
        if not MODEL_NAME.fullmatch(name):
            raise ValueError(
                f"{value!r}: NAME=DIR needs a name of letters, digits and . _ : / + - (starting with a letter or "
                f"digit), got {name!r}"
            )
        if not source.strip():
            raise ValueError(f"{value!r}: NAME=DIR needs a directory after the '='")
        models.append(NamedModel(name, source, True))
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        unnamed = any(not m.named for m in models if m.name in twice)
        raise ValueError(
            f"the model name {', '.join(map(repr, twice))} is given twice"
            + ("; name each model with NAME=DIR" if unnamed else "")
        )
    return models


def _models_field(value):
    """--TASK-model from a flag (a list), an env var or a caller (a str: comma-separated), checked at startup."""
    if value is None:
        return []
    values = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else list(value)
    parse_models(values)
    return values


def _task_fields(task) -> dict:
    """The server's options for one task, from the task's declarations: --TASK-model, its serve_options
    (--qa-max-length), and --TASK-verify-model / --TASK-verify-margin for a task with margins."""
    routes = " and ".join(r.path for r in task.routes)
    fields = {
        f"{task.name}_model": (
            Annotated[list[str], NoDecode],
            Field(
                default_factory=list,
                description=f"model for {routes} (overrides --model for that task): DIR, or NAME=DIR, repeated for "
                f'several models in one server; a request picks one with "model": NAME, the first is the '
                'default; a plain DIR is named after its directory (docs/serving.md, "Several models per task")',
            ),
        )
    }
    for o in task.serve_options:
        fields[f"{task.name}_{o.name}"] = _option_field(o, o.help)
    if task.verify_margin is not None:  # a task with margins (the registry holds the two together)
        flag = "--" + task.name.replace("_", "-")
        fields[f"{task.name}_verify_model"] = (
            Optional[str],
            Field(
                None,
                description=f"a second, exact model for {routes} (e.g. the fp32 export beside an int8 --model): an "
                f"item whose best two answers are closer than {flag}-verify-margin is answered again by it, so a "
                "fast model's answers agree with the exact one's (docs/serving.md, \"Fast answers\")",
            ),
        )
        margin = task.verify_margin
        fields[f"{task.name}_verify_margin"] = _option_field(margin, f"with {flag}-verify-model: {margin.help}")
    return fields


def _option_field(o, description: str) -> tuple:
    """A task's declared option (bert.tasks.base.TaskOption) as a settings field: its type, default and bounds."""
    bounds = {k: v for k, v in (("ge", o.minimum), ("le", o.maximum)) if v is not None}
    kind = o.kind or type(o.default)
    return kind if o.default is not None else Optional[kind], Field(o.default, description=description, **bounds)


# Each registered task's options, declared by the task (bert/tasks/<name>.py) and generated here.
Settings = create_model(
    "Settings",
    __base__=_Settings,
    __module__=__name__,
    __validators__={
        "_task_models": field_validator(*(f"{name}_model" for name in registry.names()), mode="before")(
            classmethod(lambda cls, value: _models_field(value))
        )
    },
    **{name: field for task in registry.TASKS.values() for name, field in _task_fields(task).items()},
)
Settings.__doc__ = "The server's settings: the fields above, plus each registered task's own (_task_fields)."
