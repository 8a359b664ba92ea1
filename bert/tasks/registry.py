"""The task registry: what a task is, declared once and read everywhere else.

A task is a codec (text -> model inputs, model outputs -> answers) plus what the rest of bertserve needs
to know about it: the arrays a backend hands back for it, whether they have a row per token, which
checkpoint architecture is made for it alone, its head in a multi-task model, the names its outputs have
in an exported graph, its HTTP routes and the names of its request and response schemas. Training,
export, the backends, the batcher, the engine, the routes, the middleware and the metrics all read this
table; adding a task is a codec module and one `register(...)` below (plus whatever is truly its own:
its head in bert/model.py, its schemas, its training data).

numpy-free and torch-free: only names and the codec modules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from bert.tasks import classify, embed, ner, qa


@dataclass(frozen=True)
class Task:
    name: str
    codec: ModuleType
    # The backend's arrays for this task, one row per sequence: "classify" (L,), "ner" (T, L), "qa_start" (T,)...
    outputs: tuple[str, ...]
    output_ranks: tuple[int, ...]  # each output's dimensions in a batch: (B, L) 2, (B, T, L) 3, (B, T) 2
    per_token: bool  # those arrays have a row per token (sliced to each sequence's length by the batcher)
    architecture: str | None  # transformers class of a checkpoint made for this task alone
    head: str | None  # its head's attribute in BertForMultiTask; None: served by the encoder itself
    labelled: bool  # its head predicts named labels (id2label)
    trainable: bool  # python -m training.finetune --task NAME
    graph_outputs: dict[str, str]  # output names in an exported multi-task graph -> our output names
    single_graph_outputs: dict[str, str]  # output names in a graph exported for this task alone -> ours
    routes: tuple[str, ...]  # HTTP routes answering it, the main one first
    request_schema: str  # class names in serving/routes/schemas.py
    response_schema: str
    notes: dict = field(default_factory=dict, compare=False)


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is registered twice")
    TASKS[task.name] = task
    return task


register(Task(
    name="classify", codec=classify, outputs=("classify",), output_ranks=(2,), per_token=False,
    architecture="BertForSequenceClassification", head="classifier", labelled=True, trainable=True,
    graph_outputs={"classify_logits": "classify"}, single_graph_outputs={"logits": "classify"},
    routes=("/classify",), request_schema="ClassifyRequest", response_schema="ClassifyResponse"))
register(Task(
    name="ner", codec=ner, outputs=("ner",), output_ranks=(3,), per_token=True,
    architecture="BertForTokenClassification", head="token_classifier", labelled=True, trainable=True,
    graph_outputs={"ner_logits": "ner"}, single_graph_outputs={"logits": "ner"},
    routes=("/ner",), request_schema="NerRequest", response_schema="NerResponse"))
register(Task(
    name="qa", codec=qa, outputs=("qa_start", "qa_end"), output_ranks=(2, 2), per_token=True,
    architecture="BertForQuestionAnswering", head="qa_outputs", labelled=False, trainable=True,
    graph_outputs={"qa_start_logits": "qa_start", "qa_end_logits": "qa_end"},
    single_graph_outputs={"start_logits": "qa_start", "end_logits": "qa_end"},
    routes=("/qa",), request_schema="QARequest", response_schema="QAResponse"))
register(Task(
    name="embed", codec=embed, outputs=("embed",), output_ranks=(2,), per_token=False,
    architecture="BertModel", head=None, labelled=False, trainable=False,
    graph_outputs={"embedding": "embed"}, single_graph_outputs={"embedding": "embed"},
    routes=("/embed", "/v1/embeddings"), request_schema="EmbedRequest", response_schema="EmbedResponse"))


# ---- derived tables (read these; never re-declare them) -------------------------------------------
def names(*, trainable: bool | None = None, labelled: bool | None = None) -> tuple[str, ...]:
    """Task names in registration order, optionally only the trainable / labelled ones."""
    return tuple(t.name for t in TASKS.values()
                 if (trainable is None or t.trainable == trainable) and (labelled is None or t.labelled == labelled))


def with_heads() -> tuple[str, ...]:
    """Tasks that need a head of their own (a task without one is served by any encoder)."""
    return tuple(t.name for t in TASKS.values() if t.head is not None)


def per_token_outputs() -> frozenset[str]:
    return frozenset(o for t in TASKS.values() if t.per_token for o in t.outputs)


def task_of_architecture(architecture: str) -> str | None:
    return next((t.name for t in TASKS.values() if t.architecture == architecture and t.head is not None), None)


def routes() -> dict[str, str]:
    """HTTP route -> task."""
    return {route: t.name for t in TASKS.values() for route in t.routes}


def graph_output_names(tasks: list[str]) -> dict[str, str]:
    """Output names of an exported graph serving `tasks` -> our output names. A graph made for one task
    alone may use that task's single-task names ("logits", "start_logits"); a multi-task graph names
    every output after its task ("classify_logits")."""
    mapping = {name: out for t in TASKS.values() if t.name in tasks for name, out in t.graph_outputs.items()}
    headed = [t for t in tasks if TASKS[t].head is not None]
    for task in (headed if len(headed) == 1 else []) + [t for t in tasks if TASKS[t].head is None]:
        mapping.update(TASKS[task].single_graph_outputs)
    return mapping


def missing_outputs(tasks: list[str], present) -> list[str]:
    """The tasks among `tasks` whose outputs are not all in `present`."""
    return [t for t in tasks if not set(TASKS[t].outputs) <= set(present)]
