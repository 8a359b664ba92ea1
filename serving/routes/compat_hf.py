"""The Hugging Face Inference API (`{"inputs", "parameters", "options"}`, as `huggingface_hub.InferenceClient`
sends it to an Inference Endpoint's URL) and text-embeddings-inference's root route.

- `POST /`: the server's task, as an Inference Endpoint answers at its root: the body's own task where its shape
  says (QA's and sentence-similarity's inputs, zero-shot's candidate_labels, TEI's embed fields), else the first
  served task's (bert/tasks/hf_api.py `choose`).
- `POST /hf/<pipeline-tag>`: one task of a server of several, so `InferenceClient(model=URL + "/hf/fill-mask")`
  reaches it whatever else the server serves.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from bert.tasks import hf_api
from serving.errors import NotFound, refusal
from serving.routes.compat_run import read_json, run, served_tasks

# Out of the OpenAPI schema: that documents our API; docs/compat.md documents these.
router = APIRouter(tags=["compatibility"], include_in_schema=False)


async def answer(request: Request, pipeline: hf_api.Pipeline, body):
    """An Inference API body of `pipeline`, answered by our route and reshaped as the Inference API answers."""
    try:
        native, params, names = hf_api.translate(pipeline, body)
    except ValueError as e:
        raise refusal(e) from None
    if isinstance(body.get("model"), str) and isinstance(native, dict):
        native["model"] = body["model"]
    inputs = body["inputs"]
    return await run(
        request, pipeline.route, native, lambda content, info: pipeline.to_hf(content, inputs, params), names=names
    )


@router.post("/", summary="The Hugging Face Inference API at the server's root (TEI's and Inference Endpoints')")
async def hf_root(request: Request):
    """The body `{"inputs", "parameters", "options"}` of the served task: the body's own task where its shape says,
    else the first served task's. Answers in the Inference API's shapes (docs/compat.md)."""
    body = await read_json(request)
    try:
        _, pipeline = hf_api.choose(body, served_tasks(request))
    except LookupError as e:
        raise NotFound(str(e)) from None
    return await answer(request, pipeline, body)


@router.post("/hf/{tag}", summary="The Hugging Face Inference API for one pipeline tag")
async def hf_pipeline(tag: str, request: Request):
    """The Inference API body of one pipeline (text-classification, token-classification, question-answering,
    feature-extraction, sentence-similarity, fill-mask, zero-shot-classification), on a server that serves its
    task; `InferenceClient(model=URL + "/hf/<tag>")`."""
    tasks = served_tasks(request)
    chosen = hf_api.by_tag(tag, tasks)
    if chosen is None:
        served = ", ".join(p.tag for _, p in hf_api.pipelines(tasks)) or "none"
        raise NotFound(f"pipeline {tag!r} is not served here; the served pipelines: {served}")
    body = await read_json(request)
    return await answer(request, chosen[1], body)
