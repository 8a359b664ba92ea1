"""Agreement of an export with the fp32 export of the same checkpoint, on held-out data (docs/export.md, "Default
exports on held-out data").

    python -m evals.int8_agreement --fp32 ARTIFACT --candidate ARTIFACT [ARTIFACT ...] [--limit N] [--time]
                                   [--json OUT]

Per graph output, on data the calibration never saw:
- classify: SST-2 dev sentences, the share of labels equal to fp32's;
- ner: CoNLL-2003 valid sentences, entity spans (BIO over the real tokens) found by both over those found by either;
- qa: questions of the 10 held-out SQuAD train articles (the demo model's), the share of best answer spans
  (start <= end, at most 30 tokens, in the context) equal to fp32's;
- embeddings: SST-2 dev sentences, the share with cosine >= 0.99, and the lowest cosine;
- rerank: SQuAD held-out questions against their paragraph's sentences, and against 20 sentences of their article
  (their paragraph's first, as bench.peers' /rerank requests), the share with fp32's top sentence.

--time adds each graph's model-level time (fp32's too): seconds per batch of SST-2 dev sentences at batch 1, 8 and
32, the median of passes taken in turn over the graphs, so a busy moment of a shared machine falls on each alike.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from bert.tasks.ner import read_conll
from bert.tasks.qa import read_squad_articles, split_heldout
from bert.tasks.rerank import article_requests, sentence_spans
from export import bf16

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
KEYS = ("input_ids", "attention_mask", "token_type_ids")
MAX_ANSWER = 30


def sst2(data: Path, limit: int | None) -> list[str]:
    lines = (data / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines][:limit]


def conll(data: Path, limit: int | None) -> list[str]:
    return [" ".join(sentence.words) for sentence in read_conll(data / "conll2003" / "valid.txt")][:limit]


def heldout_articles(data: Path) -> list[dict]:
    """The 10 SQuAD train articles the demo model held out."""
    articles = read_squad_articles(sorted((data / "squad-train").glob("train-v1.1.part-*.json.gz")))
    return split_heldout(articles, 10)[1]


def question_contexts(heldout: list[dict]) -> list[tuple[str, str]]:
    return [(qa["question"], p["context"]) for article in heldout for p in article["paragraphs"] for qa in p["qas"]]


def squad_heldout(data: Path, limit: int | None) -> list[tuple[str, str]]:
    return question_contexts(heldout_articles(data))[:limit]


def run(session, names, batches):
    outputs = {n: [] for n in names}
    for batch in batches:
        for name, value in zip(names, session.run(names, batch)):
            outputs[name].append(value)
    return outputs


def batched(tokenizer, first, second=None, size=32, max_length=384):
    batches = []
    for start in range(0, len(first), size):
        if second is None:
            enc = tokenizer(first[start : start + size], max_length=max_length, truncation=True)
        else:
            enc = tokenizer(
                first[start : start + size],
                second[start : start + size],
                max_length=max_length,
                truncation="only_second",
            )
        batches.append({k: np.asarray(enc[k], dtype=np.int64) for k in KEYS})
    return batches


def spans(labels: list[int], names: list[str]) -> set[tuple[int, int, str]]:
    found, start, kind = set(), None, None
    for i, label in enumerate([*labels, 0]):
        tag = names[label] if i < len(labels) else "O"
        prefix, _, entity = tag.partition("-")
        if start is not None and (prefix != "I" or entity != kind):
            found.add((start, i, kind))
            start = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, entity
    return found


def best_span(start: np.ndarray, end: np.ndarray, allowed: np.ndarray) -> tuple[int, int]:
    s = np.where(allowed, start, -np.inf)
    e = np.where(allowed, end, -np.inf)
    scores = s[:, None] + e[None, :]
    n = len(s)
    valid = np.triu(np.ones((n, n), dtype=bool)) & ~np.triu(np.ones((n, n), dtype=bool), MAX_ANSWER)
    scores = np.where(valid, scores, -np.inf)
    i = int(scores.argmax())
    return divmod(i, n)


def judged_outputs(task: str, names: list[str]) -> dict[str, list[str]]:
    """The graph outputs each held-out set reads, for an export of `task` (its manifest's) with outputs `names`:
    classify (SST-2 labels), ner (CoNLL-2003 spans), qa (SQuAD answers: start, end), embeddings (SST-2 cosines),
    rerank (a SQuAD question's top text); a set the graph has no output for is left out."""
    sets = {
        "classify": [n for n in names if n in ("logits", "classify_logits")] if task in ("classify", "multi") else [],
        "ner": [n for n in names if n == "ner_logits" or (n == "logits" and task == "ner")][:1],
        "qa": [next((n for n in names if n.endswith(end)), None) for end in ("start_logits", "end_logits")],
        "embeddings": [n for n in names if n == "embedding"],
        "rerank": names[:1] if task == "rerank" else [],
    }
    return {what: outputs for what, outputs in sets.items() if outputs and None not in outputs}


def compare(fp32_dir: Path, candidate_dir: Path, data: Path, limit: int | None, ner_limit=None, qa_limit=None) -> dict:
    import onnxruntime as ort

    from bert.tokenizer import BertTokenizer

    manifest = json.loads((fp32_dir / "manifest.json").read_text())
    tokenizer = BertTokenizer.from_dir(fp32_dir)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ref = ort.InferenceSession(str(fp32_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
    cand = bf16.session(candidate_dir, options)  # an ONNX graph, or bf16 weights served by torch
    names = [o.name for o in ref.get_outputs()]
    labels = manifest.get("labels")
    figures: dict = {}

    def both(batches, wanted):
        return run(ref, wanted, batches), run(cand, wanted, batches)

    judged = judged_outputs(manifest["task"], names)
    classify = judged.get("classify")
    if classify:
        sentences = sst2(data, limit)
        r, c = both(batched(tokenizer, sentences), classify)
        fp32_scores, scores = np.concatenate(r[classify[0]]), np.concatenate(c[classify[0]])
        same = fp32_scores.argmax(-1) == scores.argmax(-1)
        figures["classify (SST-2 dev labels)"] = {
            "n": int(same.size),
            "agreement": float(same.mean()),
            **near_ties(top_gaps(fp32_scores), same),
        }
    ner = judged.get("ner")
    if ner:
        ner_labels = labels["ner"] if isinstance(labels, dict) else labels
        batches = batched(tokenizer, conll(data, ner_limit or limit))
        r, c = both(batches, ner)
        both_found = either = 0
        for a, b, batch in zip(r[ner[0]], c[ner[0]], batches):
            for row_a, row_b, mask in zip(a, b, batch["attention_mask"]):
                real = mask.astype(bool)
                sa = spans(list(row_a[real].argmax(-1)), ner_labels)
                sb = spans(list(row_b[real].argmax(-1)), ner_labels)
                both_found += len(sa & sb)
                either += len(sa | sb)
        figures["ner (CoNLL-2003 valid entity spans)"] = {"spans": either, "agreement": both_found / max(either, 1)}
    if "qa" in judged:
        start, end = judged["qa"]
        pairs = squad_heldout(data, qa_limit or limit)
        batches = batched(tokenizer, [q for q, _ in pairs], [c for _, c in pairs], size=16)
        r, c = both(batches, [start, end])
        same = total = 0
        for i, batch in enumerate(batches):
            for row in range(len(batch["input_ids"])):
                allowed = (batch["token_type_ids"][row] == 1) & batch["attention_mask"][row].astype(bool)
                allowed[batch["attention_mask"][row].sum() - 1] = False  # the final [SEP]
                a = best_span(r[start][i][row], r[end][i][row], allowed)
                b = best_span(c[start][i][row], c[end][i][row], allowed)
                same += a == b
                total += 1
        figures["qa (SQuAD held-out answers)"] = {"n": total, "agreement": same / total}
    if "embeddings" in judged:
        sentences = sst2(data, limit)
        r, c = both(batched(tokenizer, sentences), ["embedding"])
        a, b = np.concatenate(r["embedding"]), np.concatenate(c["embedding"])
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        figures["embeddings (SST-2 dev cosine >= 0.99)"] = {
            "n": int(cos.size),
            "agreement": float((cos >= 0.99).mean()),
            "min_cosine": float(cos.min()),
        }
    if "rerank" in judged:
        heldout = heldout_articles(data)
        for what, queries in (
            ("rerank (SQuAD held-out top-1 sentence)", paragraph_queries(heldout, qa_limit or limit)),
            ("rerank (SQuAD held-out top-1 of 20 article sentences)", article_queries(heldout, qa_limit or limit)),
        ):
            same, gaps, moved = [], [], []
            for question, texts in queries:
                r, c = both(batched(tokenizer, [question] * len(texts), texts, size=64), [names[0]])
                fp32_scores, scores = np.concatenate(r[names[0]])[:, 0], np.concatenate(c[names[0]])[:, 0]
                same.append(fp32_scores.argmax() == scores.argmax())
                gaps.append(top_gaps(fp32_scores[None])[0])
                moved.append(float(np.abs(scores - fp32_scores).max()))
            figures[what] = {
                "n": len(queries),
                "agreement": float(np.mean(same)) if same else 0.0,
                # how far the candidate moved a text's logit: twice the largest is a --rerank-verify-margin that
                # puts fp32's best text among those scored again (docs/serving.md, "Fast answers")
                "largest_logit_change": max(moved, default=0.0),
                "median_largest_logit_change": float(np.median(moved)) if moved else 0.0,
                **near_ties(np.array(gaps), np.array(same, dtype=bool)),
            }
    return figures


def top_gaps(scores: np.ndarray) -> np.ndarray:
    """fp32's margin of each decision: its best score less its second best (labels' logits, a query's texts)."""
    if scores.shape[-1] < 2:
        return np.full(scores.shape[:-1], np.inf)
    top = np.sort(scores, axis=-1)
    return top[..., -1] - top[..., -2]


def near_ties(gaps: np.ndarray, same: np.ndarray) -> dict:
    """How close to a tie fp32 itself was where the candidate decided otherwise: the fp32 margins of the changed
    decisions (at most 20, smallest first), and the share of all decisions with a margin at most the largest of
    those (a decision that close can tip under any perturbation of the scores)."""
    changed = np.sort(gaps[~same])
    if changed.size == 0:
        return {"changed_fp32_margins": []}
    return {
        "changed_fp32_margins": [round(float(g), 4) for g in changed[:20]],
        "share_within_largest_changed_margin": float((gaps <= changed.max()).mean()),
    }


def paragraph_queries(heldout: list[dict], limit: int | None) -> list[tuple[str, list[str]]]:
    """Each held-out question (of the first `limit`) against its paragraph's sentences (those of two or more)."""
    queries = []
    for question, context in question_contexts(heldout)[:limit]:
        sentences = [context[a:b] for a, b in sentence_spans(context)]
        if len(sentences) >= 2:
            queries.append((question, sentences))
    return queries


def article_queries(heldout: list[dict], limit: int | None, texts: int = 20) -> list[tuple[str, list[str]]]:
    """Each held-out question against `texts` sentences of its article, its paragraph's first (a /rerank request as
    bench.peers sends it: more candidates, closer to one another)."""
    return list(itertools.islice((q for article in heldout for q in article_requests(article, texts)), limit))


def timings(graphs: dict[str, Path], data: Path, sizes=(1, 8, 32), passes: int = 5) -> dict[str, dict[str, float]]:
    """Name -> {"batch N": median seconds per batch}: the first N SST-2 dev sentences, one warm-up run each, then
    `passes` passes in turn over the graphs."""
    import time

    import onnxruntime as ort

    from bert.tokenizer import BertTokenizer

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sessions = {n: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for n, p in graphs.items()}
    tokenizer = BertTokenizer.from_dir(next(iter(graphs.values())).parent)
    sentences = sst2(data, max(sizes))
    feeds = {size: batched(tokenizer, sentences[:size], size=size)[0] for size in sizes}
    for sess in sessions.values():
        for feed in feeds.values():
            sess.run(None, feed)
    seconds = {n: {size: [] for size in sizes} for n in sessions}
    for _ in range(passes):
        for name, sess in sessions.items():
            for size, feed in feeds.items():
                start = time.perf_counter()
                sess.run(None, feed)
                seconds[name][size].append(time.perf_counter() - start)
    return {n: {f"batch {size}": float(np.median(v)) for size, v in by.items()} for n, by in seconds.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.int8_agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--fp32", type=Path, required=True, help="the fp32 export (python -m export.onnx --precision fp32)")
    p.add_argument(
        "--candidate", type=Path, nargs="+", required=True, help="the exports to compare (e.g. the default export)"
    )
    p.add_argument("--time", action="store_true", help="also time every graph, fp32's too (model level)")
    p.add_argument("--data", type=Path, default=DATA, help="the shared data directory")
    p.add_argument("--limit", type=int, default=None, help="at most this many inputs per data set")
    p.add_argument("--ner-limit", type=int, help="at most this many CoNLL sentences (default --limit)")
    p.add_argument("--qa-limit", type=int, help="at most this many SQuAD questions (default --limit)")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    results = {}
    for candidate in args.candidate:
        figures = compare(args.fp32, candidate, args.data, args.limit, args.ner_limit, args.qa_limit)
        results[str(candidate)] = figures
        for what, f in figures.items():
            shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in f.items())
            print(f"{candidate}: {what}: {shown}", flush=True)
    if args.time:
        graphs = {str(d): d / "model.onnx" for d in (args.fp32, *args.candidate)}
        seconds = timings(graphs, args.data)
        fp32 = seconds[str(args.fp32)]
        print("model-level time, ms per batch (speed against fp32):")
        for name, by in seconds.items():
            print(f"  {name}: " + ", ".join(f"{k} {v * 1e3:.1f} ({fp32[k] / v:.2f}x)" for k, v in by.items()))
        results["seconds"] = seconds
    if args.json:
        single = len(args.candidate) == 1 and not args.time
        args.json.write_text(json.dumps(results[str(args.candidate[0])] if single else results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
