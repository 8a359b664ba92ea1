"""Sentence embeddings: texts in, one vector per text out.

The encoder's token states are pooled into one vector per text ([CLS] state, mean or max over the real
tokens: bert/pooling.py), then optionally scaled to unit length. How a model pools is read from a sentence-transformers
directory (`modules.json` -> its Pooling module's `config.json`, and whether a Normalize module follows),
else from our `config.json` key "pooling", else mean pooling, sentence-transformers' choice for a plain
encoder. Vectors equal sentence-transformers' `encode(normalize_embeddings=True)` for the same model.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

import numpy as np

from bert.pooling import DEFAULT_POOLING, POOLINGS
from bert.tasks import classify
from bert.tasks.base import (
    MODEL,
    PROMPT_NAME,
    TRUNCATE,
    TRUNCATION_DIRECTION,
    JobColumns,
    Param,
    Route,
    Task,
    check_inputs,
    check_texts,
    texts_of,
    texts_param,
)
from bert.tasks.common import CHUNK_CHARS, Features, Limits, ModelFacts, OpenAIUsage
from bert.tasks.windows import LongInputs, TooManyWindows, cut_texts, single_template, too_much_work

_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
# sentence-transformers' pooling_mode names and legacy flags -> ours
_ST_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
}


class PoolingError(ValueError):
    """A pooling configuration this codec cannot reproduce; the message names the file."""


@dataclass(frozen=True)
class Pooling:
    mode: str = DEFAULT_POOLING  # cls | mean | max
    normalize: bool = True  # the model's own default: vectors scaled to unit length
    source: str = "default"  # where it was read: sentence-transformers | config.json | default | flag
    max_length: int | None = None  # sentence-transformers' max_seq_length: longer inputs are not what it was tuned on

    def describe(self) -> dict:
        return {"pooling": self.mode, "normalize": self.normalize, "source": self.source}


def read_pooling(directory) -> Pooling:
    """The pooling a checkpoint or artifact directory asks for (see the module docstring)."""
    directory = Path(directory)
    modules = _read_json(directory / "modules.json")
    if isinstance(modules, list):
        return _sentence_transformers_pooling(directory, modules)
    config = _read_json(directory / "config.json")
    declared = config.get("pooling") if isinstance(config, dict) else None
    if isinstance(declared, dict):
        mode, max_length = declared.get("mode", DEFAULT_POOLING), declared.get("max_length")
        if mode not in POOLINGS:
            raise PoolingError(
                f"{directory / 'config.json'}: pooling mode {mode!r} is not one of {', '.join(POOLINGS)}"
            )
        return Pooling(
            mode,
            bool(declared.get("normalize", True)),
            "config.json",
            max_length if isinstance(max_length, int) and max_length > 0 else None,
        )
    return Pooling()


@functools.lru_cache(maxsize=32)
def read_prompts(directory: str) -> dict[str, str]:
    """The prompts of a sentence-transformers model directory (config_sentence_transformers.json's "prompts", name ->
    the text put before an input); {} when it has none."""
    try:
        prompts = json.loads((Path(directory) / "config_sentence_transformers.json").read_text()).get("prompts") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return (
        {k: v for k, v in prompts.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(prompts, dict)
        else {}
    )


def prompt(directory, name) -> str:
    """The text text-embeddings-inference's `prompt_name` puts before each input: the model's prompt of that name;
    ValueError naming it and the model's prompts when it has none of that name."""
    prompts = read_prompts(str(directory))
    if not isinstance(name, str) or name not in prompts:
        known = ", ".join(prompts) or "none (no config_sentence_transformers.json prompts)"
        raise ValueError(f"prompt_name: {name!r} is not a prompt of this model; its prompts: {known}")
    return prompts[name]


