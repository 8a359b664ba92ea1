"""Held-out quality of a served model, measured through its HTTP endpoints with the Python SDK.

    python -m evals.endpoint_eval                         # starts `python -m serving` (the demo model)
    python -m evals.endpoint_eval --serving-args "--model runs/demo/best --backend torch"
    python -m evals.endpoint_eval --url http://127.0.0.1:8000 --tasks qa

What goes over the wire is what a user sends, so the figures include the server's own text handling:
- classify: the SST-2 dev sentences to /classify; accuracy against the dev labels (gold label i is
  the i-th name of --classify-labels: 0 = negative, 1 = positive as the demo model names them).
- ner: each CoNLL-2003 valid sentence as one string (its words joined by spaces) to /ner with
  aggregation "first"; an entity's character span marks the words it overlaps (B- on the first, I- on
  the rest), scored with conlleval's entity-level F1 against the gold tags.
- qa: every question of the held-out SQuAD articles (the last --heldout-articles of the train parts,
  which training never sees) with its context to /qa; EM/F1 with the official normalisation.

Prints a table and writes JSON (default evals/results/endpoint_eval.json).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from bench.common import DATA_DIR, REPO, machine, print_table, write_json
from bench.server_bench import free_port, start
from evals.common import heldout_squad_articles

TASKS = ("classify", "ner", "qa")


def word_spans(words: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """The sentence as one string (words joined by single spaces) and each word's character span."""
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return " ".join(words), spans


def tags_from_entities(spans: list[tuple[int, int]], entities) -> list[str]:
    """IOB2 word tags from character-span entities: a word takes an entity's type when they overlap."""
    tags = ["O"] * len(spans)
    for e in sorted(entities, key=lambda e: e.start):
        hit = [i for i, (s, t) in enumerate(spans) if s < e.end and e.start < t and tags[i] == "O"]
        for k, i in enumerate(hit):
            tags[i] = ("B-" if k == 0 else "I-") + e.label
    return tags


def eval_classify(client, names: list[str], chunk: int, limit: int = 0) -> dict:
    from training import metrics as M
    from training.data.readers import read_tsv

    examples = read_tsv(DATA_DIR / "SST-2" / "dev.tsv")[: limit or None]
    predictions = []
    for i in range(0, len(examples), chunk):
        for top in client.classify([e.text for e in examples[i : i + chunk]], truncate=True):
            if top[0].label not in names:
                raise SystemExit(f"the server answered label {top[0].label!r}, not one of --classify-labels {names}")
            predictions.append(names.index(top[0].label))
    out = M.classification_metrics(predictions, [int(e.label) for e in examples])
    out["examples"] = len(examples)
    return out


def eval_ner(client, chunk: int, limit: int = 0) -> dict:
    from training import metrics as M
    from training.data.readers import iob1_to_iob2, read_conll

    sentences = read_conll(DATA_DIR / "conll2003" / "valid.txt")[: limit or None]
    gold, predicted = [], []
    for i in range(0, len(sentences), chunk):
        part = sentences[i : i + chunk]
        texts, spans = zip(*(word_spans(s.words) for s in part))
        for s, sp, entities in zip(part, spans, client.ner(list(texts), aggregation="first", truncate=True)):
            gold.append(iob1_to_iob2(s.tags))
            predicted.append(tags_from_entities(sp, entities))
    out = M.conlleval(gold, predicted)
    out["sentences"] = len(sentences)
    return out


def eval_qa(client, heldout_articles: int, chunk: int, doc_stride: int, max_answer_len: int, limit: int = 0) -> dict:
    from training import metrics as M
    from training.data.readers import squad_examples

    examples = squad_examples(heldout_squad_articles(heldout_articles))[: limit or None]
    predictions = {}
    for i in range(0, len(examples), chunk):
        part = examples[i : i + chunk]
        answers = client.qa(
            [{"question": e.question, "context": e.context} for e in part],
            doc_stride=doc_stride,
            max_answer_len=max_answer_len,
        )
        for e, a in zip(part, answers):
            predictions[e.id] = a.answer
    out = M.squad_metrics(predictions, {e.id: [a["text"] for a in e.answers] for e in examples})
    out["articles"] = heldout_articles
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="", help="a running server (default: start `python -m serving` here)")
    p.add_argument("--serving-args", default="", help="extra arguments for `python -m serving`")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated subset of classify,ner,qa")
    p.add_argument(
        "--classify-labels",
        default="negative,positive",
        help="the served label name of each SST-2 label value, in order (0,1)",
    )
    p.add_argument("--heldout-articles", type=int, default=10, help="qa: the last N SQuAD train articles")
    p.add_argument("--doc-stride", type=int, default=128, help="qa: window overlap sent with each request")
    p.add_argument("--max-answer-len", type=int, default=30)
    p.add_argument("--limit", type=int, default=0, help="only the first N inputs of each task (quick checks)")
    p.add_argument("--chunk", type=int, default=32, help="inputs per request")
    p.add_argument("--json", default=str(REPO / "evals" / "results" / "endpoint_eval.json"))
    args = p.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    if unknown := set(tasks) - set(TASKS):
        p.error(f"unknown tasks {sorted(unknown)}; choose from {', '.join(TASKS)}")

    from bertserve_client import Client

    proc, url = None, args.url
    if not url:
        port = free_port()
        proc = start([sys.executable, "-m", "serving", "--port", str(port), *shlex.split(args.serving_args)], port)
        url = f"http://127.0.0.1:{port}"
    rows, results = [], {}
    try:
        with Client(url, timeout=600) as client:
            info = client.info()
            print(f"server at {url}: {info.model} ({info.backend}, {info.precision}), tasks {info.tasks}", flush=True)
            for task in tasks:
                t0 = time.perf_counter()
                if task == "classify":
                    r = eval_classify(client, args.classify_labels.split(","), args.chunk, args.limit)
                    main_metric, value, n = "accuracy %", 100 * r["accuracy"], r["examples"]
                elif task == "ner":
                    r = eval_ner(client, args.chunk, args.limit)
                    main_metric, value, n = "entity F1", r["f1"], r["sentences"]
                else:
                    r = eval_qa(
                        client, args.heldout_articles, args.chunk, args.doc_stride, args.max_answer_len, args.limit
                    )
                    main_metric, value, n = "F1 (EM)", r["f1"], r["total"]
                r["seconds"] = time.perf_counter() - t0
                results[task] = r
                rows.append(
                    {
                        "task": task,
                        "metric": main_metric,
                        "value": round(value, 2),
                        "extra": f"EM {r['exact_match']:.2f}" if task == "qa" else "",
                        "inputs": n,
                        "seconds": round(r["seconds"], 1),
                    }
                )
                print(f"{task}: {main_metric} {value:.2f} on {n} inputs in {r['seconds']:.0f} s", flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print()
    print_table(
        rows,
        [
            ("task", "task"),
            ("metric", "metric"),
            ("value", "value"),
            ("extra", ""),
            ("inputs", "inputs"),
            ("seconds", "s"),
        ],
    )
    path = write_json(
        args.json,
        {
            "url": url if args.url else "started here",
            "serving_args": args.serving_args,
            "server_info": info.model_dump(),
            "machine": machine(),
            "results": results,
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
