"""The server a user would write today: FastAPI + a transformers pipeline, one request at a time.

    python -m bench.baseline_server --ckpt DIR --task classify|ner|qa --port 8100

Same request and response shapes as bertserve's /classify, /ner and /qa for single inputs, so the
load generator drives both alike. The handler is `async def` calling the pipeline directly, the
way the transformers and FastAPI quickstarts combine: each request runs alone, on the event loop.
"""
from __future__ import annotations

import argparse

import torch
import uvicorn
from fastapi import FastAPI
from transformers import pipeline

PIPELINES = {"classify": "text-classification", "ner": "token-classification", "qa": "question-answering"}


def create_app(ckpt: str, task: str, threads: int) -> FastAPI:
    torch.set_num_threads(threads)
    pipe = pipeline(PIPELINES[task], model=ckpt, tokenizer=ckpt, device="cpu")
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post(f"/{task}")
    async def predict(body: dict):
        if task == "qa":
            return pipe(question=body["question"], context=body["context"])
        if task == "ner":
            return [dict(e, score=float(e["score"])) for e in pipe(body["inputs"], aggregation_strategy="simple")]
        return pipe(body["inputs"])

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint directory transformers can load")
    p.add_argument("--task", choices=sorted(PIPELINES), default="classify")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    uvicorn.run(create_app(args.ckpt, args.task, args.threads), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
