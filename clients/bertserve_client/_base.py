"""What the sync and async clients share: configuration, the endpoint methods and their request plans,
response parsing, error mapping and the retry schedule. Only sending and sleeping differ between
`Client` and `AsyncClient`, so everything here is free of I/O.

A *plan* is an SDK call written as the HTTP requests it needs plus a function that turns their
JSON answers back into one typed result. A list longer than the server's per-request limit becomes
several requests, answered in order and concatenated.

Each endpoint method is declared once, in `Endpoints`: it says how to plan the call and hands that to
`self._run`, which `Client` runs to its result and `AsyncClient` as a coroutine to await. A new endpoint
is a plan function and a method here, and its result types in types.py.
"""

from __future__ import annotations

import email.utils
import math
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import httpx
import pydantic

from ._exceptions import (
    APIConnectionError,
    APITimeoutError,
    BertserveError,
    OverloadedError,
    ServerError,
    error_class_for,
)
from ._version import __version__
from .types import Answer, Entity, Info, Label, MaskCandidate, QAInput, Ranked, SparseValue, ZeroShotResult

DEFAULT_BASE_URL = "http://localhost:8000"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2
INITIAL_RETRY_DELAY = 0.5  # seconds before the first retry when the server gives no Retry-After
MAX_RETRY_DELAY = 8.0  # cap of the exponential schedule
MAX_RETRY_AFTER = 60.0  # a server asking for a longer wait than this is not retried: we raise

ClassifyInput = Union[str, Sequence[Union[str, Sequence[str]]]]
NerInput = Union[str, Sequence[str]]
QAItem = Union[QAInput, Mapping[str, str], Sequence[str]]
NER_AGGREGATIONS = ("first", "simple", "average", "max", "none")
CLASSIFY_FUNCTIONS = ("softmax", "sigmoid", "none")
EmbedInput = Union[str, Sequence[str]]
FillMaskInput = Union[str, Sequence[str]]
EmbedSparseInput = Union[str, Sequence[str]]
EmbedAllInput = Union[str, Sequence[str]]
ZeroShotInput = Union[str, Sequence[str]]


@dataclass(frozen=True)
class Call:
    """One HTTP request of a plan. `items`, for one request of a list split into several: (first, end, total),
    the caller's list items [first:end] of `total` that it carries (in the body's `split` list, or the body itself
    when that is a list), named in its errors (the server's indices count from the request's first item).

    `json` is made plain when the Call is made, so while the call is planned, before any request is sent: numpy
    scalars become Python numbers, and a text JSON cannot carry raises ValueError naming it (see `_plain`)."""

    method: str
    path: str
    json: Any = None
    items: tuple[int, int, int] | None = None
    split: str = "inputs"

    def __post_init__(self) -> None:
        if self.json is not None:
            object.__setattr__(self, "json", _plain_body(self.json, self.items[0] if self.items else 0, self.split))


@dataclass(frozen=True)
class Plan:
    calls: list[Call]
    assemble: Callable[[list[Any]], Any]


@dataclass(frozen=True)
class Planned:
    """An SDK call before its requests are known: `build(batch_limit)` gives its Plan, once the client knows
    how many inputs one request may carry; it asks the server (/info) only when `inputs` is a list of
    more than one."""

    inputs: Any
    build: Callable[[int | None], Plan]


# ---------------------------------------------------------------------------------------------
# Plans: request bodies and result parsing per endpoint


def _chunks(items: list, size: int | None) -> list[list]:
    # An empty list still makes one request, so the server answers it (400) as it would directly.
    if not size or size <= 0 or len(items) <= size:
        return [items]
    return [items[i : i + size] for i in range(0, len(items), size)]


def _split_calls(path: str, bodies: list[Any], sizes: list[int], split: str = "inputs") -> list[Call]:
    """One POST per body; when there are several, each knows which of the caller's items it carries (in the
    body's `split` list)."""
    if len(bodies) == 1:
        return [Call("POST", path, bodies[0], split=split)]
    total, first, calls = sum(sizes), 0, []
    for body, size in zip(bodies, sizes):
        calls.append(Call("POST", path, body, items=(first, first + size, total), split=split))
        first += size
    return calls


def _is_numpy_scalar(value: Any) -> bool:
    """np.int64(2), np.float32(0.5), np.bool_(True)...: an instance of numpy.generic, told without importing numpy.
    A numpy array is not one (as `inputs` it is refused; as an option JSON refuses it)."""
    return any(cls.__name__ == "generic" and cls.__module__ == "numpy" for cls in type(value).__mro__)


