"""Loading one model directory for inference: its spec, checks, tokenizer, backend and longest input. The server's
engine (one unit per directory) and offline batch jobs (python -m batch) load a model this one way, each saying
how in a LoadOptions (the server maps its settings into one, a batch job its options)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bert.tasks import TASKS
from bert.tasks.common import ModelFacts
from bert.tokenizer import BertTokenizer
from runtime.artifact import verify_artifact
from runtime.backends import create_backend
from runtime.backends.base import Backend
from runtime.model_dir import ModelError, ModelSpec, read_model_spec


@dataclass(frozen=True)
class LoadOptions:
    """How to load and run a model: what the loader and the backends read."""

    backend: str = "auto"  # a registered backend's name, "auto" (by the directory's kind), or "package.module:factory"
    device: str = "cpu"  # cpu | cuda
    precision: str | None = None  # fp32 | fp16 | bf16 | int8 | fp8; None: the artifact's, else the device's default
    pooling: str | None = None  # cls | mean | max: the embedding's pooling where the directory does not say
    allow_unverified: bool = False  # serve an artifact whose manifest does not describe its files
    max_input_length: int | None = None  # tokens one input may have (None: the model's own limit)
    max_batch_tokens: int = 16384  # a batch's padded tokens: the longest input must fit
    threads: int | None = None  # CPU threads in all (None: the runtime's choice)
    inference_workers: int | None = None  # batches run at once (None: 2 on CPU, 1 on CUDA)
    torch_packed: bool | None = None  # the torch backend's packed path (None: the device's default)
    torch_cuda_graphs: bool | None = None
    torch_gelu_epilogue: bool | None = None

    @property
    def effective_inference_workers(self) -> int:
        # Two single-threaded runs at once beat one run on two threads on CPU (figures: docs/serving.md,
        # --inference-workers).
        return self.inference_workers or (1 if self.device == "cuda" else 2)

    @property
    def effective_precision(self) -> str:
        return self.precision or ("fp16" if self.device == "cuda" else "fp32")


@dataclass
class LoadedModel:
    spec: ModelSpec
    backend: Backend
    tokenizer: BertTokenizer
    max_length: int

    def facts(self, task: str) -> ModelFacts:
        return ModelFacts(
            labels=self.spec.labels.get(task, {}),
            problem_type=self.spec.problem_type,
            pooling=getattr(self.spec, "pooling", None),
            tokenizer=self.tokenizer,
        )

    @property
    def dimensions(self) -> int | None:
        """The width of the encoder's vectors (what a task without a head, served by the encoder, answers)."""
        return int(self.spec.config.get("hidden_size", 0)) or None


def exact_model_problem(exact: LoadedModel, fast: LoadedModel) -> str | None:
    """Why `exact` cannot answer again what `fast` is unsure of (None: it can): it must read fast's token ids as
    the same words and take its longest sequences."""
    if exact.tokenizer.get_vocab() != fast.tokenizer.get_vocab():
        return f"its vocabulary is not that of {fast.spec.path}; it would read the same token ids as other words"
    if exact.max_length < fast.max_length:
        return f"takes at most {exact.max_length} tokens, {fast.spec.path} {fast.max_length}"
    return None


def load_model(path: Path, settings: LoadOptions, explicit: list[str] = ()) -> LoadedModel:
    """The model in `path` as `settings` say to run it; `explicit`: tasks it must serve (ModelError naming what it
    serves instead)."""
    spec = read_model_spec(path)
    for task in explicit:  # a task any encoder serves, but only where asked (not Task.served_by_default)
        if task not in spec.tasks and TASKS[task].head is None:
            spec.tasks.append(task)
            spec.labels[task] = {}
    if not settings.allow_unverified:
        verify_artifact(spec)  # before the tokenizer or a backend reads any of its files
    if settings.pooling and spec.pooling.source == "default":  # the flag fills in what the directory omits
        spec.pooling = replace(spec.pooling, mode=settings.pooling, source="flag")
    tokenizer = BertTokenizer.from_dir(path)  # first: a bad tokenizer is found before a model loads
    backend = create_backend(spec, settings)
    backend.pad_token_id = tokenizer.pad_token_id
    backend.pad_to_multiple_of = 8 if settings.device == "cuda" else None  # tensor-core friendly widths
    missing = [t for t in explicit if t not in backend.tasks]
    if missing:
        reasons = "".join(f"; {r}" for t in missing if (r := TASKS[t].unserved_reason(spec.config)))
        raise ModelError(
            f"{path} was given for {', '.join(missing)} but serves only {', '.join(backend.tasks)}{reasons}"
        )
    # A sentence-transformers model's max_seq_length is the longest input it was tuned on.
    limits = [
        spec.max_position_embeddings,
        settings.max_input_length,
        backend.max_sequence_length,
        spec.pooling.max_length,
    ]
    max_length = min(x for x in limits if x)
    if max_length > settings.max_batch_tokens:
        raise ModelError(
            f"max_batch_tokens ({settings.max_batch_tokens}) must be at least the longest "
            f"input ({max_length} tokens); raise it or lower --max-input-length"
        )
    return LoadedModel(spec, backend, tokenizer, max_length)
