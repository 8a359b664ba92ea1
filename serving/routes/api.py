"""The HTTP routes: validate, hand to the engine, await. No model work happens here."""
from __future__ import annotations

import asyncio
import math
from typing import Union

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from serving.batcher import Ticket
from serving.engine import Timing, check_batch, check_texts, version
from serving.errors import ClientClosed, Unavailable, ValidationFailed
from serving.routes.schemas import (ClassifyRequest, ClassifyResponse, EmbedRequest, EmbedResponse, ErrorBody, Info,
                                    NerRequest, NerResponse, OpenAIEmbeddingRequest, OpenAIEmbeddingResponse,
                                    QARequest, QAResponse, Status, openai_embedding_response)


class AnswerResponse(Response):
    """An answer as compact JSON, rendered by orjson: what starlette's JSONResponse writes (byte for byte
    but for an exponent's spelling, 1e-7 for 1e-07; every float round-trips exactly), 10-25x faster (a
    384-float /embed vector: 288 -> 11 us; at 32 clients /embed spent 0.38 ms of the event loop's 1.41 ms
    per request in json.dumps). A number that is not finite is refused as starlette refuses it (a 500),
    never written as null."""
    media_type = "application/json"

    def render(self, content) -> bytes:
        body = orjson.dumps(content)
        if b"null" in body and _has_nan(content):
            raise ValueError("Out of range float values are not JSON compliant")
        return body


def _has_nan(content) -> bool:
    if isinstance(content, float):
        return not math.isfinite(content)
    if isinstance(content, dict):
        return any(_has_nan(v) for v in content.values())
    if isinstance(content, (list, tuple)):
        return any(_has_nan(v) for v in content)
    return False

router = APIRouter()
_ERRORS = {
    400: {"model": ErrorBody, "description": "empty inputs"},
    401: {"model": ErrorBody, "description": "missing or wrong API key"},
    404: {"model": ErrorBody, "description": "the server does not serve this task"},
    408: {"model": ErrorBody, "description": "the body did not arrive within body_timeout_s"},
    413: {"model": ErrorBody, "description": "too many inputs or body too large"},
    422: {"model": ErrorBody, "description": "invalid request (the field is named) or input too long"},
    429: {"model": ErrorBody, "description": "overloaded; see Retry-After"},
    500: {"model": ErrorBody, "description": "inference failed"},
    503: {"model": ErrorBody, "description": "warming up or shutting down"},
}


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _answer(request: Request, work) -> Response:
    """Run `work(ticket, timing)`; if the caller hangs up first, drop its queued sequences; if the server
    gives up on admitted work (shutdown past its timeout), answer a JSON 503 instead of being cut off.

    The work runs in the route's own task, which a disconnect or the abort cancels: one task per request
    beside it (the disconnect watcher) instead of three (work, watcher, abort waiter) and an asyncio.wait."""
    ticket, timing = Ticket(), Timing()
    request.state.timing = timing  # for the access log (serving/middleware.py)
    route = asyncio.current_task()
    stopped: list = []  # why the route was stopped (a response to give instead); [None] once the work is done

    def stop(refusal) -> None:
        if not stopped:
            stopped.append(refusal)
            ticket.cancelled = True
            route.cancel()

    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    watcher.add_done_callback(lambda task: task.cancelled() or stop(ClientClosed("client closed the request")))
    forget_abort = request.app.state.server.on_abort(lambda: stop(Unavailable(
        "the server is shutting down and this request did not finish in time (shutdown_timeout_s); "
        "retry on another replica")))
    try:
        content = await work(ticket, timing)
    except asyncio.CancelledError:
        if not stopped or route.uncancel() > 0:
            raise  # cancelled from outside, not by stop()
        return stopped[0].response()  # a ClientClosed response nobody reads, or the 503
    finally:
        stopped.append(None)  # a stop() from now on does nothing
        watcher.cancel()
        forget_abort()
    return AnswerResponse(content, headers={
        "x-queue-time-ms": f"{timing.queue_s * 1000:.2f}",
        "x-inference-time-ms": f"{timing.inference_s * 1000:.2f}",
        **({"x-verified-items": str(timing.verified)} if timing.verified else {}),
    })


async def _per_text(request: Request, task: str, inputs, options: dict, *, keep_list: bool = False):
    """The routes whose `inputs` is a text or a list of them: one answer per text (the answer itself for a
    single text, unless `keep_list`)."""
    engine, settings = request.app.state.engine, request.app.state.settings
    single = isinstance(inputs, str)
    texts = [inputs] if single else inputs
    check_batch(texts, settings.max_client_batch_size)
    check_texts(texts, "inputs" if single else "inputs[{}]")

    async def work(ticket, timing):
        answers = await engine.infer(task, texts, options, ticket=ticket, timing=timing)
        return answers[0] if single and not keep_list else answers

    return await _answer(request, work)


@router.post("/classify", response_model=ClassifyResponse, responses=_ERRORS, tags=["inference"],
             summary="Classify texts or text pairs")