def _sentence_transformers_pooling(directory: Path, modules: list) -> Pooling:
    types = [m.get("type", "") for m in modules if isinstance(m, dict)]
    pooling_module = next((m for m in modules if isinstance(m, dict) and m.get("type") == _ST_POOLING), None)
    mode = DEFAULT_POOLING
    if pooling_module is not None:
        path = directory / str(pooling_module.get("path", "")) / "config.json"
        config = _read_json(path)
        if not isinstance(config, dict):
            raise PoolingError(f"{path}: not a pooling configuration")
        modes = (
            [config["pooling_mode"]]
            if isinstance(config.get("pooling_mode"), str)
            else [key for key, value in config.items() if key.startswith("pooling_mode") and value is True]
        )
        known = [_ST_MODES[m] for m in modes if m in _ST_MODES]
        if len(modes) != 1 or len(known) != 1:
            raise PoolingError(f"{path}: pooling {modes or 'none'} is not one of cls, mean, max alone")
        mode = known[0]
    settings = _read_json(directory / "sentence_bert_config.json")
    max_length = settings.get("max_seq_length") if isinstance(settings, dict) else None
    return Pooling(
        mode,
        _ST_NORMALIZE in types,
        "sentence-transformers",
        int(max_length) if isinstance(max_length, int) and max_length > 0 else None,
    )


def _read_json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PoolingError(f"{path}: cannot read it as JSON ({e})") from None


# ---- encoding and decoding ---------------------------------------------------------------------
def encode(tokenizer, texts: list[str], *, max_length: int = 512, truncate: bool = False) -> list[Features]:
    """Texts -> Features ([CLS] text [SEP]); too long: InputTooLong, or with `truncate` the tail is cut."""
    return classify.encode(tokenizer, list(texts), max_length=max_length, truncate=truncate)


def encode_each(tokenizer, texts: list, limits: Limits, *, truncate: bool, truncation_direction: str) -> list:
    """One window per text (`encode_cut` at the model's limit), in the per-item lists an `encode_request` gives."""
    cut = encode_cut(
        tokenizer, list(texts), max_length=limits.max_length, truncate=truncate, direction=truncation_direction
    )
    return [[f] for f in cut]


def encode_cut(
    tokenizer, texts: list[str], *, max_length: int = 512, truncate: bool = False, direction: str = "right"
) -> list[Features]:
    """Texts -> Features ([CLS] text [SEP]); too long: InputTooLong, or with `truncate` cut as text-embeddings-inference's
    `truncation_direction` says: "right" cuts a text's end (encode), "left" its start (the text's last tokens
    kept). A text that fits is the same either way."""
    if not truncate or direction.lower() == "right":
        return encode(tokenizer, texts, max_length=max_length, truncate=truncate)
    before, after = single_template(tokenizer)
    capacity = max(0, max_length - len(before) - len(after))
    found = []
    for text in texts:
        ids = _last_ids(tokenizer, text, capacity)
        found.append(
            Features(input_ids=[*before, *ids, *after], token_type_ids=[0] * (len(before) + len(ids) + len(after)))
        )
    return found


def _last_ids(tokenizer, text: str, count: int) -> list[int]:
    """The ids of a text's last `count` tokens (all of them when it has fewer), specials not added. A long text is
    tokenised from its end, a piece of CHUNK_CHARS more at a time, so that cutting it costs what its last tokens
    cost, as `bounded_text` does for its first ones."""
    backend = getattr(tokenizer, "backend", tokenizer)
    start = len(text)
    while True:
        start = _cut_before(text, start - CHUNK_CHARS)
        encoding = backend.encode_batch([text[start:]], add_special_tokens=False)[0]
        ids = encoding.ids
        if start > 0:
            # The piece's first word may be tokenised otherwise without what precedes it (a byte-level BPE marks a
            # word's leading space): only the tokens after it are surely the text's own.
            first_word = next((i for i, c in enumerate(text[start:]) if c.isspace()), None)
            own = [i for i, (begin, _) in enumerate(encoding.offsets) if first_word is not None and begin > first_word]
            ids = ids[own[0] :] if own else []
        if start == 0 or len(ids) >= count:
            return ids[max(0, len(ids) - count) :] if count else []
        time.sleep(0)  # hand the GIL over between pieces


def _cut_before(text: str, at: int) -> int:
    """A cut just after the last white space before `at` (0 at the text's start; `at` in a run of 4 chunks without
    any)."""
    if at <= 0:
        return 0
    for i in range(at, max(0, at - 4 * CHUNK_CHARS), -1):
        if text[i - 1].isspace():
            return i
    return at


