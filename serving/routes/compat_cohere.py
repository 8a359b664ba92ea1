"""Cohere's rerank and embed APIs (v1 and v2), infinity's unprefixed `/embeddings`, and OpenAI's `GET /v1/models`,
answered by our /rerank, /embed and /v1/embeddings.

Cohere's embedding types are sentence-transformers' `quantize_embeddings`: int8 and uint8 with the ranges [-1, 1]
in every dimension (where a unit vector's components lie; sentence-transformers would otherwise take each
dimension's range from the request's own vectors, and a text's numbers would change with the texts sent beside
it), binary and ubinary the signs packed 8 to a byte (binary offset by -128).
"""

from __future__ import annotations

import uuid

import numpy as np
from fastapi import APIRouter, Request

from serving.routes.compat_run import json_object, read_json, refuse, run, served_tasks, validate

router = APIRouter(tags=["compatibility"], include_in_schema=False)

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")


def quantize(vectors: np.ndarray, kind: str) -> list:
    """Vectors (n, d) as Cohere's embedding type `kind` (sentence-transformers' quantize_embeddings, fixed ranges)."""
    if kind == "float":
        return vectors.tolist()
    if kind in ("int8", "uint8"):
        steps = np.float32(2.0 / 255)
        levels = np.clip(np.floor((vectors + np.float32(1.0)) / steps), 0, 255)
        return (levels.astype(np.uint8) if kind == "uint8" else (levels - 128).astype(np.int8)).tolist()
    packed = np.packbits(vectors > 0, axis=-1)
    return packed.tolist() if kind == "ubinary" else (packed - 128).astype(np.int8).tolist()


def _meta(tokens: int, version: str) -> dict:
    return {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}


def _cohere_truncate(value) -> bool:
    """Cohere's truncate: NONE (refuse a long text, our default), END (cut its end); START is not served."""
    if value is None or value == "NONE":
        return False
    if value == "END":
        return True
    raise refuse(f"truncate: {value!r} is not served; NONE (a long text is refused) or END (its end is cut)")


def _nothing(body: dict, *names: str) -> None:
    """Fields that ask for what we do not serve: accepted only absent, null or empty."""
    for name in names:
        if body.get(name) not in (None, [], False):
            raise refuse(f"{name}: not served here (text only, no per-request token limits or spans)")


def _embedding_types(value, default) -> list[str]:
    kinds = default if value is None else value
    if not isinstance(kinds, list) or not kinds or any(k not in EMBEDDING_TYPES for k in kinds):
        raise refuse(f"embedding_types: a list of {', '.join(EMBEDDING_TYPES)} is required")
    return list(dict.fromkeys(kinds))


# ---- embed -------------------------------------------------------------------------------------------------
_V1_EMBED = {"texts", "images", "model", "input_type", "embedding_types", "truncate"}
_V2_EMBED = _V1_EMBED | {"inputs", "output_dimension", "max_tokens", "priority"}


async def _embed(request: Request, body: dict, version: str):
    _nothing(body, "images", "inputs", "max_tokens")
    texts = body.get("texts")
    if not isinstance(texts, list):
        raise refuse("texts: a list of texts is required")
    native = {"inputs": texts, "normalize": True, "truncate": _cohere_truncate(body.get("truncate"))}
    if body.get("output_dimension") is not None:
        native["dimensions"] = body["output_dimension"]
    if isinstance(body.get("model"), str):
        native["model"] = body["model"]
    by_type = body.get("embedding_types") is not None or version == "2"
    kinds = _embedding_types(body.get("embedding_types"), ["float"])
    names = {"inputs": "texts", "dimensions": "output_dimension"}

    def shape(vectors, info):
        array = np.asarray(vectors, dtype=np.float32)
        answer = {"id": uuid.uuid4().hex, "texts": texts, "meta": _meta(info.tokens, version)}
        if not by_type:
            return {**answer, "response_type": "embeddings_floats", "embeddings": vectors}
        return {
            **answer,
            "response_type": "embeddings_by_type",
            "embeddings": {kind: quantize(array, kind) for kind in kinds},
        }

    if not isinstance(body.get("model", ""), str) and body.get("model") is not None:
        raise refuse("model: a string is required")
    return await run(request, "/embed", native, shape, names=names)


@router.post("/v1/embed")
async def cohere_embed_v1(request: Request):
    """Cohere's v1 embed: floats, or each of `embedding_types` (float, int8, uint8, binary, ubinary)."""
    return await _embed(request, json_object(await read_json(request), _V1_EMBED, "Cohere's v1 embed"), "1")


@router.post("/v2/embed")
async def cohere_embed_v2(request: Request):
    """Cohere's v2 embed: the vectors by embedding type (float unless `embedding_types` says)."""
    return await _embed(request, json_object(await read_json(request), _V2_EMBED, "Cohere's v2 embed"), "2")


