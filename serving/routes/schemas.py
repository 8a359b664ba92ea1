"""Request and response bodies. Field names follow Hugging Face pipelines.

Each task's routes (bert/tasks, `Route`) name their request and response schemas here; a request class's
`endpoint_doc` is its endpoint's description in the OpenAPI schema.

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

from typing import Annotated, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from bert.tasks import registry

TextPair = Annotated[list[str], Field(min_length=2, max_length=2, description="[text, text_pair]")]
MODEL_FIELD_HELP = (
    "which of the task's models answers (a name /info lists under models; default: the first); an unknown name "
    "is a 404 listing them"
)


class _Body(BaseModel):
    # A misspelt option is an error, not silently ignored; and types are strict: "truncate": "yes",
    # "top_k": "2" or "doc_stride": false are mistakes to name, not values to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Optional[str] = Field(None, description=MODEL_FIELD_HELP)


class ClassifyRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "`inputs` a string: a list of {label, score}, best first. A list: one such list per input."
    )
    inputs: Union[str, list[Union[str, TextPair]]] = Field(
        ...,
        description="a text, a list of texts, or a list of [text, text_pair]",
        examples=["I loved this film.", ["great plot", ["A man is eating.", "Someone eats."]]],
    )
    top_k: Optional[int] = Field(1, ge=1, description="labels per input, best first; null for all labels")
    function_to_apply: Optional[Literal["softmax", "sigmoid", "none"]] = Field(
        None, description="score function (default: the model's, as in transformers' pipeline)"
    )
    truncate: bool = Field(False, description="cut inputs longer than the model's limit instead of refusing them")


class NerRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "`inputs` a string: a list of entities {entity_group, score, word, start, end} (character offsets; `word` as "
        'written). A list: one list of entities per input. With aggregation "none": per token '
        "{entity, score, index, word, start, end}."
    )
    inputs: Union[str, list[str]] = Field(
        ..., description="a text or a list of texts", examples=["My name is Wolfgang and I live in Berlin."]
    )
    aggregation: Literal["first", "simple", "average", "max", "none"] = Field(
        "first",
        description="how word pieces are merged into entities (transformers' aggregation_strategy); the "
        "default, first, labels whole words by their first piece, so an entity is never a "
        "fragment of a word",
    )
    stride: Optional[int] = Field(
        None,
        ge=0,
        description="a text longer than the model's window is cut into windows that share this many tokens "
        "(transformers' token-classification pipeline's `stride`) and their entities are merged, each once, with "
        "offsets into the text; default 128, or less where windows are narrower; at most half a window",
    )
    truncate: bool = Field(
        False, description="cut inputs longer than the model's limit to their start instead of windowing them"
    )


class QARequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "One {question, context}: an answer {answer, score, start, end} (a list of answers when top_k > 1). A list "
        "of them: one entry per item, each as above. Long contexts are windowed (doc_stride), never cut."
    )
    question: str = Field(..., min_length=1, examples=["Where do I live?"])
    context: str = Field(..., min_length=1, examples=["My name is Wolfgang and I live in Berlin."])
    top_k: int = Field(1, ge=1, le=100, description="answers to return; more than 1 gives a list")
    max_answer_len: int = Field(30, ge=1, le=512, description="longest answer in tokens")
    doc_stride: Optional[int] = Field(
        None,
        ge=0,
        description="context tokens shared by neighbouring windows of a long context (default 128, or "
        "less where windows are narrower); at most half a window",
    )
    truncate: bool = Field(
        False,
        description="cut a question longer than a window keeps for it instead of "
        "refusing it; contexts are never cut, they are windowed",
    )


class EmbedRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "One vector per input, always a list of vectors (as text-embeddings-inference answers), pooled as the model's "
        "sentence-transformers configuration says and scaled to unit length unless `normalize` is false."
    )
    inputs: Union[str, list[str]] = Field(
        ..., description="a text or a list of texts", examples=["What is the capital of France?"]
    )
    normalize: bool = Field(True, description="scale each vector to unit length (cosine similarity = dot product)")
    truncate: bool = Field(False, description="cut inputs longer than the model's limit instead of refusing them")
    chunking: Optional[Literal["mean"]] = Field(
        None,
        description='"mean": a text longer than the model\'s window is cut into whole-word windows and embedded as '
        "the mean of their vectors weighted by their tokens (each a unit vector first when `normalize`), "
        "renormalised; default: such a text is refused (422) unless `truncate`",
    )
    dimensions: Optional[int] = Field(
        None,
        ge=1,
        description="keep the first N components of each vector (Matryoshka truncation), renormalised when "
        "`normalize`; at most the model's width (422 beyond)",
    )


class OpenAIEmbeddingRequest(BaseModel):
    # OpenAI's request body, every field it defines (the official client sends them as they are); others are
    # refused as everywhere else.
    model_config = ConfigDict(extra="forbid", strict=True)
    endpoint_doc: ClassVar[str] = (
        "OpenAI's embeddings API: `input` a text or a list of texts; vectors scaled to unit length, as floats or as "
        "base64 little-endian float32 (`encoding_format`); `usage` counts the model's input tokens."
    )
    input: Union[str, list[str]] = Field(
        ...,
        description="a text or a list of texts (token arrays are not taken)",
        examples=["What is the capital of France?"],
    )
    model: Optional[str] = Field(None, description=MODEL_FIELD_HELP)
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: little-endian float32 bytes, base64-encoded"
    )
    dimensions: Optional[int] = Field(
        None, ge=1, description="the first N components of each vector, renormalised; at most the model's width"
    )
    chunking: Optional[Literal["mean"]] = Field(
        None, description="not OpenAI's: \"mean\" embeds a text longer than the model's window as /embed does"
    )
    truncate: bool = Field(
        False, description="not OpenAI's: cut inputs longer than the model's limit instead of refusing them"
    )
    user: Optional[str] = Field(None, description="accepted and ignored")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class Label(BaseModel):
    label: str
    score: float


class Entity(BaseModel):
    entity_group: Optional[str] = Field(None, description="the entity type (aggregation other than none)")
    entity: Optional[str] = Field(None, description="the token's label (aggregation none)")
    index: Optional[int] = Field(None, description="token position (aggregation none)")
    score: float
    word: str
    start: int = Field(..., description="character offset of the first character")
    end: int = Field(..., description="character offset one past the last character")


class Answer(BaseModel):
    answer: str
    score: float
    start: int = Field(..., description="character offset into the context")
    end: int


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


ClassifyResponse = Union[list[Label], list[list[Label]]]
EmbedResponse = list[list[float]]
NerResponse = Union[list[Entity], list[list[Entity]]]
# a list request may mix items with top_k 1 (an answer) and top_k > 1 (a list of answers)
QAResponse = Union[Answer, list[Union[Answer, list[Answer]]]]


# ---- rerank: text-embeddings-inference's /rerank, and the /v1/rerank of infinity, Cohere and Jina ----------
class RerankRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "Each (query, text) pair is scored by the cross-encoder (one model input each, batched with all other "
        "requests); the texts come back best first as {index, score, text?}. Scores are the logit's sigmoid, or "
        "the logit itself with `raw_scores`."
    )
    query: str = Field(..., description="what the texts are ranked for", examples=["What is the capital of France?"])
    texts: list[str] = Field(
        ...,
        description="the texts to rank; each (query, text) pair is one model input",
        examples=[["Paris is the capital of France.", "Berlin is in Germany."]],
    )
    raw_scores: bool = Field(False, description="the model's logit instead of its sigmoid")
    return_text: bool = Field(False, description="echo each text beside its score")
    truncate: bool = Field(
        False,
        description="cut pairs longer than the model's limit instead of scoring a long text by its best window (MaxP)",
    )


class Ranked(BaseModel):
    index: int = Field(..., description="the text's position in the request")
    score: float
    text: Optional[str] = None


RerankResponse = list[Ranked]


class V1RerankRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "The rerank API of infinity, Cohere and Jina: the documents by relevance to the query, best first, the "
        "best `top_n` of them; `relevance_score` is the cross-encoder's sigmoid; `usage` counts the input tokens."
    )
    query: str = Field(..., examples=["What is the capital of France?"])
    documents: list[str] = Field(..., examples=[["Paris is the capital of France.", "Berlin is in Germany."]])
    model: Optional[str] = Field(None, description=MODEL_FIELD_HELP)
    top_n: Optional[int] = Field(None, ge=1, description="return only the best N (default: all)")
    return_documents: bool = Field(False, description="echo each document beside its score")
    truncate: bool = Field(
        False,
        description="cut pairs longer than the model's limit instead of scoring a long document by its best "
        "window (MaxP)",
    )


class V1Ranked(BaseModel):
    index: int
    relevance_score: float
    document: Optional[str] = None


class V1RerankResponse(BaseModel):
    object: Literal["rerank"] = "rerank"
    model: str
    results: list[V1Ranked]
    usage: OpenAIUsage


# ---- fill-mask: transformers' fill-mask pipeline ---------------------------------------------------------
class FillMaskRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "The masked-LM head's proposals for each [MASK] token, best first, with transformers' fill-mask fields "
        "{score, token, token_str, sequence}: for a text, one list per [MASK]; for a list of texts, that per text. "
        "A text without a [MASK] is a 422."
    )
    inputs: Union[str, list[str]] = Field(
        ...,
        description="a text or a list of texts, each with [MASK] tokens",
        examples=["Paris is the [MASK] of France."],
    )
    top_k: int = Field(5, ge=1, le=50, description="candidates per [MASK], best first")
    truncate: bool = Field(False, description="cut inputs longer than the model's limit instead of refusing them")


class MaskCandidate(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str = Field(..., description="the text with this [MASK] filled")


# a text: one list of candidates per [MASK]; a list of texts: that, per text
FillMaskResponse = Union[list[list[MaskCandidate]], list[list[list[MaskCandidate]]]]


# ---- zero-shot: transformers' zero-shot-classification pipeline ------------------------------------------
class ZeroShotRequest(_Body):
    endpoint_doc: ClassVar[str] = (
        "Each candidate label becomes a hypothesis (`hypothesis_template` with the label in its {}) that the NLI "
        "model weighs against the text, one model input per (text, label): {sequence, labels, scores} with the "
        "labels best first, as transformers' zero-shot-classification pipeline answers; a list of them for a list "
        "of texts. Scores sum to 1 over the labels, or with `multi_label` each is entailment against contradiction."
    )
    inputs: Union[str, list[str]] = Field(
        ..., description="a text or a list of texts", examples=["One day I will see the world."]
    )
    candidate_labels: Union[str, list[str]] = Field(
        ...,
        description="the labels to choose from: a list, or one string of comma-separated labels; inputs x labels "
        "is at most max_request_sequences (413 beyond)",
        examples=[["travel", "cooking", "dancing"]],
    )
    hypothesis_template: str = Field(
        "This example is {}.", description='the hypothesis each label is put into, at its "{}"'
    )
    multi_label: bool = Field(
        False, description="score each label on its own (entailment vs contradiction) instead of across the labels"
    )
    truncate: bool = Field(
        False,
        description="cut texts too long for the model beside a hypothesis instead of refusing them (never "
        "the hypothesis)",
    )


class ZeroShotResult(BaseModel):
    sequence: str = Field(..., description="the text as sent")
    labels: list[str] = Field(..., description="the candidate labels, best first")
    scores: list[float] = Field(..., description="each label's score, in the order of `labels`")


# a text: one result; a list of texts: one per text
ZeroShotResponse = Union[ZeroShotResult, list[ZeroShotResult]]


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