def _check_text(text: str, name: str) -> None:
    """A str that UTF-8 cannot encode holds a surrogate code point (U+D800-U+DFFF: bytes decoded with
    errors="surrogateescape", half of a cut UTF-16 pair), on which sending would fail with a UnicodeEncodeError
    whose position is in the JSON body. Said here naming the text instead. Called for non-ASCII texts only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        at, code = e.start, ord(text[e.start])
        after = ord(text[at + 1]) if at + 1 < len(text) else 0
        if 0xD800 <= code <= 0xDBFF and 0xDC00 <= after <= 0xDFFF:
            raise ValueError(
                f"{name} holds a UTF-16 surrogate pair (U+{code:04X} U+{after:04X} at character {at}) in place of"
                " the character it encodes, which is not valid text"
            ) from None
        raise ValueError(
            f"{name} holds a lone surrogate (U+{code:04X} at character {at}), which is not valid text"
        ) from None


def _plain(value: Any, name: str) -> Any:
    """`value` as JSON carries it: numpy scalars as the Python values they hold, texts checked (`_check_text`)
    under `name` (`inputs[3]`, `inputs[3][1]`, `items[2].context`), lists and dicts walked."""
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, str):  # np.str_ included
        if not value.isascii():
            _check_text(value, name)
        return value
    if isinstance(value, Mapping):
        return {key: _plain(item, f"{name}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return _plain_items(value, name)
    if _is_numpy_scalar(value):
        return _plain(value.item(), name)
    return value  # anything else as it is: httpx's JSON encoder says what it cannot carry


def _plain_items(values: Sequence[Any], name: str, first: int = 0) -> list:
    """A list made plain, its items named `name[first + i]` (an ASCII str, the usual item, passes at once)."""
    return [
        item if type(item) is str and item.isascii() else _plain(item, f"{name}[{first + i}]")
        for i, item in enumerate(values)
    ]


def _plain_body(body: Any, first: int, split: str) -> Any:
    """A request body made plain (`_plain`), its texts named as the caller knows them: a list's items counted from
    `first`, the index of the request's first item in the caller's list (`split` in the body, or the body itself:
    /qa's list of items)."""
    if isinstance(body, list):
        return _plain_items(body, "items", first)
    if not isinstance(body, Mapping):
        return _plain(body, "body")
    plain = {}
    for key, value in body.items():
        if key == split and isinstance(value, (list, tuple)):
            plain[key] = _plain_items(value, key, first)
        else:
            plain[key] = _plain(value, key)
    return plain


def note_request(error: BertserveError, plan: Plan, answers: list[Any], call: Call, index: int) -> None:
    """Say which request of a split list failed (the server numbers the items of that request only), and keep what
    the requests before it answered in `error.partial`: the call's answer for the items before the failed
    request's first, so that a caller resumes from there rather than sending the whole list again."""
    if call.items is None:
        return
    first, end, total = call.items
    error._add_note(
        f"request {index + 1} of {len(plan.calls)}, carrying items [{first}:{end}] of the {total} given: "
        f"the server's index i is item {first}+i"
    )
    if answers:
        try:
            error.partial = plan.assemble(answers)
        except BertserveError:  # an earlier answer the SDK cannot read: nothing to keep
            return
        error._add_note(f"the answers of items [0:{first}] are in .partial")


def _kind(value: Any) -> str:
    return type(value).__name__


def _texts(inputs: Sequence[Any], what: str = "inputs") -> list[str]:
    """A list of texts, each checked to be a str before anything is sent."""
    items = list(inputs)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"{what}[{i}] must be a str, not {_kind(item)}")
    return items


def _classify_item(i: int, item: Any) -> str | list[str]:
    """A text, or a [text, text_pair] pair (sent as a two-item list whatever sequence the caller used)."""
    if isinstance(item, str):
        return item
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item):
        return list(item)
    shape = f"a {_kind(item)} of {len(item)} items" if isinstance(item, (list, tuple)) else _kind(item)
    raise TypeError(f"inputs[{i}] must be a str or a (text, text_pair) pair of two str, not {shape}")