def decode(vectors, *, normalize: bool) -> list[list[float]]:
    """Pooled vectors (B, H) -> lists of floats, scaled to unit length when asked (as torch's F.normalize)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    if normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors.tolist()


# ---- serving ------------------------------------------------------------------------------------
CHUNKINGS = ("mean",)
LONG_INPUTS = LongInputs(
    merge='with "chunking": "mean", the mean of the windows\' vectors weighted by their text tokens',
    default_stride=0,  # each token counted once in the mean
    whole_words=True,
    opt_in="chunking",
)


@dataclass
class Chunk(Features):
    """One window of a chunked text, and the text tokens it holds (its weight in the text's mean)."""

    weight: int = 0


def encode_request(
    tokenizer,
    items: list[str],
    limits: Limits,
    *,
    truncate: bool = False,
    truncation_direction: str = "right",
    chunking: str | None = None,
    **_,
) -> list[list[Features]]:
    """Texts -> one model input each (too long: InputTooLong, or cut with `truncate` at the end
    `truncation_direction` names); with `chunking` the whole-word windows of each, at most limits.max_sequences in
    all (TooMuchWork beyond, before any is built)."""
    if chunking is None:
        return encode_each(tokenizer, items, limits, truncate=truncate, truncation_direction=truncation_direction)
    if chunking not in CHUNKINGS:
        raise ValueError(f"chunking must be one of {', '.join(CHUNKINGS)}, got {chunking!r}")
    if truncate:
        raise ValueError('chunking: embeds a long text whole, "truncate": true cuts it; send one of them')
    before, after = single_template(tokenizer)
    capacity = limits.max_length - len(before) - len(after)
    stride = LONG_INPUTS.stride(None, capacity, limits.max_length)
    try:
        pieces = cut_texts(
            tokenizer, list(items), capacity=capacity, stride=stride, max_windows=limits.max_sequences, whole_words=True
        )
    except TooManyWindows as e:
        raise too_much_work(e.needed, 0, limits.max_sequences, limits.max_length) from None
    return [
        [
            Chunk(
                input_ids=[*before, *text.ids[start:stop], *after],
                token_type_ids=[0] * (len(before) + stop - start + len(after)),
                weight=stop - start,
            )
            for start, stop in text.ranges
        ]
        for text in pieces
    ]


def shorten(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` components of each vector (Matryoshka truncation); all of them for None."""
    return vectors if dimensions is None else vectors[..., :dimensions]


def decode_request(
    items: list,
    features: list,
    outputs: list,
    facts: ModelFacts,
    *,
    normalize: bool = True,
    dimensions: int | None = None,
    **_,
) -> list[list[float]]:
    """One vector per text: a chunked text's windows (unit vectors when `normalize`) averaged by their text tokens;
    then its first `dimensions` components, scaled to unit length when `normalize`."""
    rows = []
    for windows, sequences in zip(features, outputs):
        vectors = np.stack([s["embed"] for s in sequences]).astype(np.float32)
        if len(windows) > 1:
            if normalize:
                vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
            weights = np.asarray([w.weight for w in windows], dtype=np.float32)
            vectors = (weights @ vectors / weights.sum())[None, :]
        rows.append(vectors[0])
    return decode(shorten(np.stack(rows), dimensions), normalize=normalize)


def check_dimensions(dimensions: int | None, info) -> None:
    """OpenAI's rule: a vector can be shortened, never lengthened."""
    width = getattr(info, "embedding_dimensions", None)
    if dimensions is not None and width is not None and dimensions > width:
        raise ValueError(f"dimensions: {dimensions} is more than this model's {width}; at most {width}")


def _check_embed(body, info=None) -> None:
    check_inputs(body, info)
    check_dimensions(body.dimensions, info)


def _openai_items(body) -> tuple[list, dict]:
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    return texts, {
        "normalize": True,
        "dimensions": body.dimensions,
        "chunking": body.chunking,
        "truncate": body.truncate,
    }


def _check_openai(body, info=None) -> None:
    single = isinstance(body.input, str)
    check_texts([body.input] if single else body.input, "input" if single else "input[{}]")
    check_dimensions(body.dimensions, info)


@dataclass(kw_only=True)
class OpenAIEmbedding:
    """One input's vector in OpenAI's embeddings answer: floats, or base64 of little-endian float32."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


@dataclass(kw_only=True)
class OpenAIEmbeddingResponse:
    """/v1/embeddings' answer: OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


def _openai_shape(vectors: list, body, info) -> dict:
    """OpenAI's embeddings response: floats or base64 little-endian float32, and the input tokens as usage."""
    import base64

    def encoded(vector):
        if body.encoding_format == "base64":  # what openai-python asks for by default, and decodes with numpy
            return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        return vector

    tokens = info.tokens
    return {
        "object": "list",
        "model": body.model or info.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
    }


class EmbedTask(Task):
    """Sentence embeddings, pooled as the model's sentence-transformers configuration says; any encoder serves it."""

    name = "embed"
    order = 40
    head = None
    architectures = ("BertModel",)
    graph_outputs = {"embedding": "embed"}
    single_graph_outputs = {"embedding": "embed"}
    routes = (
        Route(
            "/embed",
            "EmbedRequest",
            list[list[float]],
            "Embed texts (text-embeddings-inference's shape)",
            to_items=texts_of,
            shape=lambda answers, body, info=None: answers,
            check=_check_embed,
            fields=(
                MODEL,
                texts_param("What is the capital of France?"),
                Param(
                    "normalize",
                    bool,
                    True,
                    "scale each vector to unit length (cosine similarity = dot product)",
                    job=True,
                ),
                TRUNCATE,
                TRUNCATION_DIRECTION,
                PROMPT_NAME,
                Param(
                    "chunking",
                    Optional[Literal[CHUNKINGS]],
                    None,
                    '"mean": a text longer than the model\'s window is cut into whole-word windows and embedded as '
                    "the mean of their vectors weighted by their tokens (each a unit vector first when `normalize`), "
                    "renormalised; default: such a text is refused (422) unless `truncate`",
                ),
                Param(
                    "dimensions",
                    Optional[int],
                    None,
                    "keep the first N components of each vector (Matryoshka truncation), renormalised when "
                    "`normalize`; at most the model's width (422 beyond)",
                    minimum=1,
                ),
            ),
            doc="One vector per input, always a list of vectors (as text-embeddings-inference answers), pooled as the "
            "model's sentence-transformers configuration says and scaled to unit length unless `normalize` is false.",
        ),
        Route(
            "/v1/embeddings",
            "OpenAIEmbeddingRequest",
            OpenAIEmbeddingResponse,
            "Embed texts (OpenAI's shape)",
            to_items=_openai_items,
            shape=_openai_shape,
            check=_check_openai,
            batch_field="input",
            # OpenAI's request body, every field it defines (the official client sends them as they are)
            fields=(
                texts_param(
                    "What is the capital of France?",
                    help="a text or a list of texts (token arrays are not taken)",
                    name="input",
                ),
                MODEL,
                Param(
                    "encoding_format",
                    Literal["float", "base64"],
                    "float",
                    "float: lists of numbers; base64: little-endian float32 bytes, base64-encoded",
                ),
                Param(
                    "dimensions",
                    Optional[int],
                    None,
                    "the first N components of each vector, renormalised; at most the model's width",
                    minimum=1,
                ),
                Param(
                    "chunking",
                    Optional[Literal[CHUNKINGS]],
                    None,
                    "not OpenAI's: \"mean\" embeds a text longer than the model's window as /embed does",
                ),
                Param(
                    "truncate",
                    bool,
                    False,
                    "not OpenAI's: cut inputs longer than the model's limit instead of refusing them",
                ),
                Param("user", Optional[str], None, "accepted and ignored"),
            ),
            doc="OpenAI's embeddings API: `input` a text or a list of texts; vectors scaled to unit length, as floats "
            "or as base64 little-endian float32 (`encoding_format`); `usage` counts the model's input tokens.",
        ),
    )
    job = JobColumns(
        inputs=("text",),
        arity=(1,),
        results=(("embedding", "vector"),),
        values=lambda answers: {"embedding": answers},
    )

    long_inputs = LONG_INPUTS

    def encode_request(self, tokenizer, items, limits, **options):
        return encode_request(tokenizer, items, limits, **options)

    def decode_request(self, items, features, outputs, facts, **options):
        return decode_request(items, features, outputs, facts, **options)


TASK = EmbedTask()
