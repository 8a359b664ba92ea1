"""Typed results. Field names are the server's; unknown fields are kept, so a newer server's
additions reach the caller instead of breaking the parse."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Label(_Result):
    """One class of a /classify answer."""

    label: str
    score: float


class Entity(_Result):
    """One entity of a /ner answer: `entity_group` when aggregated, `entity` + `index` (the token's
    position) when the request asked for aggregation "none". Offsets are characters of the input."""

    score: float
    word: str
    start: int | None = None
    end: int | None = None
    entity_group: str | None = None
    entity: str | None = None
    index: int | None = None

    @property
    def label(self) -> str:
        """The entity's type whichever aggregation produced it."""
        return self.entity_group if self.entity_group is not None else (self.entity or "")


class Answer(_Result):
    """One answer span of /qa; `start`/`end` are character offsets into the context."""

    answer: str
    score: float
    start: int
    end: int


class Ranked(_Result):
    """One text of a /rerank answer: its position in the request, its score, and the text when asked for."""

    index: int
    score: float
    text: str | None = None


class SparseValue(_Result):
    """One nonzero entry of an /embed_sparse vector (text-embeddings-inference's shape): its vocabulary index and
    value, and the vocabulary word when asked for (`return_tokens=True`)."""

    index: int
    value: float
    token: Optional[str] = None


class MaskCandidate(_Result):
    """One proposal for a [MASK] of a /fill-mask answer: its probability, the token id and text, and the input
    with that [MASK] filled."""

    score: float
    token: int
    token_str: str
    sequence: str


class ZeroShotResult(_Result):
    """A /zero-shot answer for one text: the candidate labels best first and their scores, in that order
    (transformers' zero-shot-classification pipeline's fields)."""

    sequence: str
    labels: list[str]
    scores: list[float]

    @property
    def label(self) -> str:
        """The best label."""
        return self.labels[0]


class QAInput(BaseModel):
    """One question over one context, for `qa([...])`."""

    question: str
    context: str


class ServedModel(_Result):
    """One of a task's models in /info: the name a call's `model=` picks it by, its directory, its longest input in
    tokens, its labels."""

    name: str
    path: str | None = None
    max_input_length: int | None = None
    labels: list[str] | None = None


class Info(_Result):
    """GET /info. Every field is optional so that a server reporting less still parses."""

    model: str | None = None
    tasks: list[str] = []
    backend: str | None = None
    precision: str | None = None
    max_batch_requests: int | None = None
    max_batch_tokens: int | None = None
    max_input_length: int | None = None
    max_client_batch_size: int | None = None
    version: str | None = None
    models: dict[str, list[ServedModel]] = {}  # per task, its models in order: the first is the default

    def model_names(self, task: str) -> list[str]:
        """The names `model=` takes for `task` (the first is the default); [] for a task not served."""
        return [m.name for m in self.models.get(task, [])]

    @property
    def client_batch_limit(self) -> int | None:
        """How many inputs one request may carry: `max_client_batch_size`, else `max_batch_requests`."""
        return self.max_client_batch_size or self.max_batch_requests


# Every result type above is part of the package's API (bertserve_client/__init__.py exports them all), so a type
# added here is exported with it.
__all__ = sorted(
    name
    for name, value in dict(globals()).items()
    if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == __name__ and name[0] != "_"
)