def _parse(model: type[pydantic.BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        raise BertserveError(f"unexpected {model.__name__} in server response: {e}") from e


def _parse_list(model: type[pydantic.BaseModel], data: Any) -> list:
    if not isinstance(data, list):
        raise BertserveError(f"expected a list of {model.__name__} from the server, got {type(data).__name__}")
    return [_parse(model, item) for item in data]


def _batched(path: str, bodies: list[dict], parse_one: Callable[[Any], Any]) -> Plan:
    """Several requests whose answers are each a list with one entry per input, concatenated."""
    sizes = [len(body["inputs"] if isinstance(body, dict) else body) for body in bodies]

    def assemble(answers: list[Any]) -> list:
        results = []
        for body, answer in zip(bodies, answers):
            sent = body["inputs"] if isinstance(body, dict) else body
            if not isinstance(answer, list) or len(answer) != len(sent):
                got = len(answer) if isinstance(answer, list) else type(answer).__name__
                raise BertserveError(f"{path}: server answered {got} results for {len(sent)} inputs")
            results.extend(parse_one(item) for item in answer)
        return results

    return Plan(_split_calls(path, bodies, sizes), assemble)


def _model(model: str | None) -> dict:
    """The body's "model" (which of the task's models answers; /info lists them), sent only when chosen."""
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a str, not {type(model).__name__}")
    return {} if model is None else {"model": model}


def is_many(inputs: Any) -> bool:
    if isinstance(inputs, str):
        return False
    if isinstance(inputs, (list, tuple)):
        return True
    raise TypeError(f"inputs must be a str or a list, not {type(inputs).__name__}")


def plan_classify(
    inputs: ClassifyInput,
    *,
    top_k: int | None,
    truncate: bool,
    batch_limit: int | None,
    model: str | None = None,
    function_to_apply: str | None = None,
) -> Plan:
    if function_to_apply is not None and function_to_apply not in CLASSIFY_FUNCTIONS:
        raise ValueError(f"function_to_apply must be one of {CLASSIFY_FUNCTIONS}, not {function_to_apply!r}")
    options = {"top_k": top_k, "truncate": truncate, **_set(function_to_apply=function_to_apply), **_model(model)}
    if not is_many(inputs):
        return Plan([Call("POST", "/classify", {"inputs": inputs, **options})], lambda a: _parse_list(Label, a[0]))
    items = [_classify_item(i, item) for i, item in enumerate(inputs)]
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(items, batch_limit)]
    return _batched("/classify", bodies, lambda labels: _parse_list(Label, labels))


def _set(**options: Any) -> dict:
    """The options a caller set: one left at None is not sent (the server's default applies)."""
    return {name: value for name, value in options.items() if value is not None}


def plan_ner(
    inputs: NerInput,
    *,
    aggregation: str,
    truncate: bool,
    batch_limit: int | None,
    stride: int | None = None,
    model: str | None = None,
) -> Plan:
    if aggregation not in NER_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {NER_AGGREGATIONS}, not {aggregation!r}")
    options = {"aggregation": aggregation, "truncate": truncate, **_set(stride=stride), **_model(model)}
    if not is_many(inputs):
        return Plan([Call("POST", "/ner", {"inputs": inputs, **options})], lambda a: _parse_list(Entity, a[0]))
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(_texts(inputs), batch_limit)]
    return _batched("/ner", bodies, lambda entities: _parse_list(Entity, entities))


def _vector(data: Any) -> list[float]:
    if not isinstance(data, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data):
        raise BertserveError("/embed: expected a vector (a list of numbers) from the server")
    return [float(x) for x in data]


def plan_embed(
    inputs: EmbedInput,
    *,
    normalize: bool,
    truncate: bool,
    batch_limit: int | None,
    chunking: str | None = None,
    dimensions: int | None = None,
    truncation_direction: str = "right",
    prompt_name: str | None = None,
    model: str | None = None,
) -> Plan:
    """/embed answers a list of vectors even for one text; the SDK gives one vector for one text."""
    options = {
        "normalize": normalize,
        "truncate": truncate,
        # the default is not sent, so that a server from before the field answers as it did
        **_set(chunking=chunking, dimensions=dimensions, prompt_name=prompt_name),
        **({"truncation_direction": truncation_direction} if truncation_direction != "right" else {}),
        **_model(model),
    }
    if not is_many(inputs):

        def one(answers: list[Any]) -> list[float]:
            if not isinstance(answers[0], list) or len(answers[0]) != 1:
                raise BertserveError("/embed: expected one vector for one input")
            return _vector(answers[0][0])

        return Plan([Call("POST", "/embed", {"inputs": inputs, **options})], one)
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(_texts(inputs), batch_limit)]
    return _batched("/embed", bodies, _vector)


def _qa_item(i: int, item: QAItem) -> dict:
    if isinstance(item, QAInput):
        return item.model_dump()
    if isinstance(item, Mapping) and "question" in item and "context" in item:
        pair = (item["question"], item["context"])
    elif isinstance(item, (list, tuple)) and len(item) == 2:
        pair = (item[0], item[1])
    else:
        raise TypeError(
            f"items[{i}] must be a QAInput, a {{'question', 'context'}} dict or a (question, context) pair, "
            f"not {'a dict with keys ' + str(sorted(map(str, item))) if isinstance(item, Mapping) else _kind(item)}"
        )
    if not all(isinstance(x, str) for x in pair):
        raise TypeError(f"items[{i}]: question and context must be str, not {_kind(pair[0])} and {_kind(pair[1])}")
    return {"question": pair[0], "context": pair[1]}


def _answers(data: Any, top_k: int) -> Answer | list[Answer]:
    """top_k == 1 gives one Answer, top_k > 1 a list, whichever of the two the server sent."""
    if isinstance(data, dict):
        answer = _parse(Answer, data)
        return answer if top_k == 1 else [answer]
    answers = _parse_list(Answer, data)
    if top_k > 1:
        return answers
    if len(answers) != 1:
        raise BertserveError(f"/qa: expected one answer for top_k=1, got {len(answers)}")
    return answers[0]


