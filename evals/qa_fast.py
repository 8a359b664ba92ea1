"""QA as fast as int8, answering as fp32 does: int8 alone, and int8 whose unsure questions fp32 answers again.

    python -m evals.qa_fast                                  # the demo model, every held-out question
    python -m evals.qa_fast --limit 300 --margins 0.05,0.1   # a quick look

Exports the checkpoint (default: the demo model) with `python -m export.onnx` to an fp32 and an int8
(`--int8-scope all`) artifact (cached in bench/.peers, keyed by the checkpoint and the exporter's code),
then, one server at a time, starts `python -m serving --model ARTIFACT [--qa-verify-model FP32
--qa-verify-margin M]` with the CPU defaults and sends every question of the held-out SQuAD articles (the
last --heldout-articles of the train parts: the demo model never trained on them), one question per
request from --clients concurrent clients. Per variant: questions/s, SQuAD EM/F1, the share of answers
equal to the fp32 server's (same text), and how many questions the fp32 model answered again (the
servers' x-verified-items headers). Prints a table, writes JSON (evals/results/qa_fast.json).

Why a verifier: int8 moves the logits a little, which changes the answer only where the best two answers
were nearly tied (the demo model: 8-10 % of held-out questions whatever the int8 scope; a per-layer
search found no MatMul whose exclusion fixes it). Those are exactly the questions whose best answer
leads the second by little, so the server answers them again on fp32 (docs/serving.md, "Fast answers").
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from pathlib import Path

import httpx

from bench.common import REPO, machine, print_table, write_json
from bench.peers.catalog import bertserve_export
from bench.server_bench import free_port, start, stop
from evals.common import heldout_squad_articles


def heldout_questions(articles: int, limit: int = 0):
    from training.data.readers import squad_examples

    return squad_examples(heldout_squad_articles(articles))[: limit or None]


async def ask_all(url: str, examples, clients: int, doc_stride: int) -> tuple[list[str], float, int]:
    """Every question, one per request, from `clients` concurrent connections: (answers, seconds, verified)."""
    answers: list[str | None] = [None] * len(examples)
    verified = 0
    queue = list(range(len(examples)))[::-1]

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal verified
        while queue:
            i = queue.pop()
            e = examples[i]
            r = await http.post("/qa", json={"question": e.question, "context": e.context, "doc_stride": doc_stride})
            r.raise_for_status()
            answer = r.json()
            answers[i] = (answer[0] if isinstance(answer, list) else answer)["answer"]
            verified += int(r.headers.get("x-verified-items", 0))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await http.post("/qa", json={"question": "warm up?", "context": "A warm-up request."})
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return answers, time.perf_counter() - started, verified


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", default=str(REPO / "serving" / "demo_model"), help="checkpoint with a qa head")
    p.add_argument("--margins", default="0.1", help="comma list of --qa-verify-margin values to measure")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients, one question per request")
    p.add_argument("--heldout-articles", type=int, default=10, help="the last N SQuAD train articles")
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="only the first N questions (quick checks)")
    p.add_argument("--serving-args", default="", help="more flags for every `python -m serving`")
    p.add_argument("--work-dir", type=Path, default=REPO / "bench" / ".peers", help="export cache")
    p.add_argument("--json", default=str(REPO / "evals" / "results" / "qa_fast.json"))
    args = p.parse_args(argv)
    margins = [float(m) for m in args.margins.split(",") if m]

    from training import metrics as M

    source = Path(args.ckpt)
    fp32 = bertserve_export(source, args.work_dir, "qa", "fp32")
    int8 = bertserve_export(source, args.work_dir, "qa", "int8", "all")
    examples = heldout_questions(args.heldout_articles, args.limit)
    gold = {e.id: [a["text"] for a in e.answers] for e in examples}
    variants = [("onnxruntime fp32", fp32, []), ("onnxruntime int8 (all)", int8, [])]
    variants += [
        (f"int8 + fp32 verify < {m:g}", int8, ["--qa-verify-model", str(fp32), "--qa-verify-margin", str(m)])
        for m in margins
    ]
    print(f"{len(examples)} held-out questions, {args.clients} clients; fp32 {fp32}, int8 {int8}", flush=True)

    rows, reference = [], None
    for name, model, extra in variants:
        port = free_port()
        proc = start(
            [
                sys.executable,
                "-m",
                "serving",
                "--model",
                str(model),
                "--port",
                str(port),
                "--log-level",
                "warning",
                *extra,
                *shlex.split(args.serving_args),
            ],
            port,
        )
        try:
            answers, seconds, verified = asyncio.run(
                ask_all(f"http://127.0.0.1:{port}", examples, args.clients, args.doc_stride)
            )
        finally:
            stop(proc)
        reference = reference or answers
        scores = M.squad_metrics({e.id: a for e, a in zip(examples, answers)}, gold)
        row = {
            "variant": name,
            "questions_per_s": round(len(examples) / seconds, 1),
            "seconds": round(seconds, 1),
            "exact_match": round(scores["exact_match"], 2),
            "f1": round(scores["f1"], 2),
            "agree_with_fp32_pct": round(100 * sum(a == b for a, b in zip(answers, reference)) / len(examples), 2),
            "verified_pct": round(100 * verified / len(examples), 1),
        }
        rows.append(row)
        print(row, flush=True)
    base = rows[0]["questions_per_s"]
    for row in rows:
        row["speed_vs_fp32"] = round(row["questions_per_s"] / base, 2)
    print()
    print_table(
        rows,
        [
            ("variant", "variant"),
            ("questions_per_s", "questions/s"),
            ("speed_vs_fp32", "x fp32"),
            ("agree_with_fp32_pct", "agree %"),
            ("f1", "F1"),
            ("exact_match", "EM"),
            ("verified_pct", "verified %"),
        ],
    )
    path = write_json(
        args.json,
        {
            "command": sys.argv,
            "machine": machine(),
            "questions": len(examples),
            "clients": args.clients,
            "heldout_articles": args.heldout_articles,
            "checkpoint": str(source),
            "rows": rows,
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
