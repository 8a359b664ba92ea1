"""A stand-in bertserve server for the client tests: the HTTP contract (docs/architecture.md, "HTTP API")
(routes, bodies, error JSON, status codes) with deterministic toy answers instead of a model.

It can be told to misbehave: `POST /_fake/faults {"/classify": [{"status": 429, "retry_after": "1"},
{"delay": 2.0}]}` queues one scripted answer per coming request to that path (a `delay` alone
sleeps, then answers normally). An entry with a `body` answers that text as it is, with its
`content_type` and `headers` (a proxy's HTML error page, a cut-off answer, a bad gzip). Every request is logged with its arrival time and batch size
(`GET /_fake/log`) so tests can count attempts and measure waits; `POST /_fake/reset` clears both.

Run: python tests/fake_bertserve_app.py --port 8123 [--api-key KEY] [--max-client-batch-size 4] [--prefix /p]
(`--prefix`: served under that path, as behind a proxy that forwards /p/... to it)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import defaultdict, deque
from typing import Literal, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.routing import Mount

MAX_INPUT_LENGTH = 512  # "tokens": whitespace-separated words here
LABELS = ("negative", "positive")
POSITIVE_WORDS = {"good", "great", "gripping", "beautiful", "love", "best", "fun"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, error_type: str, headers: dict | None = None):
        self.status, self.message, self.error_type, self.headers = status, message, error_type, headers


class ClassifyRequest(BaseModel):
    inputs: Union[str, list[str], list[list[str]]]
    top_k: int = 1
    truncate: bool = False


class NerRequest(BaseModel):
    inputs: Union[str, list[str]]
    aggregation: Literal["simple", "first", "average", "max", "none"] = "simple"
    truncate: bool = False


class EmbedRequest(BaseModel):
    inputs: Union[str, list[str]]
    normalize: bool = True
    truncate: bool = False


def _embed_one(text: str, normalize: bool) -> list[float]:
    """A deterministic 4-number stand-in for an embedding: letter counts, scaled to unit length if asked."""
    vector = [float(sum(c in group for c in text.lower())) + 1.0 for group in ("aeiou", "lmnr", "st", "xyz")]
    norm = sum(v * v for v in vector) ** 0.5
    return [v / norm for v in vector] if normalize else vector


class QARequest(BaseModel):
    question: str
    context: str
    top_k: int = 1
    max_answer_len: int = 30
    doc_stride: int = 128


def _check_length(text: str, truncate: bool) -> None:
    if not truncate and len(text.split()) > MAX_INPUT_LENGTH:
        raise ApiError(422, f"input has {len(text.split())} tokens, the limit is {MAX_INPUT_LENGTH}", "validation")


def _classify_one(text: str, top_k: int) -> list[dict]:
    words = re.findall(r"\w+", text.lower())
    positive = (1 + sum(w in POSITIVE_WORDS for w in words)) / (2 + len(words))
    scores = sorted(zip(LABELS, (1 - positive, positive)), key=lambda p: -p[1])
    return [{"label": label, "score": round(score, 6)} for label, score in scores[:top_k]]


def _ner_one(text: str, aggregation: str) -> list[dict]:
    entities = []
    for index, match in enumerate(re.finditer(r"\w+", text)):
        word = match.group()
        if not word[0].isupper() or match.start() == 0:
            continue
        kind = "LOC" if word.endswith(("ia", "on", "is")) else "PER"
        entity = {"score": 0.9, "word": word, "start": match.start(), "end": match.end()}
        if aggregation == "none":
            entity.update(entity=f"B-{kind}", index=index + 1)  # +1: [CLS] is token 0
        else:
            entity["entity_group"] = kind
        entities.append(entity)
    return entities


def _qa_one(item: QARequest) -> dict | list[dict]:
    question_words = {w.lower() for w in re.findall(r"\w+", item.question)}
    spans = [m for m in re.finditer(r"\w+", item.context) if m.group().lower() not in question_words]
    spans.sort(key=lambda m: (-len(m.group()), m.start()))  # longest unasked word first
    answers = [
        {"answer": m.group(), "score": round(1 / (rank + 2), 6), "start": m.start(), "end": m.end()}
        for rank, m in enumerate(spans[: item.top_k])
    ]
    if not answers:
        answers = [{"answer": "", "score": 0.0, "start": 0, "end": 0}]
    return answers[0] if item.top_k == 1 else answers


def create_app(api_key: str | None = None, max_client_batch_size: int = 4) -> FastAPI:
    app = FastAPI()
    faults: dict[str, deque] = defaultdict(deque)
    log: list[dict] = []

    def check_batch(inputs: list) -> None:
        if not inputs:
            raise ApiError(400, "inputs is empty", "empty")
        if len(inputs) > max_client_batch_size:
            raise ApiError(413, f"{len(inputs)} inputs, the limit is {max_client_batch_size}", "validation")
        for i, text in enumerate(inputs):  # as the real server words it: the index within this request
            if text == "":
                raise ApiError(400, f"inputs[{i}] is empty", "empty")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message, "error_type": exc.error_type}, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": message, "error_type": "validation"}, 422)

    @app.middleware("http")
    async def log_auth_and_faults(request: Request, call_next):
        path = request.url.path
        if path.startswith("/_fake/"):
            return await call_next(request)
        body = await request.body()
        log.append(
            {
                "path": path,
                "time": time.monotonic(),
                "authorization": request.headers.get("authorization"),
                "body": body.decode() or None,
            }
        )
        if faults[path]:
            fault = faults[path].popleft()
            await asyncio.sleep(fault.get("delay", 0))
            if "status" in fault:
                headers = {"Retry-After": str(fault["retry_after"])} if "retry_after" in fault else {}
                headers.update(fault.get("headers", {}))
                if "body" in fault:
                    return Response(fault["body"], fault["status"], headers, media_type=fault.get("content_type"))
                content = {
                    "error": fault.get("error", "scripted failure"),
                    "error_type": fault.get("error_type", "backend"),
                }
                return JSONResponse(content, fault["status"], headers=headers)
        if api_key and path not in ("/health", "/ready", "/metrics"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse({"error": "missing or wrong API key", "error_type": "unauthorized"}, 401)
        return await call_next(request)

    @app.post("/classify")
    async def classify(req: ClassifyRequest):
        if isinstance(req.inputs, str):
            _check_length(req.inputs, req.truncate)
            return _classify_one(req.inputs, req.top_k)
        check_batch(req.inputs)
        texts = [x if isinstance(x, str) else " ".join(x) for x in req.inputs]
        for text in texts:
            _check_length(text, req.truncate)
        return [_classify_one(text, req.top_k) for text in texts]

    @app.post("/ner")
    async def ner(req: NerRequest):
        if isinstance(req.inputs, str):
            _check_length(req.inputs, req.truncate)
            return _ner_one(req.inputs, req.aggregation)
        check_batch(req.inputs)
        for text in req.inputs:
            _check_length(text, req.truncate)
        return [_ner_one(text, req.aggregation) for text in req.inputs]

    @app.post("/embed")
    async def embed(req: EmbedRequest):
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        check_batch(texts)
        for text in texts:
            _check_length(text, req.truncate)
        return [_embed_one(text, req.normalize) for text in texts]

    @app.post("/qa")
    async def qa(req: Union[QARequest, list[QARequest]]):
        if isinstance(req, QARequest):
            return _qa_one(req)
        check_batch(req)
        return [_qa_one(item) for item in req]

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        return {"status": "ready"}

    @app.get("/info")
    async def info():
        return {
            "model": "fake-bert",
            "tasks": ["classify", "ner", "qa"],
            "backend": "fake",
            "precision": "fp32",
            "max_batch_requests": 32,
            "max_batch_tokens": 16384,
            "max_input_length": MAX_INPUT_LENGTH,
            "max_client_batch_size": max_client_batch_size,
            "version": "0.0.0-fake",
            "labels": list(LABELS),
        }

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse("bertserve_queue_depth 0\n")

    @app.post("/_fake/faults")
    async def add_faults(script: dict[str, list[dict]]):
        for path, entries in script.items():
            faults[path].extend(entries)
        return {"queued": {path: len(q) for path, q in faults.items()}}

    @app.post("/_fake/reset")
    async def reset():
        faults.clear()
        log.clear()
        return {"status": "reset"}

    @app.get("/_fake/log")
    async def get_log():
        return log

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key")
    parser.add_argument("--max-client-batch-size", type=int, default=4)
    parser.add_argument("--prefix", default="")
    args = parser.parse_args()
    app = create_app(args.api_key, args.max_client_batch_size)
    if args.prefix.strip("/"):
        app = Starlette(routes=[Mount("/" + args.prefix.strip("/"), app=app)])
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