def plan_qa(
    question: str | Sequence[QAItem],
    context: str | None,
    *,
    top_k: int,
    max_answer_len: int,
    doc_stride: int | None,
    batch_limit: int | None,
    model: str | None = None,
    truncate: bool = False,
) -> Plan:
    options = {"top_k": top_k, "max_answer_len": max_answer_len, "truncate": truncate, **_model(model)}
    if doc_stride is not None:  # else the server's default (128, or less for narrow windows)
        options["doc_stride"] = doc_stride
    if isinstance(question, str):
        if not isinstance(context, str):
            raise TypeError("qa(question, context): context must be a str")
        body = {"question": question, "context": context, **options}
        return Plan([Call("POST", "/qa", body)], lambda a: _answers(a[0], top_k))
    if context is not None:
        raise TypeError("qa(items): pass the contexts inside the items, not as `context`")
    if not isinstance(question, (list, tuple)):
        raise TypeError(f"qa() takes a question str or a list of items, not {type(question).__name__}")
    items = [{**_qa_item(i, item), **options} for i, item in enumerate(question)]
    return _batched("/qa", _chunks(items, batch_limit), lambda data: _answers(data, top_k))


def plan_rerank(
    query: str,
    texts: Sequence[str],
    *,
    raw_scores: bool,
    truncate: bool,
    return_text: bool,
    batch_limit: int | None,
    model: str | None = None,
) -> Plan:
    """/rerank, in as many requests as the server's per-request limit needs; a pair's score does not depend on
    the other texts, so the chunks' rankings merge into the one ranking a single request would give."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, not {type(query).__name__}")
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TypeError("texts must be a list of str")
    texts = _texts(texts, "texts")
    chunks = _chunks(texts, batch_limit)
    bodies = [
        {
            "query": query,
            "texts": chunk,
            "raw_scores": raw_scores,
            "truncate": truncate,
            "return_text": return_text,
            **_model(model),
        }
        for chunk in chunks
    ]

    def assemble(answers: list[Any]) -> list[Ranked]:
        ranked, offset = [], 0
        for body, answer in zip(bodies, answers):
            parsed = _parse_list(Ranked, answer)
            if sorted(r.index for r in parsed) != list(range(len(body["texts"]))):
                raise BertserveError(f"/rerank: server ranked {len(parsed)} texts for {len(body['texts'])} sent")
            ranked += [r.model_copy(update={"index": r.index + offset}) for r in parsed]
            offset += len(body["texts"])
        return sorted(ranked, key=lambda r: (-r.score, r.index))

    return Plan(_split_calls("/rerank", bodies, [len(chunk) for chunk in chunks], split="texts"), assemble)


def _candidates(data: Any) -> list[list[MaskCandidate]]:
    if not isinstance(data, list):
        raise BertserveError("/fill-mask: expected one list of candidates per [MASK]")
    return [_parse_list(MaskCandidate, mask) for mask in data]


def plan_fill_mask(
    inputs: FillMaskInput, *, top_k: int, truncate: bool, batch_limit: int | None, model: str | None = None
) -> Plan:
    options = {"top_k": top_k, "truncate": truncate, **_model(model)}
    if not is_many(inputs):
        return Plan([Call("POST", "/fill-mask", {"inputs": inputs, **options})], lambda a: _candidates(a[0]))
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(_texts(inputs), batch_limit)]
    return _batched("/fill-mask", bodies, _candidates)


def _sparse_vectors(data: Any) -> list[list[SparseValue]]:
    if not isinstance(data, list):
        raise BertserveError("/embed_sparse: expected one list of entries per input")
    return [_parse_list(SparseValue, entries) for entries in data]


def _token_vectors(data: Any) -> list[list[list[float]]]:
    if not isinstance(data, list) or not all(isinstance(text, list) for text in data):
        raise BertserveError("/embed_all: expected one list of token vectors per input")
    return data


def plan_embed_all(inputs: EmbedAllInput, *, batch_limit: int | None, **options: Any) -> Plan:
    """/embed_all: always one list of token vectors per input (a text alone is a list of one), in as many requests
    as the server's per-request limit needs."""
    options = _set(**options)  # prompt_name left at None: not sent
    if not is_many(inputs):
        return Plan([Call("POST", "/embed_all", {"inputs": inputs, **options})], lambda a: _token_vectors(a[0]))
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(_texts(inputs), batch_limit)]
    return _batched("/embed_all", bodies, lambda vectors: vectors)


def plan_embed_sparse(inputs: EmbedSparseInput, *, batch_limit: int | None, **options: Any) -> Plan:
    """/embed_sparse: always one list of entries per input (a text alone is a list of one), in as many requests as
    the server's per-request limit needs."""
    options = _set(**options)  # top_k, prompt_name left at None: not sent
    if not is_many(inputs):
        return Plan([Call("POST", "/embed_sparse", {"inputs": inputs, **options})], lambda a: _sparse_vectors(a[0]))
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(_texts(inputs), batch_limit)]
    return _batched("/embed_sparse", bodies, lambda entries: _parse_list(SparseValue, entries))


