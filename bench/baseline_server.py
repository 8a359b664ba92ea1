"""The server a user would write today: FastAPI + a transformers pipeline, one request at a time.

    python -m bench.baseline_server --ckpt DIR --task classify|ner|qa --port 8100

Same request and response shapes as bertserve's /classify, /ner and /qa for single inputs, so the
load generator drives both alike. The handler is `async def` calling the pipeline directly, the
way the transformers and FastAPI quickstarts combine: each request runs alone, on the event loop.

A bertserve multi-task checkpoint (the demo model) is served as the transformers model of the one
task asked for: the same encoder weights plus that task's head, in fp32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import uvicorn
from fastapi import FastAPI
from transformers import AutoTokenizer, pipeline
from transformers.pipelines import get_supported_tasks

PIPELINES = {"classify": "text-classification", "ner": "token-classification", "qa": "question-answering"}


HEADS = {"classify": "classifier", "ner": "token_classifier", "qa": "qa_outputs"}  # bertserve multi-task names


def task_model(ckpt: str, task: str):
    """The transformers model for `task`: loaded as it is, or cut from a multi-task checkpoint."""
    from safetensors.torch import load_file
    from transformers import (
        AutoConfig,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    classes = {
        "classify": AutoModelForSequenceClassification,
        "ner": AutoModelForTokenClassification,
        "qa": AutoModelForQuestionAnswering,
    }
    config = json.loads((Path(ckpt) / "config.json").read_text())
    if "task_labels" not in config:
        return classes[task].from_pretrained(ckpt, dtype=torch.float32)
    labels = config["task_labels"].get(task)
    if labels is None:
        raise SystemExit(f"{ckpt} has no {task} head (it has {', '.join(config['task_labels'])})")
    kwargs = (
        {} if task == "qa" else {"id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}
    )
    model = classes[task].from_config(AutoConfig.from_pretrained(ckpt, **kwargs), dtype=torch.float32)
    index = Path(ckpt) / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    state = {}
    for name in files:
        state.update(load_file(str(Path(ckpt) / name)))
    own = HEADS[task] + "."
    target = {"classify": "classifier.", "ner": "classifier.", "qa": "qa_outputs."}[task]
    state = {
        (target + k[len(own) :] if k.startswith(own) else k): v.float()
        for k, v in state.items()
        if k.startswith(("bert.", own))
    }
    expected = model.state_dict()
    state = {k: v for k, v in state.items() if k in expected or not k.startswith("bert.pooler.")}  # ner/qa: no pooler
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "position_ids" not in k]:
        raise SystemExit(f"cannot cut the {task} model from {ckpt}: missing {missing}, unexpected {unexpected}")
    return model.eval()


class QuestionAnswering:
    """What the question-answering pipeline does, written as its users wrote it before there was one (and where a
    transformers release ships none: 5.17 has no such task): the context cut into 384-token windows overlapping by
    128 tokens, one forward over them, the best span of at most 30 tokens inside the context by start + end logit,
    its score the product of the two softmax probabilities."""

    def __init__(self, model, ckpt: str, device: str):
        self.model = model.to(device)
        self.tokenizer = AutoTokenizer.from_pretrained(ckpt)
        self.device = device

    def __call__(self, question: str, context: str, max_length=384, stride=128, max_answer=30) -> dict:
        enc = self.tokenizer(
            question,
            context,
            truncation="only_second",
            max_length=max_length,
            stride=stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding=True,
            return_tensors="pt",
        )
        offsets = enc.pop("offset_mapping")
        enc.pop("overflow_to_sample_mapping", None)
        with torch.inference_mode():
            out = self.model(**{k: v.to(self.device) for k, v in enc.items()})
        starts = out.start_logits.float().softmax(-1).cpu()
        ends = out.end_logits.float().softmax(-1).cpu()
        best = (0.0, 0, 0)
        for w in range(starts.shape[0]):
            in_context = torch.tensor([s == 1 for s in enc.sequence_ids(w)])
            pairs = starts[w][:, None] * ends[w][None, :]
            ok = in_context[:, None] & in_context[None, :]
            ok &= torch.ones_like(ok).triu() & ~torch.ones_like(ok).triu(max_answer)
            pairs = torch.where(ok, pairs, torch.zeros_like(pairs))
            flat = int(pairs.argmax())
            score, i, j = float(pairs.view(-1)[flat]), flat // pairs.shape[1], flat % pairs.shape[1]
            if score > best[0]:
                best = (score, int(offsets[w][i][0]), int(offsets[w][j][1]))
        score, start, end = best
        return {"score": score, "start": start, "end": end, "answer": context[start:end]}


def create_app(
    ckpt: str, task: str, threads: int | None = None, device: str = "cpu", dtype: torch.dtype | None = None
) -> FastAPI:
    """The server: on the CPU with `threads`, or (bench/gpu/baseline_gpu.py) on `device` in `dtype`."""
    if threads:
        torch.set_num_threads(threads)
    model = task_model(ckpt, task)
    model = model.to(dtype) if dtype else model
    if task == "qa" and PIPELINES[task] not in get_supported_tasks():
        pipe = QuestionAnswering(model, ckpt, device)
    else:
        pipe = pipeline(PIPELINES[task], model=model, tokenizer=ckpt, device=device)
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
