"""text-embeddings-inference's routes beyond the ones we share (`/embed`, `/rerank`), as TEI documents them:
`/predict`, `/similarity`, `/tokenize`, `/decode`; TEI's nulls on `/embed` (its `truncation_direction` and
`prompt_name` are our route's fields) and `/rerank` (and its `truncation_direction`), infinity's `/rerank` body beside
TEI's (told apart by `documents` against `texts`); `/info` with TEI's fields beside ours.

`/embed`, `/rerank` and `/info` are our routes too: the lean path answers every body our route takes, and a body it
refuses reaches these, which answer it as the other API or, when it is not the other API's, with our route's own
error (serving/routes/compat.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Request

from bert.tasks import hf_api
from bert.tasks.embed import prompt
from serving.errors import EmptyInput, NotFound, PayloadTooLarge
from serving.routes.compat_hf import answer as answer_hf
from serving.routes.compat_run import endpoint_for, json_object, read_json, refuse, run, served_tasks, validate

router = APIRouter(tags=["compatibility"], include_in_schema=False)

_RIGHT = (None, "right", "Right")
# Our route whose model's prompts TEI's prompt_name names on /tokenize (feature-extraction's).
_EMBED_ROUTE = next(p.route for ps in hf_api.PIPELINES.values() for p in ps if p.tag == "feature-extraction")


def _cut_at_the_end(body: dict) -> None:
    """TEI's truncation_direction: "right" (its default) is how we cut; "left" would keep a text's end."""
    if body.pop("truncation_direction", None) not in _RIGHT:
        raise refuse("truncation_direction: only 'right' is served: a text is cut at its end")


def _drop_nulls(body: dict, *names: str) -> None:
    """TEI's optional fields sent as null mean their default, which is ours too."""
    for name in names:
        if name in body and body[name] is None:
            del body[name]


def _prompt(request: Request, route: str, model, name) -> str:
    """The text TEI's `prompt_name` puts before each input: the served model's prompt of that name."""
    task = endpoint_for(route).task.name
    unit = request.app.state.engine.unit(task, model if isinstance(model, str) else None)
    try:
        return prompt(unit.spec.path, name)
    except ValueError as e:
        raise refuse(str(e)) from None


def _with_prompt(request: Request, route: str, body: dict, field: str = "inputs") -> None:
    name = body.pop("prompt_name", None)
    if name is None:
        return
    prompt = _prompt(request, route, body.get("model"), name)
    texts = body.get(field)
    if isinstance(texts, str):
        body[field] = prompt + texts
    elif isinstance(texts, list):
        body[field] = [prompt + t if isinstance(t, str) else t for t in texts]


# ---- /predict: TEI's classifier route ---------------------------------------------------------------------
def _predict_inputs(inputs) -> tuple[bool, list]:
    """(single, our /classify inputs) of TEI's predict inputs: a text, a pair [text, text] or [text], or a batch of
    [text] and [text, text]."""

    def sequence(value, where: str):
        if isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) in (1, 2):
            return value[0] if len(value) == 1 else list(value)
        raise refuse(f"{where}: a [text] or a [text, text_pair] is required")

    if isinstance(inputs, str):
        return True, [inputs]
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], str):
        return True, [sequence(inputs, "inputs")]
    if isinstance(inputs, list) and inputs:
        return False, [sequence(x, f"inputs[{i}]") for i, x in enumerate(inputs)]
    if inputs == []:
        raise EmptyInput("inputs is empty")
    raise refuse("inputs: a text, a [text, text_pair], or a list of [text] and [text, text_pair] is required")


@router.post("/predict")
async def predict(request: Request):
    """TEI's /predict: every label's score, best first, for a text, a pair or a batch (our /classify)."""
    body = json_object(
        await read_json(request), {"inputs", "truncate", "truncation_direction", "raw_scores"}, "/predict"
    )
    _cut_at_the_end(body)
    if "inputs" not in body:
        raise refuse("inputs: Field required")
    single, inputs = _predict_inputs(body["inputs"])
    native = {"inputs": inputs, "top_k": None}
    raw = body.get("raw_scores", False)
    if not isinstance(raw, bool):
        raise refuse("raw_scores: Input should be a valid boolean")
    if raw:
        native["function_to_apply"] = "none"
    if body.get("truncate") is not None:
        native["truncate"] = body["truncate"]
    return await run(request, "/classify", native, lambda content, info: content[0] if single else content)


