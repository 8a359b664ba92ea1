"""How far margins can take an int8 graph with its fp32 graph: the fewest items answered again for each agreement.

    python -m evals.margin_reach --artifact DIR --task qa [--exact DIR] [--limit N] [--json PATH]

DIR is an int8 export carrying its fp32 graph (`python -m export.onnx ... --verify-graph`, or the default export
when it chose the pair); `--exact` names another fp32 artifact instead of DIR/verify. Both run in this process over
held-out data (SST-2 dev sentences, CoNLL-2003 valid sentences, questions of the last 10 SQuAD train articles).
For each agreement target it reports the smallest share of items that must be answered again on fp32, taking
them in order of int8's margin (as the server's --TASK-verify-margin does), and the margin that sends exactly
those: the best any margin can do on this data, since it is fitted to the very answers it is judged on. With
the graphs' times it bounds the pair's speed: at best 1 / (1 + share x fp32's time / int8's) of int8 alone.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import REPO, machine, print_table, write_json

TARGETS = (99.0, 99.5, 99.9, 100.0)


def _parts(changed, parts):
    """Per item: what agrees and what is counted with int8's answer, and what is counted (all agreeing) once fp32
    answers it again. By default an item is one decision: (0 or 1, 1, 1)."""
    if parts is not None:
        return tuple(np.asarray(x, dtype=np.float64) for x in parts)
    changed = np.asarray(changed, dtype=bool)
    ones = np.ones(len(changed))
    return (~changed).astype(np.float64), ones, ones


def reach(changed, margins, targets=TARGETS, parts=None) -> list[dict]:
    """Per agreement target (percent of items whose decision is fp32's; with `parts`, of what they count, e.g. a
    sentence's entity spans: (agreeing, counted) with int8's answer and counted with fp32's, per item): the
    smallest share of items answered again, those with the smallest margins (an item is answered again when its
    margin is under the margin used, so items of equal margin go together), and the least margin that sends them
    (`margin`: any value above `largest_sent`). None where no margin reaches the target (a changed item whose
    margin is infinite: nothing competed with its answer)."""
    margins = np.asarray(margins, dtype=np.float64)
    agree, total, again = _parts(changed, parts)
    n = len(margins)
    values = np.unique(margins)  # sorted distinct margins
    order = np.argsort(margins, kind="stable")
    sent = np.searchsorted(margins[order], values, side="right")  # items with margin <= each value

    def cumulative(x):
        return np.concatenate([[0.0], np.cumsum(x[order])])

    a, t, g = cumulative(agree), cumulative(total), cumulative(again)

    def agreement(k):  # the first k items in margin order answered again
        counted = g[k] + t[-1] - t[k]
        return np.where(counted > 0, 100 * (g[k] + a[-1] - a[k]) / np.maximum(counted, 1e-300), 100.0)

    reached = agreement(sent)
    rows = []
    for target in targets:
        if agreement(0) >= target - 1e-9:
            rows.append({"target_pct": target, "answered_again_pct": 0.0, "margin": 0.0, "largest_sent": None})
            continue
        hit = np.nonzero((reached >= target - 1e-9) & np.isfinite(values))[0]
        if not len(hit):
            rows.append({"target_pct": target, "answered_again_pct": None, "margin": None, "largest_sent": None})
            continue
        i = int(hit[0])
        largest = float(values[i])
        rows.append(
            {
                "target_pct": target,
                "answered_again_pct": round(100 * int(sent[i]) / n, 2),
                "margin": float(np.nextafter(largest, math.inf)),
                "largest_sent": largest,
            }
        )
    return rows


def at_margin(changed, margins, margin: float, parts=None) -> dict:
    """What one margin gives: the share answered again and the agreement after it."""
    agree, total, again = _parts(changed, parts)
    sent = np.asarray(margins, dtype=np.float64) < margin
    counted = float(np.where(sent, again, total).sum())
    agreeing = float(np.where(sent, again, agree).sum())
    return {
        "margin": margin,
        "answered_again_pct": round(100 * float(sent.mean()), 2),
        "agree_pct": round(100 * agreeing / counted, 2) if counted else 100.0,
    }


def held_out(task: str, limit: int) -> list:
    """The task's held-out items (evals.fast_answers' sets) as its codec takes them: a request body's `inputs`, or
    the body itself (a question with its context)."""
    from evals.fast_answers import TASKS as HELD_OUT

    run = HELD_OUT[task](argparse.Namespace(limit=limit, heldout_articles=10, doc_stride=128))
    bodies = [run.body(item) for item in run.items]
    return [body.get("inputs", body) for body in bodies]


def answer_all(model, task, items):
    """(decisions, margins, seconds of model time) of `items` on a loaded model, in the runtime's batches."""
    from bert.tasks.common import Limits
    from runtime.inference import Inference, run_encoded

    inference = Inference(model, task)
    encoded = inference.encode(items, Limits(max_length=model.max_length, max_sequences=1 << 20), {})
    started = time.perf_counter()
    outputs = run_encoded(model.backend, encoded)
    seconds = time.perf_counter() - started
    answers = inference.decode(encoded, outputs, {})
    return task.decisions(items, answers), inference.margins(encoded, outputs, {}), seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.margin_reach", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="an int8 export with its fp32 graph in verify/")
    p.add_argument("--exact", type=Path, help="the fp32 artifact (default: ARTIFACT/verify)")
    p.add_argument("--task", choices=("classify", "ner", "qa"), default="qa")
    p.add_argument("--limit", type=int, default=0, help="only the first N held-out items")
    p.add_argument("--margins", default="", help="comma list of margins to report as well (default: the task's)")
    p.add_argument("--json", type=Path, help="default: evals/results/margin_reach-TASK.json")
    args = p.parse_args(argv)
    try:
        extra = [float(m) for m in args.margins.split(",") if m.strip()]
    except ValueError:
        p.error(f"--margins {args.margins!r}: not a comma list of numbers")
    exact_dir = args.exact or args.artifact / "verify"
    for name, path in (("--artifact", args.artifact), ("exact model", exact_dir)):
        if not (path / "config.json").is_file():
            p.error(f"{name} {path}: not a model directory (no config.json)")
    if args.limit < 0:
        p.error("--limit must be 0 (all) or more")

    from bert.tasks import TASKS
    from runtime.loading import LoadOptions, load_model
    from runtime.model_dir import ModelError

    task = TASKS[args.task]
    options = LoadOptions(inference_workers=1)
    try:
        fast, exact = load_model(args.artifact, options), load_model(exact_dir, options)
    except ModelError as e:
        p.error(str(e))
    for name, model in (("--artifact", fast), ("exact model", exact)):
        if args.task not in model.backend.tasks:
            p.error(f"{name} {model.spec.path} does not serve {args.task} (it serves {', '.join(model.backend.tasks)})")
    try:
        items = held_out(args.task, args.limit)
    except OSError as e:  # the held-out data is not where bench.common looks (BERTSERVE_TEST_DATA)
        p.error(f"cannot read the held-out data: {e}")
    fast_decisions, margins, fast_s = answer_all(fast, task, items)
    exact_decisions, _, exact_s = answer_all(exact, task, items)
    changed = np.array([a != b for a, b in zip(fast_decisions, exact_decisions)])
    ratio = exact_s / fast_s
    measures = {"decisions": None}  # what agreement counts: whole decisions, and a set's members (NER's spans)
    if fast_decisions and all(isinstance(d, (set, frozenset)) for d in [*fast_decisions, *exact_decisions]):
        measures["members"] = (
            [len(a & b) for a, b in zip(fast_decisions, exact_decisions)],
            [len(a | b) for a, b in zip(fast_decisions, exact_decisions)],
            [len(b) for b in exact_decisions],
        )
    print(
        f"{args.task}: {len(items)} held-out items; int8 changes {int(changed.sum())} "
        f"({100 * changed.mean():.2f} %); model time int8 {fast_s:.1f} s, fp32 {exact_s:.1f} s ({ratio:.2f}x)"
    )
    figures = {}
    for measure, parts in measures.items():
        rows = reach(changed, margins, parts=parts)
        for row in rows:
            share = row["answered_again_pct"]
            row["best_case_x_int8"] = None if share is None else round(1 / (1 + share / 100 * ratio), 3)
        chosen = [at_margin(changed, margins, m, parts) for m in [task.verify_margin.default, *extra]]
        figures[measure] = {"targets": rows, "margins": chosen}
        print(f"agreement of {measure} with fp32's:")
        print_table(
            [
                {
                    "agreement": f"{r['target_pct']} %",
                    "again": "unreachable" if r["answered_again_pct"] is None else f"{r['answered_again_pct']} %",
                    "margin": "-" if r["margin"] is None else f"{r['margin']:.4g}",
                    "best": "-" if r["best_case_x_int8"] is None else f"{r['best_case_x_int8']:.3f}",
                }
                for r in rows
            ],
            [
                ("agreement", "agreement"),
                ("again", "answered again"),
                ("margin", "margin"),
                ("best", "best case x int8"),
            ],
        )
        for c in chosen:
            print(f"margin {c['margin']}: {c['answered_again_pct']} % answered again, {c['agree_pct']} % agree")
    out = args.json or REPO / "evals" / "results" / f"margin_reach-{args.task}.json"
    write_json(
        out,
        {
            "command": "python -m evals.margin_reach " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine(),
            "task": args.task,
            "artifact": str(args.artifact),
            "exact": str(exact_dir),
            "items": len(items),
            "int8_changed": int(changed.sum()),
            "model_seconds": {"int8": round(fast_s, 3), "fp32": round(exact_s, 3)},
            **figures,
        },
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