async def classify(body: ClassifyRequest, request: Request):
    """`inputs` a string: a list of {label, score}, best first. A list: one such list per input."""
    return await _per_text(request, "classify", body.inputs, body.model_dump(exclude={"inputs"}))


@router.post("/ner", response_model=NerResponse, responses=_ERRORS, tags=["inference"],
             summary="Find named entities")
async def ner(body: NerRequest, request: Request):
    """`inputs` a string: a list of entities {entity_group, score, word, start, end} (character offsets; `word`
    as written). A list: one list of entities per input. With aggregation "none": per token
    {entity, score, index, word, start, end}."""
    return await _per_text(request, "ner", body.inputs, body.model_dump(exclude={"inputs"}))


@router.post("/qa", response_model=QAResponse, responses=_ERRORS, tags=["inference"],
             summary="Answer questions from a context")
async def qa(body: Union[QARequest, list[QARequest]], request: Request):
    """One {question, context}: an answer {answer, score, start, end} (a list of answers when top_k > 1).
    A list of them: one entry per item, each as above. Long contexts are windowed (doc_stride), never cut."""
    engine, settings = request.app.state.engine, request.app.state.settings
    single = isinstance(body, QARequest)
    items = [body] if single else body
    check_batch(items, settings.max_client_batch_size, field="body")
    for name in ("question", "context"):
        check_texts([getattr(item, name) for item in items], name if single else "[{}]." + name)

    async def work(ticket, timing):
        answers = await engine.infer("qa", [item.model_dump() for item in items], {}, ticket=ticket, timing=timing)
        shaped = [a[0] if item.top_k == 1 else a for item, a in zip(items, answers)]
        return shaped[0] if single else shaped

    return await _answer(request, work)


@router.post("/embed", response_model=EmbedResponse, responses=_ERRORS, tags=["inference"],
             summary="Embed texts (text-embeddings-inference's shape)")
async def embed(body: EmbedRequest, request: Request):
    """One vector per input, always a list of vectors (as text-embeddings-inference answers), pooled as the
    model's sentence-transformers configuration says and scaled to unit length unless `normalize` is false."""
    return await _per_text(request, "embed", body.inputs, body.model_dump(exclude={"inputs"}), keep_list=True)


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse, responses=_ERRORS, tags=["inference"],
             summary="Embed texts (OpenAI's shape)")
async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request):
    """OpenAI's embeddings API: `input` a text or a list of texts; vectors scaled to unit length, as floats or
    as base64 little-endian float32 (`encoding_format`); `usage` counts the model's input tokens."""
    engine, settings = request.app.state.engine, request.app.state.settings
    texts = [body.input] if isinstance(body.input, str) else body.input
    check_batch(texts, settings.max_client_batch_size, field="input")
    check_texts(texts, "input" if isinstance(body.input, str) else "input[{}]")
    if body.dimensions is not None and body.dimensions != engine.embedding_dimensions:
        raise ValidationFailed(f"dimensions: this model's embeddings have {engine.embedding_dimensions} "
                               "dimensions and cannot be shortened")

    async def work(ticket, timing):
        vectors = await engine.infer("embed", texts, {"normalize": True}, ticket=ticket, timing=timing)
        return openai_embedding_response(vectors, body.encoding_format, model=body.model or engine.model_name,
                                         tokens=timing.tokens)

    return await _answer(request, work)


@router.get("/health", response_model=Status, tags=["status"], responses={503: {"model": ErrorBody}})
async def health(request: Request):
    """Liveness: the process is up and its event loop answers (503 only when the model failed to start)."""
    state = request.app.state.server
    if state.failed:
        return state.unavailable().response()
    return {"status": "ok"}


@router.get("/ready", response_model=Status, tags=["status"], responses={503: {"model": ErrorBody}})
async def ready(request: Request):
    """Readiness: the model is loaded and warmed up, and the server is not shutting down."""
    refusal = request.app.state.server.unavailable()
    return refusal.response() if refusal is not None else {"status": "ready"}


@router.get("/info", response_model=Info, tags=["status"], responses={401: {"model": ErrorBody}})
async def info(request: Request):
    """The model, its tasks and labels, the backend and the batching limits."""
    engine, settings = request.app.state.engine, request.app.state.settings
    return Info(model=engine.model_name, tasks=engine.tasks, backend=engine.backend_name,
                precision=engine.precision, device=settings.device,
                max_batch_requests=min(engine.max_batch_requests(u) for u in engine.units),
                max_batch_tokens=settings.max_batch_tokens, max_input_length=engine.max_input_length,
                max_client_batch_size=settings.max_client_batch_size,
                max_concurrent_requests=settings.max_concurrent_requests, version=version(),
                labels=engine.labels(), embedding=engine.embedding_info(), verify=engine.verify_info())


@router.get("/metrics", tags=["status"], response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
async def metrics(request: Request):
    """Prometheus metrics."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


__all__ = ["router"]