# ---- /similarity: TEI's sentence-similarity ----------------------------------------------------------------
@router.post("/similarity")
async def similarity(request: Request):
    """TEI's /similarity: `{"inputs": {"source_sentence", "sentences"}, "parameters"}` -> the cosine of each
    sentence's vector with the source's."""
    chosen = hf_api.by_tag("sentence-similarity", served_tasks(request))
    if chosen is None:
        raise NotFound("this server serves no embeddings, so no /similarity")
    body = json_object(await read_json(request), {"inputs", "parameters"}, "/similarity")
    if isinstance(body.get("parameters"), dict):
        body["parameters"] = {k: v for k, v in body["parameters"].items() if v is not None}
    return await answer_hf(request, chosen[1], body)


# ---- /tokenize and /decode: the served model's tokenizer ----------------------------------------------------
def _tokenizer(request: Request):
    tasks = served_tasks(request)
    return request.app.state.engine.unit(tasks[0]).tokenizer


def _count(items: list, request: Request, field: str) -> None:
    limit = request.app.state.settings.max_client_batch_size
    if not items:
        raise EmptyInput(f"{field} is empty")
    if len(items) > limit:
        raise PayloadTooLarge(f"{len(items)} inputs in one request; the limit is {limit} (max_client_batch_size)")


def _tokens(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    out = []
    for text, encoding in zip(texts, tokenizer.backend.encode_batch(texts, add_special_tokens=add_special_tokens)):
        tokens = []
        for token_id, token, special, (start, stop) in zip(
            encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
        ):
            tokens.append(
                {
                    "id": token_id,
                    "text": token if special else text[start:stop],
                    "special": bool(special),
                    "start": None if special else start,
                    "stop": None if special else stop,
                }
            )
        out.append(tokens)
    return out


@router.post("/tokenize")
async def tokenize(request: Request):
    """TEI's /tokenize: each text's tokens {id, text, special, start, stop} (character offsets; none for the
    special tokens)."""
    body = json_object(await read_json(request), {"inputs", "add_special_tokens", "prompt_name"}, "/tokenize")
    tokenizer = _tokenizer(request)
    _with_prompt(request, _EMBED_ROUTE, body)
    inputs = body.get("inputs")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise refuse("inputs: a text or a list of texts is required")
    _count(texts, request, "inputs")
    add = body.get("add_special_tokens", True)
    if not isinstance(add, bool):
        raise refuse("add_special_tokens: Input should be a valid boolean")
    return await asyncio.to_thread(_tokens, tokenizer, texts, add)


@router.post("/decode")
async def decode(request: Request):
    """TEI's /decode: token ids (a list, or a list of lists) back to text, one string per list. Checked and decoded
    in a worker thread, as /tokenize encodes: a body of many ids costs the event loop nothing."""
    body = json_object(await read_json(request), {"ids", "skip_special_tokens"}, "/decode")
    tokenizer = _tokenizer(request)
    ids = body.get("ids")
    batch = ids if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids) else [ids]
    _count(batch if isinstance(ids, list) and ids else [], request, "ids")
    skip = body.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise refuse("skip_special_tokens: Input should be a valid boolean")
    return await asyncio.to_thread(_decode, tokenizer, ids, batch, skip)


def _decode(tokenizer, ids, batch: list, skip: bool) -> list[str]:
    vocab = tokenizer.vocab_size
    for i, row in enumerate(batch):
        if not isinstance(row, list) or not row:
            raise refuse(
                f"ids[{i}]: a non-empty list of token ids is required"
                if len(batch) > 1
                else "ids: a list of token ids is required"
            )
        for j, token in enumerate(row):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab:
                where = f"ids[{i}][{j}]" if len(batch) > 1 or ids is not row else f"ids[{j}]"
                raise refuse(f"{where}: not a token id of this model (0 to {vocab - 1})")
    return [tokenizer.decode(row, skip_special_tokens=skip) for row in batch]