def plan_zero_shot(
    inputs: ZeroShotInput,
    candidate_labels: str | Sequence[str],
    *,
    hypothesis_template: str,
    multi_label: bool,
    truncate: bool,
    batch_limit: int | None,
    model: str | None = None,
) -> Plan:
    labels = candidate_labels if isinstance(candidate_labels, str) else list(candidate_labels)
    options = {
        "candidate_labels": labels,
        "hypothesis_template": hypothesis_template,
        "multi_label": multi_label,
        "truncate": truncate,
        **_model(model),
    }
    parse = lambda data: _parse(ZeroShotResult, data)  # noqa: E731
    if not is_many(inputs):
        return Plan([Call("POST", "/zero-shot", {"inputs": inputs, **options})], lambda a: parse(a[0]))
    bodies = [{"inputs": chunk, **options} for chunk in _chunks(_texts(inputs), batch_limit)]
    return _batched("/zero-shot", bodies, parse)


# ---------------------------------------------------------------------------------------------
# The endpoint methods, declared once for both clients


class Endpoints:
    """The inference calls. Each plans its requests and returns `self._run(planned)`: the result for
    `Client`, a coroutine for `AsyncClient` (whose methods are these, awaited). `model=NAME` picks which of the
    task's models answers (`info().models` lists them; default: the server's first)."""

    def _run(self, planned: Planned) -> Any:
        raise NotImplementedError

    def classify(
        self,
        inputs: ClassifyInput,
        *,
        top_k: int | None = 1,
        function_to_apply: str | None = None,
        truncate: bool = False,
        model: str | None = None,
    ) -> list[Label] | list[list[Label]]:
        """Labels for one text (a list of Label) or for many texts or [text, text_pair] pairs (a list per input):
        the best `top_k` (None: all), scored by `function_to_apply` ("softmax", "sigmoid", "none"; None: the
        model's own)."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_classify(
                    inputs,
                    top_k=top_k,
                    truncate=truncate,
                    batch_limit=limit,
                    model=model,
                    function_to_apply=function_to_apply,
                ),
            )
        )

    def ner(
        self,
        inputs: NerInput,
        *,
        aggregation: str = "first",
        truncate: bool = False,
        stride: int | None = None,
        model: str | None = None,
    ) -> list[Entity] | list[list[Entity]]:
        """Entities of one text (a list of Entity) or of many texts (a list per input). A text longer than the
        model's window is read in windows sharing `stride` tokens (the server's default when None), its entities
        merged, unless `truncate` cuts it to its start."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_ner(
                    inputs, aggregation=aggregation, truncate=truncate, batch_limit=limit, stride=stride, model=model
                ),
            )
        )

    def embed(
        self,
        inputs: EmbedInput,
        *,
        normalize: bool = True,
        truncate: bool = False,
        chunking: str | None = None,
        dimensions: int | None = None,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        model: str | None = None,
    ) -> list[float] | list[list[float]]:
        """The vector of one text (a list of floats), or of many texts (one vector per input), unit length
        unless `normalize=False`. `chunking="mean"`: a text longer than the model's window is the token-weighted
        mean of its windows' vectors; `dimensions`: the first N components only (renormalised). With `truncate`,
        `truncation_direction` "left" cuts a long text's start instead of its end; `prompt_name`: the model's
        prompt of that name (its sentence-transformers configuration's) before each text."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_embed(
                    inputs,
                    normalize=normalize,
                    truncate=truncate,
                    batch_limit=limit,
                    chunking=chunking,
                    dimensions=dimensions,
                    truncation_direction=truncation_direction,
                    prompt_name=prompt_name,
                    model=model,
                ),
            )
        )

    def qa(
        self,
        question: str | Sequence[QAItem],
        context: str | None = None,
        *,
        top_k: int = 1,
        max_answer_len: int = 30,
        doc_stride: int | None = None,
        truncate: bool = False,
        model: str | None = None,
    ) -> Answer | list[Answer] | list[Answer | list[Answer]]:
        """`qa(question, context)` gives an Answer (a list of top_k Answers when top_k > 1);
        `qa([(question, context), ...])` gives one of those per item. `truncate` cuts a question too long for a
        window (contexts are never cut: they are windowed, sharing `doc_stride` tokens)."""
        return self._run(
            Planned(
                None if isinstance(question, str) else question,
                lambda limit: plan_qa(
                    question,
                    context,
                    top_k=top_k,
                    max_answer_len=max_answer_len,
                    doc_stride=doc_stride,
                    batch_limit=limit,
                    model=model,
                    truncate=truncate,
                ),
            )
        )

    def rerank(
        self,
        query: str,
        texts: Sequence[str],
        *,
        raw_scores: bool = False,
        truncate: bool = False,
        return_text: bool = False,
        model: str | None = None,
    ) -> list[Ranked]:
        """`texts` ranked by relevance to `query`, best first: one Ranked (index into `texts`, score, and the
        text with `return_text`) per text. Scores are the cross-encoder's sigmoid, or its logit with `raw_scores`;
        a text longer than the model's window scores as its best window, unless `truncate` cuts it."""
        return self._run(
            Planned(
                texts,
                lambda limit: plan_rerank(
                    query,
                    texts,
                    raw_scores=raw_scores,
                    truncate=truncate,
                    return_text=return_text,
                    batch_limit=limit,
                    model=model,
                ),
            )
        )

    def fill_mask(
        self, inputs: FillMaskInput, *, top_k: int = 5, truncate: bool = False, model: str | None = None
    ) -> list[list[MaskCandidate]] | list[list[list[MaskCandidate]]]:
        """For a text, one list of candidates per [MASK] in it, best first (transformers' fill-mask fields); for
        a list of texts, that per text."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_fill_mask(inputs, top_k=top_k, truncate=truncate, batch_limit=limit, model=model),
            )
        )

    def embed_sparse(
        self,
        inputs: EmbedSparseInput,
        *,
        top_k: int | None = None,
        threshold: float = 0.0,
        return_tokens: bool = False,
        truncate: bool = False,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        model: str | None = None,
    ) -> list[list[SparseValue]]:
        """The sparse (SPLADE) vector of each text (one list per input, a text alone too): its nonzero entries as
        SparseValue(index, value) in index order; only those above `threshold`, only the `top_k` largest when
        given; with `return_tokens` each has its vocabulary word. `truncation_direction` and `prompt_name` are
        text-embeddings-inference's: with `truncate`, "right" cuts a long text's end and "left" its start; the
        model's prompt of that name (its sentence-transformers configuration's) goes before each text."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_embed_sparse(
                    inputs,
                    batch_limit=limit,
                    top_k=top_k,
                    threshold=threshold,
                    return_tokens=return_tokens,
                    truncate=truncate,
                    truncation_direction=truncation_direction,
                    prompt_name=prompt_name,
                    **_model(model),
                ),
            )
        )

    def embed_all(
        self,
        inputs: EmbedAllInput,
        *,
        truncate: bool = False,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        model: str | None = None,
    ) -> list[list[list[float]]]:
        """Every token's vector of each text (one list per input, a text alone too): the encoder's last hidden
        state, special tokens included, as text-embeddings-inference's /embed_all answers. `prompt_name`: the
        model's prompt of that name before each text; with `truncate`, `truncation_direction` "right" cuts a long
        text's end and "left" its start."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_embed_all(
                    inputs,
                    batch_limit=limit,
                    truncate=truncate,
                    truncation_direction=truncation_direction,
                    prompt_name=prompt_name,
                    **_model(model),
                ),
            )
        )

    def zero_shot(
        self,
        inputs: ZeroShotInput,
        candidate_labels: str | Sequence[str],
        *,
        hypothesis_template: str = "This example is {}.",
        multi_label: bool = False,
        truncate: bool = False,
        model: str | None = None,
    ) -> ZeroShotResult | list[ZeroShotResult]:
        """The candidate labels of one text best first, with their scores (a ZeroShotResult), or one per text of
        a list: the served NLI model weighs each label, put into `hypothesis_template`, against the text.
        `candidate_labels` is a list, or one string of comma-separated labels; with `multi_label` each label is
        scored on its own."""
        return self._run(
            Planned(
                inputs,
                lambda limit: plan_zero_shot(
                    inputs,
                    candidate_labels,
                    hypothesis_template=hypothesis_template,
                    multi_label=multi_label,
                    truncate=truncate,
                    batch_limit=limit,
                    model=model,
                ),
            )
        )


def endpoint_names() -> list[str]:
    """The public methods of Endpoints, in declaration order."""
    return [name for name in vars(Endpoints) if not name.startswith("_")]


# ---------------------------------------------------------------------------------------------
# Responses and retries


def parse_retry_after(headers: httpx.Headers) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date; None when absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return None if math.isnan(seconds) else max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _reason(response: httpx.Response) -> str:
    return response.reason_phrase or httpx.codes.get_reason_phrase(response.status_code) or "no reason given"


def _not_json(response: httpx.Response) -> str:
    """A body that is not bertserve's JSON (a proxy's HTML error page, a login page, a cut-off answer), said in
    a line: its content type and the start of its text, an HTML page reduced to its title and words."""
    try:
        text = response.text
    except Exception:  # an undecodable body: say what it is, not its bytes
        text = ""
    content_type = response.headers.get("content-type", "").split(";")[0].strip() or "untyped"
    if not text.strip():
        return f"empty {content_type} body"
    if "html" in content_type or text.lstrip().startswith("<"):
        title = re.search(r"(?is)<title[^>]*>(.*?)</title\s*>", text)
        text = re.sub(r"(?is)<(head|script|style)\b.*?</\1\s*>", " ", text)
        text = " ".join(re.sub(r"<[^>]*>", " ", text).split())
        title = " ".join(title.group(1).split()) if title else ""
        if title and title not in text:
            text = f"{title}: {text}" if text else title
    text = " ".join(text.split())
    return f"{content_type} body {text[:200]!r}{'...' if len(text) > 200 else ''}"


def _detail_message(detail: Any) -> str:
    """FastAPI's own `{"detail": ...}` (an app in front of bertserve): a str, or a list of {loc, msg}."""
    if isinstance(detail, list) and all(isinstance(d, dict) and "msg" in d for d in detail):
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()) if p != 'body') or 'body'}: {d['msg']}" for d in detail
        )
    return str(detail)


