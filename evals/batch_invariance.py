"""Does an export's answer to a text depend on the other texts of its batch? (docs/export.md, "int8: batch-invariant
answers")

    python -m evals.batch_invariance --model ARTIFACT [--count 200] [--url http://127.0.0.1:8000 [--clients 32]]
                                     [--data DIR] [--json OUT]

In-process: `--count` held-out inputs per graph output (evals.int8_agreement's sets: SST-2 dev sentences for labels
and embeddings, CoNLL-2003 valid sentences for NER, held-out SQuAD questions with their paragraphs for QA, held-out
SQuAD questions against 20 sentences of their article for a reranker, each sentence one pair) are answered alone,
then in batches of 8 and of 32 inputs taken in a shuffled order, so that each batch mixes lengths and sources. Per
output: the largest |difference| between an input's output alone and in a batch (over its own tokens), and how many
decisions changed: labels (argmax), per-token labels, answer spans, a query's top text.

With `--url` (a server already serving ARTIFACT: `python -m serving --model ARTIFACT`), the same inputs go through
its routes with the SDK: first one request at a time (each answered alone), then, as requests of 1, 8 and 32
inputs in shuffled order (a reranker: each query's request three times), from `--clients` concurrent clients, so
that the batcher mixes every input with other callers' inputs. Each answer is compared with the input's alone answer:
strings and whole numbers equal, other numbers within the tolerance, a ranking's order by text.

Prints one line per check and exits 1 when a decision changed or a difference exceeds --tolerance (default 1e-5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from bench.server_bench import batch_figures, server_counters
from evals.int8_agreement import (
    DATA,
    KEYS,
    article_queries,
    batched,
    best_span,
    conll,
    heldout_articles,
    judged_outputs,
    squad_heldout,
    sst2,
)

SIZES = (8, 32)


def input_sets(manifest: dict, names: list[str], data: Path, count: int) -> list[dict]:
    """The held-out inputs per judged set of graph outputs (evals.int8_agreement's judged_outputs): its kind, title,
    outputs, first texts, second texts (pairs) or None, and for a reranker the query each pair belongs to."""
    sets = []
    for kind, outputs in judged_outputs(manifest["task"], names).items():
        s = {"kind": kind, "outputs": outputs, "second": None}
        if kind in ("classify", "embeddings"):
            s |= {"title": f"SST-2 dev {'labels' if kind == 'classify' else 'embeddings'}", "first": sst2(data, count)}
        elif kind == "ner":
            s |= {"title": "CoNLL-2003 valid tokens", "first": conll(data, count)}
        elif kind == "qa":
            pairs = squad_heldout(data, count)
            s |= {"title": "SQuAD held-out answers", "first": [q for q, _ in pairs], "second": [c for _, c in pairs]}
        else:
            queries = article_queries(heldout_articles(data), count)
            s |= {
                "title": "SQuAD held-out top text of 20",
                "first": [q for q, texts in queries for _ in texts],
                "second": [t for _, texts in queries for t in texts],
                "query": [i for i, (_, texts) in enumerate(queries) for _ in texts],
            }
        sets.append(s)
    return sets


def per_input(session, tokenizer, s: dict, order: list[int], size: int) -> tuple[list[dict], list[dict]]:
    """Run the inputs of set `s` in `order`, `size` a batch; per input (in the set's order) its outputs over its
    own tokens and its features."""
    first = [s["first"][i] for i in order]
    second = None if s["second"] is None else [s["second"][i] for i in order]
    names = {i.name for i in session.get_inputs()}
    outputs, features = [None] * len(order), [None] * len(order)
    at = 0
    for batch in batched(tokenizer, first, second, size=size):
        feed = {k: v for k, v in batch.items() if k in names}
        values = session.run(s["outputs"], feed)
        for row in range(len(batch["input_ids"])):
            n = int(batch["attention_mask"][row].sum())
            i = order[at]
            outputs[i] = {
                name: (v[row, :n] if v.ndim >= 2 and v.shape[1] == batch["input_ids"].shape[1] else v[row])
                for name, v in zip(s["outputs"], values)
            }
            features[i] = {k: batch[k][row, :n] for k in KEYS}
            at += 1
    return outputs, features


def decisions(s: dict, outputs: list[dict], features: list[dict]) -> list:
    """What a user reads off each input's outputs (per query for a reranker)."""
    how, out = s["kind"], s["outputs"]
    if how == "classify":
        return [int(o[out[0]].argmax()) for o in outputs]
    if how == "ner":
        return [tuple(o[out[0]].argmax(-1).tolist()) for o in outputs]
    if how == "qa":
        found = []
        for o, f in zip(outputs, features):
            allowed = f["token_type_ids"] == 1
            allowed[-1] = False  # the final [SEP]
            found.append(best_span(o[out[0]], o[out[1]], allowed))
        return found
    if how == "rerank":
        best: dict[int, tuple[float, int]] = {}
        for i, (o, query) in enumerate(zip(outputs, s["query"])):
            score = float(np.asarray(o[out[0]]).reshape(-1)[0])
            if query not in best or score > best[query][0]:
                best[query] = (score, i)
        return [best[q][1] for q in sorted(best)]
    return []


def in_process(model: Path, data: Path, count: int, seed: int = 0) -> list[dict]:
    import onnxruntime as ort

    from bert.tokenizer import BertTokenizer
    from export import bf16

    manifest = json.loads((model / "manifest.json").read_text())
    tokenizer = BertTokenizer.from_dir(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = bf16.session(model, options)  # an ONNX graph, or bf16 weights served by torch
    names = [o.name for o in session.get_outputs()]
    results = []
    for s in input_sets(manifest, names, data, count):
        n = len(s["first"])
        alone, features = per_input(session, tokenizer, s, list(range(n)), 1)
        want = decisions(s, alone, features)
        for size in SIZES:
            order = list(range(n))
            random.Random(seed + size).shuffle(order)
            got, _ = per_input(session, tokenizer, s, order, size)
            worst = max(float(np.abs(a[k] - g[k]).max()) for a, g in zip(alone, got) for k in s["outputs"])
            changed = sum(a != b for a, b in zip(want, decisions(s, got, features)))
            results.append(
                {
                    "check": f"in-process, batches of {size}",
                    "set": s["title"],
                    "inputs": n,
                    "decisions": len(want),
                    "decisions_changed": changed,
                    "largest_change": worst,
                }
            )
    return results


def plain(value):
    """An SDK answer as JSON values; a ranking in text order, with its order kept apart."""
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, list):
        items = [plain(v) for v in value]
        # a ranking's entries carry their text's index (an entity's "index" is its token's, None once aggregated)
        if items and all(isinstance(v, dict) and isinstance(v.get("index"), int) and "score" in v for v in items):
            return {"order": [v["index"] for v in items], "by_text": sorted(items, key=lambda v: v["index"])}
        return items
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def difference(a, b) -> tuple[float, int]:
    """(largest numeric difference, how many strings, whole numbers, lengths or orders differ) between two answers."""
    if isinstance(a, dict) and isinstance(b, dict):
        parts = [difference(a.get(k), b.get(k)) for k in a.keys() | b.keys()]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return 0.0, 1
        parts = [difference(x, y) for x, y in zip(a, b)]
    elif isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return 0.0, 1
        return abs(float(a) - float(b)), 0
    else:
        return 0.0, int(a != b)
    return max((p[0] for p in parts), default=0.0), sum(p[1] for p in parts)


def server_requests(manifest: dict, names: list[str], data: Path, count: int) -> list[tuple[str, list]]:
    """(route method, the inputs of one request) per input: the SDK method and its first argument."""
    calls = []
    for s in input_sets(manifest, names, data, count):
        if s["kind"] == "rerank":
            queries: dict[int, list] = {}
            for q, first, second in zip(s["query"], s["first"], s["second"]):
                queries.setdefault(q, [first, []])[1].append(second)
            calls += [("rerank", [query, texts]) for query, texts in queries.values()]
            continue
        method = "embed" if s["kind"] == "embeddings" else s["kind"]  # the SDK's method of the route
        items = s["first"] if s["second"] is None else list(zip(s["first"], s["second"]))
        calls += [(method, [item]) for item in items]
    return calls


async def through_server(url: str, model: Path, data: Path, count: int, clients: int, seed: int = 0) -> list[dict]:
    from bertserve_client import AsyncClient

    manifest = json.loads((model / "manifest.json").read_text())
    names = [o["name"] for o in manifest["outputs"]]
    calls = server_requests(manifest, names, data, count)
    extra = {"classify": {"top_k": None}}

    async def ask(client, method: str, items: list):
        if method == "rerank":
            return await client.rerank(items[0], items[1])
        if method == "qa":
            return await client.qa([{"question": q, "context": c} for q, c in items])
        return await getattr(client, method)(items, **extra.get(method, {}))

    async with AsyncClient(url, timeout=120) as client:
        alone = [plain(await ask(client, method, items)) for method, items in calls]
        # requests of 1, 8 and 32 inputs of one route (a reranker's: each query's request three times), shuffled,
        # from `clients` at once
        requests = [[i] for i in range(len(calls))]
        for size in SIZES:
            for method in dict.fromkeys(m for m, _ in calls):
                ids = [i for i, (m, _) in enumerate(calls) if m == method]
                step = 1 if method == "rerank" else size  # a reranker's request is one query's texts
                requests += [ids[j : j + step] for j in range(0, len(ids), step)]
        random.Random(seed).shuffle(requests)
        queue, got = list(requests), []
        before, started = server_counters(url), time.monotonic()

        async def worker():
            while queue:
                ids = queue.pop()
                method = calls[ids[0]][0]
                items = [item for i in ids for item in calls[i][1]] if method != "rerank" else calls[ids[0]][1]
                answer = await ask(client, method, items)
                answers = [answer] if method == "rerank" else list(answer)
                got.extend((i, plain(a)) for i, a in zip(ids, answers, strict=True))

        await asyncio.gather(*(worker() for _ in range(clients)))
        figures = batch_figures(before, server_counters(url), time.monotonic() - started)
    worst, changed = 0.0, 0
    for i, answer in got:
        want = alone[i][0] if calls[i][0] != "rerank" else alone[i]
        d, c = difference(want, answer)
        worst, changed = max(worst, d), changed + c
    return [
        {
            "check": f"server, {clients} clients, requests of 1, {', '.join(map(str, SIZES))}",
            "set": "every route",
            "inputs": len(calls),
            "answers": len(got),
            "decisions_changed": changed,
            "largest_change": worst,
            "sequences_per_batch": figures.get("mean_batch", 0.0),
        }
    ]


def unreachable(url: str) -> str | None:
    """Why the server at `url` cannot be measured (not answering, or not ready), or None."""
    import httpx

    try:
        status = httpx.get(url.rstrip("/") + "/ready", timeout=10).status_code
    except httpx.HTTPError as e:
        return f"no server answers there ({e})"
    return None if status == 200 else f"the server is not ready (/ready answered {status})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.batch_invariance", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="the export (python -m export.onnx's --out)")
    p.add_argument("--count", type=int, default=200, help="held-out inputs per set (a reranker: queries)")
    p.add_argument("--url", help="also through this server, which serves --model")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients through the server")
    p.add_argument("--tolerance", type=float, default=1e-5, help="the largest change allowed in a score or vector")
    p.add_argument("--data", type=Path, default=DATA, help="the shared data directory")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    for flag, value in (("--count", args.count), ("--clients", args.clients)):
        if value < 1:
            print(f"{flag} {value}: give 1 or more", file=sys.stderr)
            return 2
    if not (args.model / "manifest.json").is_file():
        print(f"--model {args.model}: no manifest.json there (an export's directory)", file=sys.stderr)
        return 2
    if args.url and (problem := unreachable(args.url)):
        print(f"--url {args.url}: {problem}", file=sys.stderr)
        return 2
    results = in_process(args.model, args.data, args.count)
    if args.url:
        from bertserve_client import BertserveError

        try:
            results += asyncio.run(through_server(args.url, args.model, args.data, args.count, args.clients))
        except BertserveError as e:
            print(f"--url {args.url}: {e}", file=sys.stderr)
            return 2
    for r in results:
        print(
            f"{r['check']}: {r['set']}: {r['inputs']} inputs, {r['decisions_changed']} decisions changed, "
            f"largest change {r['largest_change']:.1e}"
            + (f", {r['sequences_per_batch']:.1f} sequences a batch" if "sequences_per_batch" in r else ""),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "results": results}, indent=2) + "\n")
    ok = all(r["decisions_changed"] == 0 and r["largest_change"] <= args.tolerance for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
