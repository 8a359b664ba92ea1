"""QA, NER or classification as fast as int8, answering as fp32 does: int8 alone, and int8 whose unsure items fp32 answers again.

    python -m evals.fast_answers                                      # /qa, the demo model, every held-out question
    python -m evals.fast_answers --task ner --margins 0.1,0.2         # /ner, every CoNLL-2003 valid sentence
    python -m evals.fast_answers --task classify --ckpt CLASSIFIER    # /classify, every SST-2 dev sentence
    python -m evals.fast_answers --limit 300 --margins 0.05,0.1       # a quick look
    python -m evals.fast_answers --task ner --artifact artifacts/demo   # and a default export, served as it is
    python -m evals.fast_answers --task ner --artifact artifacts/demo --rounds 3   # servers alternated, medians

Exports the checkpoint (default: the demo model) with `python -m export.onnx` to an fp32 and an int8
(`--int8-scope all`) artifact (cached in bench/.peers, keyed by the checkpoint and the exporter's code),
then, one server at a time (with --rounds N: all at once, each asked in turn N times), starts `python -m
serving --model ARTIFACT [--TASK-verify-model FP32 --TASK-verify-margin M]` with the CPU defaults and sends every
item, one per request from --clients concurrent clients: for qa each question of the held-out SQuAD articles (the last --heldout-articles of the train parts: the
demo model never trained on them), for ner each sentence of CoNLL-2003 valid (the demo model trained on train),
for classify each SST-2 dev sentence.
Per variant: items/s, the share of answers equal to the fp32 server's (qa: the same text; classify: the same
label; ner: the same entity spans, and spans found by both over spans found by either), SQuAD EM/F1 for qa, and how many items the fp32
model answered again (the servers' x-verified-items headers). Prints a table, writes JSON
(evals/results/fast_answers-TASK.json).

Why a verifier: int8 moves the logits a little, which changes an answer only where the best two were nearly tied
(the demo model: 3-9 % of held-out questions and 2 % of sentences whatever the int8 scope). Those are exactly the
items whose best answer or label leads the second by little, so the server answers them again on fp32
(docs/serving.md, "Fast answers").
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import DATA_DIR, REPO, machine, print_table, write_json
from bench.peers.catalog import bertserve_export
from bench.server_bench import bertserve
from evals.common import heldout_squad_articles


@dataclass(frozen=True)
class Items:
    """What one task's run sends and reads back."""

    route: str
    items: list
    body: Callable[[Any], dict]  # an item -> its request body
    answer: Callable[[Any], Any]  # a response's JSON -> what is compared with fp32's
    warm_up: dict


def qa_items(args) -> Items:
    from training.data.readers import squad_examples

    examples = squad_examples(heldout_squad_articles(args.heldout_articles))[: args.limit or None]
    return Items(
        "/qa",
        examples,
        lambda e: {"question": e.question, "context": e.context, "doc_stride": args.doc_stride},
        lambda answer: (answer[0] if isinstance(answer, list) else answer)["answer"],
        {"question": "warm up?", "context": "A warm-up request."},
    )


def ner_items(args) -> Items:
    from bert.tasks.ner import read_conll

    sentences = [" ".join(s.words) for s in read_conll(DATA_DIR / "conll2003" / "valid.txt")]
    return Items(
        "/ner",
        [s for s in sentences if s.strip()][: args.limit or None],
        lambda text: {"inputs": text},
        lambda entities: frozenset((e["start"], e["end"], e["entity_group"]) for e in entities),
        {"inputs": "A warm-up request from Berlin."},
    )