def error_from_response(response: httpx.Response) -> BertserveError:
    try:
        body = response.json()
    except ValueError:
        body = None
    error_type = None
    if isinstance(body, dict) and body.get("error") is not None:
        error = body["error"]
        error_type = body.get("error_type")
        if isinstance(error, dict):  # OpenAI's error object, as on the server's /v1/ paths
            message, error_type = str(error.get("message") or error), error_type or error.get("type")
        else:
            message = str(error)
    elif isinstance(body, dict) and "detail" in body:  # a plain FastAPI error, e.g. from a proxy app
        message = _detail_message(body["detail"])
    elif response.is_redirect:
        message = (
            f"{_reason(response)}: redirected to {response.headers.get('location')!r}, which the client does not"
            " follow: use that URL as base_url"
        )
    else:
        message = f"{_reason(response)}; not an answer of bertserve's (a proxy in front of it?): {_not_json(response)}"
    return error_class_for(response.status_code)(
        message,
        status_code=response.status_code,
        error_type=error_type,
        response=response,
        retry_after=parse_retry_after(response.headers),
    )


def json_or_raise(response: httpx.Response) -> Any:
    if not response.is_success:
        raise error_from_response(response)
    try:
        return response.json()
    except ValueError as e:
        raise BertserveError(
            f"the server answered {response.status_code} with what is not JSON (a proxy or login page in front of"
            f" bertserve?): {_not_json(response)}",
            status_code=response.status_code,
            response=response,
        ) from e


