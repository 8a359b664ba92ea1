"""Are the peers' answers the same model's answers? Each peer's labels (classify) or vectors (embed) on
the benchmark's sentences, against an fp32 reference computed here with transformers, in-process:

- classify: the encoder + classify head cut from the checkpoint (bench/baseline_server.task_model),
  fp32; labels agree in % of sentences, and accuracy against SST-2's gold labels;
- embed: the sentence-transformers recipe (mean of the last hidden states over real tokens, L2
  normalised) on transformers' fp32 BertModel; cosine similarity per sentence, mean and minimum;
- rerank: transformers' AutoModelForSequenceClassification (one logit) on every (query, text) pair, fp32; the
  best text agrees in % of queries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers import Adapter


def reference_answers(task: str, model: Path, sentences: list, batch: int = 32) -> tuple[list, list[str]]:
    """(answers, label names): fp32 labels, unit vectors or best text indices for the work items `sentences`;
    label names in id order (classify)."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if task == "rerank":
        net = AutoModelForSequenceClassification.from_pretrained(model, dtype=torch.float32).eval()
        best = []
        with torch.inference_mode():
            for item in sentences:
                enc = tokenizer(
                    [item["query"]] * len(item["texts"]),
                    item["texts"],
                    padding=True,
                    truncation=True,
                    max_length=512,
                    return_tensors="pt",
                )
                best.append(int(net(**enc).logits[:, 0].argmax()))
        return best, []
    if task == "classify":
        from bench.baseline_server import task_model

        net = task_model(str(model), "classify")
        names = [net.config.id2label[i] for i in range(net.config.num_labels)]
    else:
        net, names = AutoModel.from_pretrained(model, dtype=torch.float32).eval(), []
    out: list = []
    with torch.inference_mode():
        for i in range(0, len(sentences), batch):
            enc = tokenizer(
                sentences[i : i + batch], padding=True, truncation=True, max_length=512, return_tensors="pt"
            )
            if task == "classify":
                out += [names[k] for k in net(**enc).logits.argmax(-1).tolist()]
            else:
                hidden = net(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out += torch.nn.functional.normalize(pooled, dim=-1).tolist()
    return out, names


def decode(adapter: Adapter, responses: list[tuple[int, bytes]]) -> list[Any]:
    """Each response's answer through the peer's adapter; None for a failed request or an unreadable answer."""
    answers = []
    for status, payload in responses:
        try:
            answers.append(adapter.answer(json.loads(payload)) if status == 200 else None)
        except (ValueError, KeyError, IndexError, TypeError):
            answers.append(None)
    return answers


def score(task: str, answers: list, reference: list, gold: list[str] | None = None) -> dict:
    """Agreement with the reference (and accuracy against gold labels when given); `failed` counts
    the sentences with no answer, which count as disagreements."""
    n = len(reference)
    failed = sum(a is None for a in answers)
    if task == "rerank":
        return {"n": n, "failed": failed, "agree_pct": 100 * sum(a == r for a, r in zip(answers, reference)) / n}
    if task == "classify":
        out = {"n": n, "failed": failed, "agree_pct": 100 * sum(a == r for a, r in zip(answers, reference)) / n}
        if gold is not None:
            out["accuracy_pct"] = 100 * sum(a == g for a, g in zip(answers, gold)) / n
        return out
    cosines = []
    for a, r in zip(answers, reference):
        if a is None:
            cosines.append(0.0)
            continue
        a, r = np.asarray(a, dtype=np.float64), np.asarray(r, dtype=np.float64)
        cosines.append(float(a @ r / (np.linalg.norm(a) * np.linalg.norm(r) + 1e-12)))
    return {"n": n, "failed": failed, "cosine_mean": float(np.mean(cosines)), "cosine_min": float(np.min(cosines))}
