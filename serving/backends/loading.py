"""Loading one model directory for inference: its spec, checks, tokenizer, backend and longest input. The server's
engine (one unit per directory) and offline batch jobs (python -m batch) load a model this one way."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bert.tasks import TASKS
from bert.tasks.common import ModelFacts
from bert.tokenizer import BertTokenizer
from serving.backends import create_backend
from serving.backends.artifact import verify_artifact
from serving.backends.base import Backend
from serving.backends.model_dir import ModelError, ModelSpec, read_model_spec


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


def load_model(path: Path, settings, explicit: list[str] = ()) -> LoadedModel:
    """The model in `path` as `settings` (the server's Settings) say to run it; `explicit`: tasks it must serve
    (ModelError naming what it serves instead)."""
    spec = read_model_spec(path)
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