_TIMEOUT_PHASES = (  # httpx's timeout classes: what was being waited for, and which of httpx.Timeout's limits
    (httpx.ConnectTimeout, "connect timeout: no connection", "connect"),
    (httpx.ReadTimeout, "read timeout: no answer", "read"),
    (httpx.WriteTimeout, "write timeout: the request not sent", "write"),
    (httpx.PoolTimeout, "pool timeout: no free connection in the pool", "pool"),
)


def _os_reason(exc: BaseException) -> str:
    """The operating system's reason under an httpx error, the same for Client and AsyncClient (whose own
    message, anyio's "All connection attempts failed", hides it): "[Errno 111] Connection refused"."""
    found, seen, cause = None, set(), exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno is not None:
            found = cause  # the deepest one is the system call's
        cause = cause.__cause__ or cause.__context__
    if found is None:
        return str(exc) or type(exc).__name__
    if found.errno > 0:
        return f"[Errno {found.errno}] {os.strerror(found.errno)}"
    return f"[Errno {found.errno}] {found.strerror}"  # a resolver error (socket.gaierror): its own text


def transport_error(
    exc: httpx.TransportError, call: Call | None = None, url: str | None = None, timeout: Any = None
) -> APIConnectionError:
    """No HTTP answer, said the same way by both clients: what failed, on which request, and why."""
    where = f" ({call.method} {url})" if call is not None and url is not None else ""
    if isinstance(exc, httpx.TimeoutException):
        limits = httpx.Timeout(timeout) if timeout is not None else None
        for cls, what, limit in _TIMEOUT_PHASES:
            if isinstance(exc, cls):
                seconds = getattr(limits, limit, None) if limits is not None else None
                within = f" within {seconds:g} s" if isinstance(seconds, (int, float)) else ""
                hint = "; a slow request needs a larger timeout=" if limit == "read" else ""
                return APITimeoutError(f"{what}{within}{where}{hint}")
        return APITimeoutError(f"timed out{where}: {_os_reason(exc)}")
    if isinstance(exc, httpx.ConnectError):
        return APIConnectionError(f"could not connect to the server{where}: {_os_reason(exc)}")
    return APIConnectionError(f"the connection to the server failed{where}: {type(exc).__name__}: {_os_reason(exc)}")


def decoding_error(exc: httpx.DecodingError, call: Call, url: str) -> BertserveError:
    """An answer whose body could not be decoded (a bad gzip from a proxy): no JSON to read. Not retried."""
    return BertserveError(f"the answer to {call.method} {url} could not be decoded: {exc}")


RETRIED_STATUSES = (408,)  # besides 429 and 5xx: the server's "your body arrived too slowly", sent before any work


def _retried(error: BertserveError) -> bool:
    return isinstance(error, (OverloadedError, ServerError, APIConnectionError)) or (
        error.status_code in RETRIED_STATUSES
    )


