"""Request and response bodies. Field names follow Hugging Face pipelines.

Each task's routes (bert/tasks, `Route`) declare their request fields and their answer's type, and the models are
made of those declarations here: the request models of the fields (`request_model`: a route's `request` names its
model; a request class's `endpoint_doc` is its endpoint's description in the OpenAPI schema), the response models
of the dataclasses the task declares its answers with (`response_model`). Written out below: what is no task's
answer (/info, /health, errors) and the /embed and /v1/embeddings answers, which their route names.

Shapes (the client SDK relies on them):
- /classify: `inputs` a str -> a list of {label, score}; a list -> one such list per input.
- /ner: `inputs` a str -> a list of entities; a list -> one list of entities per input.
- /qa: one {question, context} object -> one answer object (a list of answers when top_k > 1);
  a list of objects -> one entry per object, each an answer (or a list of them when top_k > 1).
- /embed: `inputs` a str or a list -> always a list of vectors (text-embeddings-inference's shape).
- /zero-shot: `inputs` a str -> one {sequence, labels, scores}; a list -> one such object per input.
- /v1/embeddings: OpenAI's request and response.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Annotated, ClassVar, Optional, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from bert.tasks import base, common, registry

TextPair = Annotated[list[str], Field(min_length=2, max_length=2, description="[text, text_pair]")]


class _Body(BaseModel):
    # A misspelt option is an error, not silently ignored; and types are strict: "truncate": "yes",
    # "top_k": "2" or "doc_stride": false are mistakes to name, not values to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)
    endpoint_doc: ClassVar[str] = ""


def _within(kind, each):
    """kind with each(member) in place of every type inside its lists and unions (kind itself otherwise)."""
    args = get_args(kind)
    if get_origin(kind) in (Union, types.UnionType):
        return Union[tuple(each(a) for a in args)]
    if get_origin(kind) is list:
        return list[each(args[0])]
    return kind


def _pydantic(kind):
    """A declared field type as pydantic reads it: a task's TextPair is a list of exactly two texts."""
    if kind is base.TextPair:
        return TextPair
    return _within(kind, _pydantic)


def request_model(route: base.Route) -> type[BaseModel]:
    """The request body of a route that declares its fields (bert/tasks), named as the route says."""
    fields = {}
    for param in route.fields:
        bounds = {"ge": param.minimum, "le": param.maximum, "min_length": param.min_length}
        fields[param.name] = (
            _pydantic(param.kind),
            Field(
                param.default,
                description=param.help or None,
                examples=list(param.examples) or None,
                **{k: v for k, v in bounds.items() if v is not None},
            ),
        )
    model = create_model(route.request, __base__=_Body, __module__=__name__, **fields)
    model.endpoint_doc = route.doc
    return model


_REQUESTS: dict[str, type[BaseModel]] = {}


def __getattr__(name: str):
    """A task route's request model by the name its route gives it (made once, from its declared fields), as the
    routes look schemas up: a task registered after this module was imported is found too."""
    if name not in _REQUESTS:
        route = next(
            (r for t in registry.TASKS.values() for r in t.routes if r.fields and r.request == name),
            None,
        )
        if route is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        _REQUESTS[name] = request_model(route)
    return _REQUESTS[name]


_RESPONSES: dict[type, type[BaseModel]] = {}


def response_model(kind):
    """A route's answer type (bert/tasks: `Route.response`) as pydantic reads it: each dataclass a task declares
    becomes a model of its name, once (a dataclass two answers share is one schema), with its docstring and the
    descriptions its fields declare (`bert.tasks.base.described`)."""
    if dataclasses.is_dataclass(kind):
        if kind not in _RESPONSES:
            _RESPONSES[kind] = _model_of(kind)
        return _RESPONSES[kind]
    return _within(kind, response_model)


