"""Served /classify answers against transformers' text-classification pipeline on the same weights.

    python -m evals.pipeline_parity --ckpt runs/sst2/best [--artifact runs/onnx ...] [--limit N] [--json OUT]

Serves the checkpoint (torch backend) and each exported artifact (onnxruntime) in turn with `python -m serving`,
sends the SST-2 dev sentences to /classify with every label's score, and compares with
`transformers.pipeline("text-classification", model=CKPT, top_k=None)`: the share of top labels equal to the
pipeline's, the largest score difference, and each side's accuracy against the dev labels (gold label i is the
i-th of config.json's id2label). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.common import REPO, machine, print_table, sst2_sample, write_json
from bench.server_bench import free_port, start


def served_scores(model: str, texts: list[str], labels: list[str], chunk: int) -> tuple[list[dict], dict]:
    """{label: score} per text from a server on `model`, and the server's /info."""
    import httpx

    port = free_port()
    proc = start([sys.executable, "-m", "serving", "--model", model, "--port", str(port)], port)
    url = f"http://127.0.0.1:{port}"
    try:
        info = httpx.get(url + "/info", timeout=30).json()
        out = []
        for i in range(0, len(texts), chunk):
            body = {"inputs": texts[i : i + chunk], "top_k": len(labels)}
            response = httpx.post(url + "/classify", json=body, timeout=600)
            response.raise_for_status()
            out += [{a["label"]: a["score"] for a in answer} for answer in response.json()]
        return out, info
    finally:
        proc.terminate()
        proc.wait(30)


def compare(ours: list[dict], theirs: list[dict], gold: list[int], labels: list[str]) -> dict:
    top = [max(scores, key=scores.get) for scores in ours]
    reference = [max(scores, key=scores.get) for scores in theirs]
    return {
        "examples": len(ours),
        "top_label_agreement": sum(a == b for a, b in zip(top, reference)) / len(ours),
        "max_score_diff": max(abs(a[label] - b[label]) for a, b in zip(ours, theirs) for label in labels),
        "accuracy": sum(t == labels[g] for t, g in zip(top, gold)) / len(ours),
        "pipeline_accuracy": sum(t == labels[g] for t, g in zip(reference, gold)) / len(ours),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", required=True, help="a sequence-classification checkpoint directory")
    p.add_argument("--artifact", action="append", default=[], help="an export of it to serve too (repeatable)")
    p.add_argument("--limit", type=int, default=872, help="SST-2 dev sentences (872: all)")
    p.add_argument("--chunk", type=int, default=32, help="sentences per request")
    p.add_argument("--json", default=str(REPO / "evals" / "results" / "pipeline_parity.json"))
    args = p.parse_args(argv)

    import transformers

    config = json.loads((Path(args.ckpt) / "config.json").read_text())
    labels = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    sample = sst2_sample(args.limit)
    texts, gold = [s for s, _ in sample], [g for _, g in sample]
    t0 = time.perf_counter()
    pipe = transformers.pipeline("text-classification", model=args.ckpt, top_k=None, device="cpu")
    theirs = [{a["label"]: a["score"] for a in answer} for answer in pipe(texts, batch_size=args.chunk)]
    print(f"transformers pipeline: {len(texts)} sentences in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for model in [args.ckpt, *args.artifact]:
        ours, info = served_scores(model, texts, labels, args.chunk)
        row = {"served": model, "backend": info.get("backend"), "precision": info.get("precision")}
        rows.append({**row, **compare(ours, theirs, gold, labels)})
        print(json.dumps(rows[-1]), flush=True)
    print()
    print_table(
        rows,
        [
            ("served", "served"),
            ("backend", "backend"),
            ("precision", "precision"),
            ("top_label_agreement", "top label = pipeline's"),
            ("max_score_diff", "max |score diff|"),
            ("accuracy", "accuracy"),
            ("pipeline_accuracy", "pipeline accuracy"),
        ],
    )
    path = write_json(args.json, {"machine": machine(), "ckpt": args.ckpt, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