def classify_items(args) -> Items:
    lines = (DATA_DIR / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return Items(
        "/classify",
        [line.split("\t")[0] for line in lines][: args.limit or None],
        lambda text: {"inputs": text},
        lambda labels: labels[0]["label"],
        {"inputs": "A warm-up request."},
    )


TASKS = {"classify": classify_items, "qa": qa_items, "ner": ner_items}


async def ask_all(url: str, run: Items, clients: int) -> tuple[list, float, int]:
    """Every item, one per request, from `clients` concurrent connections: (answers, seconds, verified)."""
    answers: list = [None] * len(run.items)
    verified = 0
    queue = list(range(len(run.items)))[::-1]

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal verified
        while queue:
            i = queue.pop()
            r = await http.post(run.route, json=run.body(run.items[i]))
            r.raise_for_status()
            answers[i] = run.answer(r.json())
            verified += int(r.headers.get("x-verified-items", 0))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await http.post(run.route, json=run.warm_up)
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return answers, time.perf_counter() - started, verified


def figures(task: str, run: Items, answers: list, reference: list) -> dict:
    """Agreement with fp32's answers (and, for qa, SQuAD EM/F1 against the gold answers)."""
    n = len(run.items)
    row = {"agree_with_fp32_pct": round(100 * sum(a == b for a, b in zip(answers, reference)) / n, 2)}
    if task == "qa":
        from training import metrics as M

        gold = {e.id: [a["text"] for a in e.answers] for e in run.items}
        scores = M.squad_metrics({e.id: a for e, a in zip(run.items, answers)}, gold)
        row |= {"exact_match": round(scores["exact_match"], 2), "f1": round(scores["f1"], 2)}
    elif task == "ner":
        both = sum(len(a & b) for a, b in zip(answers, reference))
        either = sum(len(a | b) for a, b in zip(answers, reference))
        row |= {"spans_agree_pct": round(100 * both / max(either, 1), 2), "spans": either}
    return row


def shown(path) -> str:
    """A path as the results file shows it: relative to the repository where it is inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def result_row(task: str, run: Items, name: str, answers: list, seconds: list[float], verified: int, reference) -> dict:
    """One variant's figures: items/s at the median of its rounds' times (each round's beside it when there are
    several), agreement with `reference` (fp32's answers) and the share answered again."""
    n = len(run.items)
    median = statistics.median(seconds)
    row = {"variant": name, "items_per_s": round(n / median, 1), "seconds": round(median, 1)}
    if len(seconds) > 1:
        row["items_per_s_rounds"] = [round(n / s, 1) for s in seconds]
    return row | figures(task, run, answers, reference) | {"verified_pct": round(100 * verified / n, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=sorted(TASKS), default="qa", help="the route measured")
    p.add_argument("--ckpt", default=str(REPO / "serving" / "demo_model"), help="checkpoint with the task's head")
    p.add_argument("--margins", default="", help="comma list of --TASK-verify-margin values (default: the server's)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients, one item per request")
    p.add_argument("--heldout-articles", type=int, default=10, help="qa: the last N SQuAD train articles")
    p.add_argument("--doc-stride", type=int, default=128, help="qa: the requests' doc_stride")
    p.add_argument("--limit", type=int, default=0, help="only the first N items (quick checks)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="every server started at once and asked in turn this many times; items/s: each one's median",
    )
    p.add_argument("--serving-args", default="", help="more flags for every `python -m serving`")
    p.add_argument(
        "--artifact",
        type=Path,
        action="append",
        default=[],
        help="also serve this export with no flags (e.g. the checkpoint's default export; repeatable)",
    )
    p.add_argument("--work-dir", type=Path, default=REPO / "bench" / ".peers", help="export cache")
    p.add_argument("--json", default=None, help="default: evals/results/fast_answers-TASK.json")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be 1 or more, not {args.rounds}")
    from bert.tasks import TASKS as REGISTRY

    flag = f"--{args.task}-verify"
    margins = [float(m) for m in args.margins.split(",") if m] or [REGISTRY[args.task].verify_margin.default]

    source = Path(args.ckpt)
    fp32 = bertserve_export(source, args.work_dir, args.task, "fp32")
    int8 = bertserve_export(source, args.work_dir, args.task, "int8", "all")
    run = TASKS[args.task](args)
    variants = [("onnxruntime fp32", fp32, []), ("onnxruntime int8 (all)", int8, [])]
    variants += [
        (f"int8 + fp32 verify < {m:g}", int8, [f"{flag}-model", str(fp32), f"{flag}-margin", str(m)]) for m in margins
    ]
    variants += [(f"{path.name} (no flags)", path, []) for path in args.artifact]
    print(f"{len(run.items)} items to {run.route}, {args.clients} clients; fp32 {fp32}, int8 {int8}", flush=True)

    rows, reference = [], None
    if args.rounds == 1:  # one server at a time
        for name, model, extra in variants:
            with bertserve(model, *extra, *shlex.split(args.serving_args)) as url:
                answers, seconds, verified = asyncio.run(ask_all(url, run, args.clients))
            reference = reference or answers
            rows.append(result_row(args.task, run, name, answers, [seconds], verified, reference))
            print(rows[-1], flush=True)
    else:  # every server up at once, each asked in turn, --rounds times: the machine's drift falls on all alike
        with ExitStack() as stack:
            urls = [stack.enter_context(bertserve(m, *e, *shlex.split(args.serving_args))) for _, m, e in variants]
            runs: list[list] = [[] for _ in variants]
            for r in range(args.rounds):
                for (name, _, _), url, done in zip(variants, urls, runs):
                    done.append(asyncio.run(ask_all(url, run, args.clients)))
                    print(f"round {r + 1}: {name} {len(run.items) / done[-1][1]:.1f} items/s", flush=True)
        for (name, _, _), done in zip(variants, runs):
            answers, _, verified = done[0]  # the answers and what was verified: the first round's
            reference = reference or answers
            rows.append(result_row(args.task, run, name, answers, [d[1] for d in done], verified, reference))
            print(rows[-1], flush=True)
    base = rows[0]["items_per_s"]
    for row in rows:
        row["speed_vs_fp32"] = round(row["items_per_s"] / base, 2)
    print()
    columns = [
        ("variant", "variant"),
        ("items_per_s", "items/s"),
        ("speed_vs_fp32", "x fp32"),
        ("agree_with_fp32_pct", "agree %"),
    ]
    columns += {"qa": [("f1", "F1"), ("exact_match", "EM")], "ner": [("spans_agree_pct", "spans agree %")]}.get(
        args.task, []
    )
    print_table(rows, [*columns, ("verified_pct", "verified %")])
    path = write_json(
        args.json or REPO / "evals" / "results" / f"fast_answers-{args.task}.json",
        {
            "command": [shown(sys.argv[0]), *sys.argv[1:]],
            "machine": machine(),
            "task": args.task,
            "items": len(run.items),
            "clients": args.clients,
            "rounds": args.rounds,
            "checkpoint": shown(source),
            "rows": rows,
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