@dataclass(frozen=True)
class Retries:
    """When a failed request is sent again. Retried: 408, 429, 5xx, timeouts and connection errors, at most
    `max_retries` times. A Retry-After header is a floor: the wait is at least that (plus up to 25 % jitter, so that
    clients told the same number spread out), unless it is over `max_retry_after`: then the error is raised. Without
    one the wait doubles from `backoff` up to `max_backoff` seconds, less up to 25 %."""

    max_retries: int = DEFAULT_MAX_RETRIES
    backoff: float = INITIAL_RETRY_DELAY
    max_backoff: float = MAX_RETRY_DELAY
    max_retry_after: float = MAX_RETRY_AFTER

    def __post_init__(self) -> None:
        for name in ("max_retries", "backoff", "max_backoff", "max_retry_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(self.max_retries, float):
            raise ValueError(f"max_retries must be an integer, got {self.max_retries!r}")

    def delay(self, error: BertserveError, attempt: int) -> float | None:
        """Seconds to wait before retry number `attempt + 1`, or None to give up and raise `error`."""
        if attempt >= self.max_retries or not _retried(error):
            return None
        retry_after = parse_retry_after(error.response.headers) if error.response is not None else None
        if retry_after is not None:
            if retry_after > self.max_retry_after:
                return None
            return retry_after * (1 + 0.25 * random.random())
        delay = min(self.backoff * 2**attempt, self.max_backoff)
        return delay * (1 - 0.25 * random.random())

    def note_giving_up(self, error: BertserveError, attempt: int) -> None:
        """Say why a retriable error is raised: the retries ran out, or the server asks for too long a wait."""
        if not _retried(error):
            return
        if attempt < self.max_retries and error.retry_after is not None and error.retry_after > self.max_retry_after:
            error._add_note(
                f"not retried: the server asks for {error.retry_after:g} s (Retry-After), more than the"
                f" {self.max_retry_after:g} s this client waits (max_retry_after)"
            )
        elif attempt > 0:
            error._add_note(f"gave up after {attempt + 1} attempts")


def note_info(error: BertserveError) -> None:
    """An error of the /info request a list call makes to learn how many inputs one request may carry."""
    error._add_note(
        "while reading the server's max_client_batch_size from /info to split the list; batch_size=N skips it"
    )


# ---------------------------------------------------------------------------------------------
# Configuration shared by both clients


def check_base_url(base_url: str | httpx.URL | None) -> str:
    """The server's URL without its trailing slash: `base_url`, else $BERTSERVE_BASE_URL, else the default. A URL
    no request could go to ("localhost:8000", no scheme) is refused here, not retried on every call."""
    source = "base_url"
    if not base_url:
        base_url, source = os.environ.get("BERTSERVE_BASE_URL", "").strip(), "$BERTSERVE_BASE_URL"
    if not base_url:
        base_url, source = DEFAULT_BASE_URL, "the default base_url"
    text = str(base_url).strip()
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as e:
        raise ValueError(f"{source} {text!r} is not a URL: {e}") from e
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"{source} must be an http:// or https:// URL with a host, like {DEFAULT_BASE_URL}; got {text!r}"
        )
    return text.rstrip("/")


class BaseClient:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        batch_size: int | None = None,
        headers: Mapping[str, str] | None = None,
        backoff: float = INITIAL_RETRY_DELAY,
        max_backoff: float = MAX_RETRY_DELAY,
        max_retry_after: float = MAX_RETRY_AFTER,
    ) -> None:
        self.retries = Retries(max_retries, backoff, max_backoff, max_retry_after)  # ValueError if out of range
        self.base_url = check_base_url(base_url)
        self.api_key = api_key if api_key is not None else os.environ.get("BERTSERVE_API_KEY")
        self.timeout = timeout
        # Inputs per request for list calls; None: ask the server's /info once, on the first list call.
        self.batch_size = batch_size
        self._headers = {"Accept": "application/json", "User-Agent": f"bertserve-client/{__version__}"}
        if self.api_key:
            self._headers["Authorization"] = f"Bearer {self.api_key}"
        self._headers.update(headers or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    @property
    def max_retries(self) -> int:
        return self.retries.max_retries

    def _request_kwargs(self, call: Call) -> dict:
        kwargs: dict[str, Any] = {"headers": self._headers, "timeout": self.timeout}
        if call.json is not None:
            kwargs["json"] = call.json
        return kwargs

    def _url(self, path: str) -> str:
        return self.base_url + path

    @staticmethod
    def _limit_from_info(info: Info) -> int:
        return info.client_batch_limit or 0  # 0: the server states no limit, send lists whole


def probe_result(response: httpx.Response) -> bool:
    """/health and /ready: True when up, False on 5xx (a server still loading answers 503)."""
    if response.is_success:
        return True
    if response.status_code >= 500:
        return False
    raise error_from_response(response)