# ---- TEI's and infinity's fields on the routes we share --------------------------------------------------------
@router.post("/embed")
async def embed(request: Request):
    """Our /embed with TEI's nulls for `truncate` and `dimensions` (its defaults, which are ours)."""
    body = await read_json(request)
    if isinstance(body, dict) and any(body.get(k, 0) is None for k in ("truncate", "dimensions")):
        body = dict(body)
        _drop_nulls(body, "truncate", "dimensions")
        return await run(request, "/embed", body)
    validate("/embed", body)  # our route's own refusal
    return await run(request, "/embed", body)


INFINITY_RERANK = {"query", "documents", "return_documents", "raw_scores", "top_n", "model", "truncate"}


@router.post("/rerank")
async def rerank(request: Request):
    """Our (TEI's) /rerank with TEI's `truncation_direction` and nulls, and infinity's body (`documents`)."""
    body = await read_json(request)
    if isinstance(body, dict) and "documents" in body and "texts" not in body:
        return await _infinity_rerank(request, json_object(body, INFINITY_RERANK, "infinity's /rerank"))
    if isinstance(body, dict) and ("truncation_direction" in body or body.get("truncate", 0) is None):
        body = dict(body)
        _cut_at_the_end(body)
        _drop_nulls(body, "truncate")
        return await run(request, "/rerank", body)
    validate("/rerank", body)
    return await run(request, "/rerank", body)


async def _infinity_rerank(request: Request, body: dict):
    top_n = body.pop("top_n", None)
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise refuse("top_n: an integer of at least 1 is required")
    model = body.pop("model", None)
    native = {
        "query": body.get("query"),
        "texts": body.get("documents"),
        "raw_scores": body.get("raw_scores", False),
        "return_text": body.get("return_documents", False),
        **({"truncate": body["truncate"]} if body.get("truncate") is not None else {}),
        **({"model": model} if isinstance(model, str) and model != "default/not-specified" else {}),
    }

    def shape(ranked, info):
        results = ranked[:top_n] if top_n is not None else ranked
        return {
            "object": "rerank",
            "model": model if isinstance(model, str) else info.model_name,
            "results": [
                {"relevance_score": r["score"], "index": r["index"], "document": r.get("text")} for r in results
            ],
            "usage": {"prompt_tokens": info.tokens, "total_tokens": info.tokens},
        }

    return await run(request, "/rerank", native, shape, names={"texts": "documents", "return_text": "return_documents"})


# The engine's threads that tokenise and decode (two for short requests, one for long ones: serving/engine.py).
_CODEC_THREADS = 3


@router.get("/info")
async def info(request: Request):
    """Our /info, with text-embeddings-inference's fields beside ours (huggingface_hub's get_endpoint_info)."""
    from serving.routes.api import info as our_info

    ours = (await our_info(request)).model_dump()
    engine = request.app.state.engine
    task, kind = hf_api.tei_model_type(engine.tasks) or (engine.tasks[0], "embedding")
    unit = engine.unit(task)
    path = Path(unit.spec.path)
    sha = path.name if path.parent.name == "snapshots" else None  # a Hub snapshot's directory is its commit
    if kind == "embedding":
        model_type = {kind: {"pooling": (engine.embedding_info() or {}).get("pooling", "mean")}}
    else:
        # the head's labels, under whichever of the model's tasks has them (a reranker's are its classifier's)
        labels = unit.spec.labels.get(task) or next((v for v in unit.spec.labels.values() if v), {})
        id2label = {str(i): labels[i] for i in sorted(labels)}
        model_type = {kind: {"id2label": id2label, "label2id": {v: int(k) for k, v in id2label.items()}}}
    return {
        **ours,
        "model_id": engine.model_name,
        "model_sha": sha,
        "model_dtype": {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(
            unit.backend.precision, unit.backend.precision
        ),
        "served_model_name": engine.model_name,
        "model_type": model_type,
        "auto_truncate": False,  # a long input is refused unless its request asks to cut it
        "tokenization_workers": _CODEC_THREADS,
        "sha": None,
        "docker_label": None,
    }