def _model_of(answer: type) -> type[BaseModel]:
    hints = get_type_hints(answer)
    fields = {}
    for field in dataclasses.fields(answer):
        if field.default_factory is not dataclasses.MISSING:
            default = {"default_factory": field.default_factory}
        else:
            default = {"default": ... if field.default is dataclasses.MISSING else field.default}
        fields[field.name] = (
            response_model(hints[field.name]),
            Field(**default, description=field.metadata.get("help")),
        )
    doc = answer.__doc__
    if doc is not None and doc.startswith(f"{answer.__name__}("):  # what dataclass writes for a class without one
        doc = None
    return create_model(answer.__name__, __doc__=doc, __module__=__name__, **fields)


OpenAIUsage = response_model(common.OpenAIUsage)  # the same schema as /v1/rerank's usage


class ErrorBody(BaseModel):
    error: str
    error_type: str


class OpenAIError(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class OpenAIErrorBody(BaseModel):
    """An error on OpenAI's paths (/v1/...): OpenAI's error object, so that its clients show the message."""

    error: OpenAIError
    error_type: str


class Status(BaseModel):
    status: str


class ServedModel(BaseModel):
    """One of a task's models in /info's `models`; a task with labels (classify, ner) lists them too, as `labels`."""

    model_config = ConfigDict(extra="allow")  # `labels`, where the task has them

    name: str = Field(..., description='what a request\'s "model" picks it by')
    path: str = Field(..., description="the model's directory")
    max_input_length: int = Field(
        ...,
        description="longest input in tokens this model takes (its max_position_embeddings, or less where "
        "--max-input-length or the model's own limit says); longer ones get 422 unless the request sends "
        '"truncate": true',
    )


class Info(BaseModel):
    model: str
    tasks: list[str]
    backend: str
    precision: str
    device: str
    max_batch_requests: int
    max_batch_tokens: int
    max_input_length: int = Field(
        ...,
        description="longest input in tokens that every served model takes: the smallest of `models`' "
        "max_input_length (a server of one model: that model's)",
    )
    max_client_batch_size: int
    max_concurrent_requests: int
    version: str
    labels: dict[str, list[str]] = Field(..., description="labels of each task that has them (classify, ner)")
    embedding: Optional[dict] = Field(
        None,
        description="the embed task's pooling, normalisation, dimensions, and what is known of the vectors' quality",
    )
    verify: dict[str, dict] = Field(
        default_factory=dict,
        description="per task, the exact model that answers its unsure items again, and the margin",
    )
    models: dict[str, list[ServedModel]] = Field(
        default_factory=dict,
        description="per task, its models in order, the first the default: {name, path, max_input_length, labels?} "
        "(max_input_length: that model's own limit); a request's \"model\" picks one by name",
    )


# ---- limits that depend on the server's settings, declared in the OpenAPI schema -----------------------
def declare_limits(schema: dict, *, max_inputs: int, max_doc_stride: int | None) -> dict:
    """Write the limits the server enforces into its OpenAPI schema, so clients can know them: at most
    `max_inputs` items per request and at least one, in each task route's batch field (`Route.batch_field`:
    the body itself for a route that takes a list of objects), and the largest `doc_stride`."""
    components = schema.get("components", {}).get("schemas", {})
    for task in registry.TASKS.values():
        for route in task.routes:
            if route.many:
                operation = schema.get("paths", {}).get(route.path, {}).get("post", {})
                node = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            else:
                name = route.request if isinstance(route.request, str) else route.request.__name__
                node = components.get(name, {}).get("properties", {}).get(route.batch_field)
            for branch in _array_branches(node or {}):
                branch.update(minItems=1, maxItems=max_inputs)
    for component in components.values():
        stride = component.get("properties", {}).get("doc_stride", {})
        for branch in stride.get("anyOf", [stride]):
            if branch.get("type") == "integer" and max_doc_stride is not None:
                branch["maximum"] = max_doc_stride
    return schema


def _array_branches(node: dict):
    for branch in node.get("anyOf", [node]):
        if branch.get("type") == "array":
            yield branch