# ---- rerank ------------------------------------------------------------------------------------------------
_V1_RERANK = {"model", "query", "documents", "top_n", "rank_fields", "return_documents", "max_chunks_per_doc"}
_V2_RERANK = {"model", "query", "documents", "top_n", "max_tokens_per_doc", "return_documents", "relevant_spans"}
_V2_RERANK |= {"priority", "rank_fields"}


def _document_texts(documents) -> tuple[list, bool]:
    """(the documents' texts, whether they came as {"text"} objects) of Cohere's documents."""
    if not isinstance(documents, list):
        return documents, False  # our route names what is wrong with it
    texts, objects = [], False
    for i, doc in enumerate(documents):
        if isinstance(doc, dict):
            if set(doc) != {"text"}:
                raise refuse(f'documents[{i}]: a text, or an object {{"text": ...}} (other fields are not ranked)')
            doc, objects = doc["text"], True
        texts.append(doc)
    return texts, objects


async def _rerank(request: Request, body: dict, version: str, documents_as_objects: bool):
    if body.get("rank_fields") not in (None, ["text"]):
        raise refuse('rank_fields: only ["text"] is ranked')
    _nothing(body, "max_chunks_per_doc", "max_tokens_per_doc", "relevant_spans")
    texts, objects = _document_texts(body.get("documents"))
    native = {
        "query": body.get("query"),
        "texts": texts,
        "return_text": bool(body.get("return_documents")) if isinstance(body.get("return_documents"), bool) else False,
    }
    if body.get("return_documents") not in (None, True, False):
        raise refuse("return_documents: Input should be a valid boolean")
    if isinstance(body.get("model"), str):
        native["model"] = body["model"]
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise refuse("top_n: an integer of at least 1 is required")

    def shape(ranked, info):
        results = [
            {
                "index": r["index"],
                "relevance_score": r["score"],
                **({"document": {"text": r["text"]}} if "text" in r else {}),
            }
            for r in (ranked[:top_n] if top_n is not None else ranked)
        ]
        return {"id": uuid.uuid4().hex, "results": results, "meta": _meta(info.tokens, version)}

    return await run(request, "/rerank", native, shape, names={"texts": "documents", "return_text": "return_documents"})


@router.post("/v1/rerank")
async def cohere_rerank_v1(request: Request):
    """Our /v1/rerank, with Cohere's documents as {"text"} objects (answered with `document: {"text"}`) and its
    other fields."""
    body = await read_json(request)
    cohere_only = set(_V1_RERANK) - {"model", "query", "documents", "top_n", "return_documents"}
    documents = body.get("documents") if isinstance(body, dict) else None
    if isinstance(body, dict) and (
        cohere_only & body.keys() or (isinstance(documents, list) and any(isinstance(d, dict) for d in documents))
    ):
        return await _rerank(request, json_object(body, _V1_RERANK, "Cohere's v1 rerank"), "1", True)
    validate("/v1/rerank", body)  # our route's own refusal
    return await run(request, "/v1/rerank", body)


@router.post("/v2/rerank")
async def cohere_rerank_v2(request: Request):
    """Cohere's v2 rerank: {id, results: [{index, relevance_score}], meta}, the best `top_n`."""
    body = json_object(await read_json(request), _V2_RERANK, "Cohere's v2 rerank")
    return await _rerank(request, body, "2", True)


# ---- infinity's unprefixed embeddings, OpenAI's model list -----------------------------------------------------
_INFINITY_EMBED = {"input", "model", "encoding_format", "user", "dimensions", "modality", "truncate"}


@router.post("/embeddings")
async def infinity_embeddings(request: Request):
    """infinity's /embeddings (OpenAI's request and answer, without the /v1 prefix)."""
    body = json_object(await read_json(request), _INFINITY_EMBED, "infinity's /embeddings")
    if body.pop("modality", "text") != "text":
        raise refuse("modality: only text is served")
    if body.get("model") == "default/not-specified":
        body.pop("model")  # infinity's client's placeholder
    return await run(request, "/v1/embeddings", body)


def _model_names(request: Request) -> list[str]:
    served_tasks(request)
    engine = request.app.state.engine
    return list(dict.fromkeys(name for models in engine.models.values() for name in models))


@router.get("/v1/models")
async def openai_models(request: Request):
    """OpenAI's model list: every model the server serves, by the name a request's "model" picks it by."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "bertserve"} for name in _model_names(request)
        ],
    }


@router.get("/v1/models/{name:path}")
async def openai_model(name: str, request: Request):
    """OpenAI's model retrieval: one served model by name (404 naming the served ones)."""
    names = _model_names(request)
    if name not in names:
        from serving.errors import NotFound

        raise NotFound(f"model {name!r} is not served; the models: {', '.join(names)}")
    return {"id": name, "object": "model", "created": 0, "owned_by": "bertserve"}
