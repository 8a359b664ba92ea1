"""The Hugging Face Inference API's task shapes, per task: what `huggingface_hub.InferenceClient` (and every client of
Inference Endpoints and of text-embeddings-inference's root route) sends and parses, and how each maps onto our own
request and answer.

A body is `{"inputs", "parameters", "options"}` (feature-extraction also takes its parameters at the top level, as
TEI reads them). Each pipeline (the Hub's pipeline tag) names the route of ours it runs on, turns an Inference API
body into that route's body (`to_native`) and our answer into the Inference API's (`to_hf`). A parameter is either
ours under another name, read when the answer is shaped, accepted because it changes nothing we answer, or refused
in one message naming it (something we cannot do). The routes (serving/routes/compat_hf.py) read this table and
name no task; the table is keyed by task so it can move onto the task objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bert.tasks import registry

# The Inference API's "options" (the serverless API's cache and cold-start switches): nothing for a server that is
# already running its model. Accepted and ignored.
OPTIONS = frozenset({"use_cache", "wait_for_model", "use_gpu"})
TOP_LEVEL = frozenset({"inputs", "parameters", "options", "model"})


@dataclass(frozen=True)
class Param:
    """One Inference API parameter. `field`: our request field it becomes (None: it is not one of ours);
    `refuse(value)`: why that value cannot be honoured, or None; `shaping`: read when the answer is shaped."""

    field: str | None = None
    refuse: Callable[[Any], str | None] | None = None
    shaping: bool = False
    note: str = ""


def _only(*allowed, why: str) -> Callable[[Any], str | None]:
    return lambda value: None if value in allowed else why


def _never(why: str) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else why


@dataclass(frozen=True)
class Pipeline:
    """One Hub pipeline tag served by one of our routes."""

    tag: str  # the Hub's pipeline tag: "text-classification"
    route: str  # our route that answers it
    parameters: dict[str, Param]
    to_native: Callable[[Any, dict], Any]  # (inputs, our fields from the parameters) -> our route's body
    to_hf: Callable[[Any, Any, dict], Any]  # (our answer, inputs, the parameters) -> the Inference API's answer
    claims: Callable[[dict], bool] = lambda body: False  # the body can only be this pipeline's
    top_level_parameters: bool = False  # its parameters may also sit beside "inputs" (TEI's embed body)
    takes: str = "a text or a list of texts"
    inputs_check: Callable[[Any], bool] = field(default=lambda inputs: _texts(inputs))


def _texts(inputs) -> bool:
    return isinstance(inputs, str) or (
        isinstance(inputs, list) and all(isinstance(x, str) for x in inputs) and len(inputs) > 0
    )


def _object_with(*keys):
    return lambda inputs: isinstance(inputs, dict) and all(k in inputs for k in keys)


def _with_inputs(inputs, fields: dict) -> dict:
    return {"inputs": inputs, **fields}


# ---- text-classification: [[{label, score}]] for one text, as the Inference API answers -----------------------
def _classes(answer, inputs, params):
    return [answer] if isinstance(inputs, str) else answer


# ---- token-classification: the entities; ignore_labels filters them -------------------------------------------
def _entities(answer, inputs, params):
    ignore = set(params.get("ignore_labels") or ())

    def kept(entities):
        return [e for e in entities if (e.get("entity_group") or e.get("entity")) not in ignore]

    return kept(answer) if isinstance(inputs, str) else [kept(a) for a in answer]


# ---- question-answering: inputs {question, context} -----------------------------------------------------------
def _qa_body(inputs, fields: dict) -> dict:
    return {"question": inputs["question"], "context": inputs["context"], **fields}


# ---- fill-mask: a flat list for a text with one mask (transformers' pipeline) ----------------------------------
def _masks(answer, inputs, params):
    def flat(per_mask):
        return per_mask[0] if len(per_mask) == 1 else per_mask

    return flat(answer) if isinstance(inputs, str) else [flat(a) for a in answer]


# ---- zero-shot-classification: [{label, score}] --------------------------------------------------------------
def _zero_shot(answer, inputs, params):
    def pairs(result):
        return [{"label": label, "score": score} for label, score in zip(result["labels"], result["scores"])]

    return pairs(answer) if isinstance(inputs, str) else [pairs(a) for a in answer]


def _zero_shot_body(inputs, fields: dict) -> dict:
    return {"inputs": inputs, **fields}


# ---- sentence-similarity: cosine of the source sentence's vector with each sentence's ----------------------
def _similarity_body(inputs, fields: dict) -> dict:
    return {"inputs": [inputs["source_sentence"], *inputs["sentences"]], **fields, "normalize": True}


def _similarities(answer, inputs, params):
    source, *others = answer
    return [sum(a * b for a, b in zip(source, other)) for other in others]


def _has_similarity_inputs(inputs) -> bool:
    return (
        isinstance(inputs, dict)
        and isinstance(inputs.get("source_sentence"), str)
        and isinstance(inputs.get("sentences"), list)
        and all(isinstance(s, str) for s in inputs["sentences"])
    )


# text-embeddings-inference's fields, which our /embed takes
_TEI_EMBED = {"truncation_direction": Param("truncation_direction"), "prompt_name": Param("prompt_name")}

PIPELINES: dict[str, tuple[Pipeline, ...]] = {
    "classify": (
        Pipeline(
            "text-classification",
            "/classify",
            {
                "top_k": Param("top_k"),
                "function_to_apply": Param("function_to_apply"),
                "truncate": Param("truncate"),
            },
            _with_inputs,
            _classes,
        ),
    ),
    "ner": (
        Pipeline(
            "token-classification",
            "/ner",
            {
                "aggregation_strategy": Param("aggregation"),
                "stride": Param("stride"),
                "ignore_labels": Param(shaping=True, note="entities of these labels are left out"),
                "truncate": Param("truncate"),
            },
            _with_inputs,
            _entities,
        ),
    ),
    "qa": (
        Pipeline(
            "question-answering",
            "/qa",
            {
                "top_k": Param("top_k"),
                "max_answer_len": Param("max_answer_len"),
                "doc_stride": Param("doc_stride"),
                "align_to_words": Param(note="accepted: answers are spans of whole tokens, offsets into the context"),
                "handle_impossible_answer": Param(
                    refuse=_only(None, False, why="an empty answer is never given: the best span is")
                ),
                "max_question_len": Param(
                    refuse=_never("the server's setting (--qa-max-question-length), not a request's")
                ),
                "max_seq_len": Param(refuse=_never("the server's setting (--qa-max-length), not a request's")),
                "truncate": Param("truncate"),
            },
            _qa_body,
            lambda answer, inputs, params: answer,
            claims=lambda body: _object_with("question", "context")(body.get("inputs")),
            takes="an object {question, context}",
            inputs_check=lambda inputs: (
                _object_with("question", "context")(inputs)
                and all(isinstance(inputs[k], str) for k in ("question", "context"))
            ),
        ),
    ),
    "embed": (
        Pipeline(
            "feature-extraction",
            "/embed",
            {
                "normalize": Param("normalize"),
                "truncate": Param("truncate"),
                "dimensions": Param("dimensions"),
                "encoding_format": Param(
                    refuse=_only(None, "float", why="only 'float' is answered here (base64: /v1/embeddings)")
                ),
                **_TEI_EMBED,
            },
            _with_inputs,
            lambda answer, inputs, params: answer,
            claims=lambda body: any(k in body for k in ("normalize", "dimensions", "prompt_name", "encoding_format")),
            top_level_parameters=True,
        ),
        Pipeline(
            "sentence-similarity",
            "/embed",
            {"truncate": Param("truncate"), **_TEI_EMBED},
            _similarity_body,
            _similarities,
            claims=lambda body: _has_similarity_inputs(body.get("inputs")),
            takes="an object {source_sentence, sentences}",
            inputs_check=_has_similarity_inputs,
        ),
    ),
    "fill_mask": (
        Pipeline(
            "fill-mask",
            "/fill-mask",
            {
                "top_k": Param("top_k"),
                "targets": Param(
                    refuse=_never("scoring chosen target words is not served; the likeliest tokens are (top_k)")
                ),
                "truncate": Param("truncate"),
            },
            _with_inputs,
            _masks,
        ),
    ),
    "zero_shot": (
        Pipeline(
            "zero-shot-classification",
            "/zero-shot",
            {
                "candidate_labels": Param("candidate_labels"),
                "multi_label": Param("multi_label"),
                "hypothesis_template": Param("hypothesis_template"),
                "truncate": Param("truncate"),
            },
            _zero_shot_body,
            _zero_shot,
            claims=lambda body: isinstance(body.get("parameters"), dict) and "candidate_labels" in body["parameters"],
        ),
    ),
}


# text-embeddings-inference's model_type (its /info) of the tasks that have one, in the order TEI decides it: a
# one-output classifier is its reranker.
TEI_MODEL_TYPES: dict[str, str] = {"rerank": "reranker", "classify": "classifier", "embed": "embedding"}


def tei_model_type(tasks) -> tuple[str, str] | None:
    """(task, TEI's model_type) of a server serving `tasks`: the first of TEI_MODEL_TYPES it serves."""
    return next(((task, kind) for task, kind in TEI_MODEL_TYPES.items() if task in tasks), None)


def pipelines(tasks) -> list[tuple[str, Pipeline]]:
    """(task, pipeline) for each pipeline of `tasks`: the tasks with a head of their own first (what the model was
    made for: a masked LM's fill-mask before the embeddings any encoder gives), each group in the given order."""
    ordered = sorted(tasks, key=lambda task: registry.TASKS[task].head is None if task in registry.TASKS else True)
    return [(task, p) for task in ordered for p in PIPELINES.get(task, ())]


def by_tag(tag: str, tasks) -> tuple[str, Pipeline] | None:
    return next(((task, p) for task, p in pipelines(tasks) if p.tag == tag), None)


def choose(body, tasks) -> tuple[str, Pipeline]:
    """The pipeline a body sent to a server's root route means: the one whose shape it can only be (QA's and
    sentence-similarity's inputs, zero-shot's candidate_labels, TEI's embed fields), else the first served task's
    first pipeline. ValueError when the server serves none of the Inference API's tasks."""
    served = pipelines(tasks)
    if not served:
        raise LookupError("this server serves none of the Hugging Face Inference API's tasks")
    if isinstance(body, dict):
        claimed = next(((t, p) for t, p in served if p.claims(body)), None)
        if claimed is not None:
            return claimed
    return served[0]


def translate(pipeline: Pipeline, body) -> tuple[Any, dict, dict]:
    """(our route's body, the parameters as sent, a map of our field -> the body's name for it) of an Inference API
    body; ValueError naming the first field that cannot be served."""
    if not isinstance(body, dict):
        raise ValueError("body: a JSON object {inputs, parameters, options} is required")
    extra_top = set(pipeline.parameters) if pipeline.top_level_parameters else set()
    unknown = [k for k in body if k not in TOP_LEVEL | extra_top]
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a field of the Hugging Face Inference API's {pipeline.tag} body (inputs, parameters, "
            "options)"
        )
    if "inputs" not in body:
        raise ValueError("inputs: Field required")
    inputs = body["inputs"]
    if not pipeline.inputs_check(inputs):
        raise ValueError(f"inputs: {pipeline.tag} takes {pipeline.takes}")
    params = body.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError("parameters: an object is required")
    options = body.get("options")
    if options is not None and (not isinstance(options, dict) or set(options) - OPTIONS):
        bad = next(iter(set(options) - OPTIONS)) if isinstance(options, dict) else None
        raise ValueError(
            f"options.{bad}: not an option of the Inference API ({', '.join(sorted(OPTIONS))})"
            if bad
            else "options: an object is required"
        )
    given = [(f"parameters.{k}", k, v) for k, v in params.items()]
    given += [(k, k, body[k]) for k in body if k in extra_top]
    fields, names = {}, {}
    for where, name, value in given:
        param = pipeline.parameters.get(name)
        if param is None:
            raise ValueError(
                f"{where}: not a parameter of {pipeline.tag}; its parameters are {', '.join(pipeline.parameters)}"
            )
        why = param.refuse(value) if param.refuse else None
        if why:
            raise ValueError(f"{where}: {why}")
        if param.field is not None and value is not None:
            fields[param.field], names[param.field] = value, where
    sent = {name: value for _, name, value in given}
    return pipeline.to_native(inputs, fields), sent, names


__all__ = [
    "OPTIONS",
    "PIPELINES",
    "TEI_MODEL_TYPES",
    "tei_model_type",
    "Param",
    "Pipeline",
    "by_tag",
    "choose",
    "pipelines",
    "translate",
]
