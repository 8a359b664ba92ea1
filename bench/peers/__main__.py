"""Peer benchmark: bertserve against the servers a user would pick instead, same weights, same run.

    python -m bench.peers --task classify,embed --concurrency 1,8,32 --seconds 15 --plot
    python -m bench.peers --task classify --peers bertserve-default,infinity-optimum-int8 --seconds 5
    python -m bench.peers --task rerank --rerank-model DIR --concurrency 8,32

For each task, every peer of bench/peers/catalog.py in turn (never two at once: they would share the
CPU): prepare its weights (exports, infinity's venv and ONNX files, all cached in bench/.peers),
start it, send each sentence once and score its answers against an fp32 reference (label agreement
and SST-2 accuracy for classify, cosine similarity for embed), then sweep the concurrency levels
with the closed-loop load generator of bench/server_bench.py: single SST-2 dev sentences, --seconds
per level after --warmup, a quiet-machine check before each level, server / load-generator / other
CPU recorded. A peer that cannot run here (no infinity venv with --no-setup, no /embed yet) is
skipped with its reason. Prints a table and the best of each server side by side, writes
bench/results/peers-TIMESTAMP.json, and with --plot docs/img/peers-TASK-{requests_per_s,p99_ms}.png.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
import time
from pathlib import Path

from bench.common import REPO, machine, print_table, sst2_sample, write_json
from bench.peers import Peer, PeerUnavailable, infinity_env
from bench.peers import catalog as peer_catalog
from bench.peers.quality import decode, reference_answers, score
from bench.server_bench import (
    QuietPolicy,
    ServerFailed,
    add_quiet_arguments,
    collect,
    log_headline,
    log_tail,
    plot,
    run_levels,
    serve,
    work_items,
)

TASKS = ("classify", "embed", "rerank")

# bertserve's default-export peer (the exporter picks fp32, int8 and what stays fp32, or bf16 on CPUs that
# multiply bf16 natively, served by the torch backend) under the names it had before
RENAMED = {"bertserve-ort-int8": "bertserve-default", "bertserve-ort-default": "bertserve-default"}


def run_peer(
    peer: Peer, items: list[str], reference: list, gold: list[str] | None, args, quiet: QuietPolicy, results: dict
) -> None:
    """Prepare, start, score and sweep one peer; what it could not do goes to results["skipped"]."""
    print(f"\n== {peer.task}: {peer.name}", flush=True)
    try:
        if peer.prepare:
            peer.prepare()
        with serve(peer, timeout=args.startup_timeout) as (proc, url):
            status, payload = asyncio.run(collect(url + peer.adapter.path, [peer.adapter.body(items[0])], 1))[0]
            if status == 404:
                raise PeerUnavailable(f"POST {peer.adapter.path} answered 404: this server has no such endpoint yet")
            if status != 200:
                raise PeerUnavailable(
                    f"POST {peer.adapter.path} answered {status}: {payload[:300]!r}; "
                    f"server log: {log_headline(log_tail(proc))}"
                )
            bodies = [peer.adapter.body(s) for s in items]
            answers = decode(peer.adapter, asyncio.run(collect(url + peer.adapter.path, bodies, 8)))
            quality = {"peer": peer.name, "task": peer.task, **score(peer.task, answers, reference, gold)}
            results["quality"].append(quality)
            print(
                "quality vs fp32 reference:",
                {
                    k: round(v, 4) if isinstance(v, float) else v
                    for k, v in quality.items()
                    if k not in ("peer", "task")
                },
                flush=True,
            )
            results["rows"] += run_levels(
                peer, proc, url, items, args.levels, args.seconds, args.warmup, args.client, quiet
            )
        results["peers"].append(peer.describe())
    except PeerUnavailable as e:
        print(f"skipped {peer.name} ({peer.task}): {e}", flush=True)
        results["skipped"].append({"peer": peer.name, "task": peer.task, "reason": str(e)})
    except ServerFailed as e:
        print(f"skipped {peer.name} ({peer.task}): {e}", flush=True)
        results["skipped"].append(
            {"peer": peer.name, "task": peer.task, "reason": e.headline, "log_tail": e.log, "argv": peer.argv}
        )


def summarize(rows: list[dict]) -> dict:
    """Per task and concurrency: each server's best variant, and bertserve's best over the others'."""
    out: dict = {}
    for r in rows:
        level = out.setdefault(r["task"], {}).setdefault(str(r["concurrency"]), {"best": {}})
        best = level["best"].get(r["server"])
        if best is None or r["requests_per_s"] > best["requests_per_s"]:
            level["best"][r["server"]] = {"peer": r["peer"], "requests_per_s": r["requests_per_s"]}
    for task in out.values():
        for level in task.values():
            ours = level["best"].get("bertserve")
            for other, best in level["best"].items():
                if other != "bertserve" and ours and best["requests_per_s"]:
                    level[f"bertserve_over_{other}"] = ours["requests_per_s"] / best["requests_per_s"]
    return out


def versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "onnxruntime", "transformers", "tokenizers", "fastapi", "uvicorn", "pydantic"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def print_results(results: dict) -> None:
    quality = {(q["task"], q["peer"]): q for q in results["quality"]}
    table = []
    for r in results["rows"]:
        q = quality.get((r["task"], r["peer"]), {})
        table.append({**r, "agree": q.get("agree_pct", q.get("cosine_mean")), "busy": "BUSY" if r["busy"] else ""})
    print()
    print_table(
        table,
        [
            ("task", "task"),
            ("peer", "peer"),
            ("concurrency", "clients"),
            ("requests_per_s", "req/s"),
            ("p50_ms", "p50 ms"),
            ("p99_ms", "p99 ms"),
            ("errors", "errors"),
            ("server_cpu_cores", "server CPU"),
            ("client_cpu_cores", "client CPU"),
            ("other_cpu_cores", "other CPU"),
            ("agree", "agree % / cos"),
            ("busy", ""),
        ],
    )
    for task, levels in results["summary"].items():
        for c, level in levels.items():
            best = "  ".join(f"{server} {b['requests_per_s']:.1f} ({b['peer']})" for server, b in level["best"].items())
            ratio = level.get("bertserve_over_infinity")
            print(f"{task} c={c}: best {best}" + (f"  -> bertserve/infinity {ratio:.2f}x" if ratio else ""))
    for s in results["skipped"]:
        print(f"skipped {s['task']} {s['peer']}: {s['reason'].splitlines()[0][:200]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="classify,embed", help=f"comma list from {', '.join(TASKS)}")
    p.add_argument("--peers", default="", help="comma list of peer names (default: all of the task's peers)")
    p.add_argument("--concurrency", default="1,8,32", help="comma list of concurrent clients")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each level")
    p.add_argument("--sample", type=int, default=872, help="SST-2 dev sentences sent and scored (872: all)")
    p.add_argument(
        "--threads",
        type=int,
        default=2,
        help="inference threads for bertserve and the baseline (infinity keeps its own defaults)",
    )
    p.add_argument(
        "--classify-model",
        type=Path,
        default=REPO / "serving" / "demo_model",
        help="bertserve checkpoint with a classify head: the weights every classify peer serves",
    )
    p.add_argument(
        "--rerank-model",
        type=Path,
        help="cross-encoder directory (one logit, transformers' layout) every rerank peer serves; each request "
        "is a SQuAD question and 20 sentences of its article",
    )
    p.add_argument(
        "--bertserve-root",
        type=Path,
        default=REPO,
        help="checkout whose serving/ and export/ bertserve runs (default: this one; e.g. a clean "
        "snapshot of main: `git archive main | tar -x -C DIR`)",
    )
    p.add_argument("--work-dir", type=Path, default=peer_catalog.WORK, help="exports and infinity's venv (cached)")
    p.add_argument(
        "--no-setup",
        action="store_true",
        help="skip infinity if its venv is not set up, instead of setting it up (python -m bench.peers.infinity_env)",
    )
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds a server may take to get ready")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw", help="load generator transport")
    add_quiet_arguments(p)
    p.add_argument("--out", type=Path, help="results JSON (default bench/results/peers-TIMESTAMP.json)")
    p.add_argument("--plot", action="store_true", help="draw requests/s and p99 against clients per task")
    p.add_argument("--plot-dir", type=Path, default=REPO / "docs" / "img")
    args = p.parse_args(argv)
    tasks = [t for t in args.task.split(",") if t]
    if unknown := set(tasks) - set(TASKS):
        p.error(f"unknown tasks {sorted(unknown)}; choose from {', '.join(TASKS)}")
    args.levels = [int(c) for c in args.concurrency.split(",")]
    wanted = [n for n in args.peers.split(",") if n]
    for old in [n for n in wanted if n in RENAMED]:
        print(f"{old} is now {RENAMED[old]}: bertserve's default export, no precision flags", flush=True)
    wanted = list(dict.fromkeys(RENAMED.get(n, n) for n in wanted))
    quiet = QuietPolicy(args.busy, args.max_other_cpu, args.busy_wait, args.check_seconds)
    out = args.out or REPO / "bench" / "results" / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"

    results: dict = {
        "machine": machine(),
        "command": [sys.executable, "-m", "bench.peers", *(argv or sys.argv[1:])],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(),
        "settings": {
            "tasks": tasks,
            "concurrency": args.levels,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "sample": args.sample,
            "threads": args.threads,
            "client": args.client,
            "classify_model": str(args.classify_model),
            "rerank_model": str(args.rerank_model) if args.rerank_model else None,
            "bertserve_root": str(args.bertserve_root),
            "busy": vars(quiet),
        },
        "peers": [],
        "quality": [],
        "rows": [],
        "skipped": [],
        "references": {},
    }
    catalogs = {
        task: peer_catalog.catalog(
            task,
            args.classify_model,
            args.threads,
            args.work_dir,
            not args.no_setup,
            args.bertserve_root.resolve(),
            args.rerank_model,
        )
        for task in tasks
    }
    if unknown := set(wanted) - {peer.name for peers in catalogs.values() for peer in peers}:
        p.error(
            f"unknown peers {sorted(unknown)}; the {'/'.join(tasks)} peers are "
            f"{', '.join(dict.fromkeys(peer.name for peers in catalogs.values() for peer in peers))}"
        )
    sample = sst2_sample(args.sample)
    for task in tasks:
        peers = [peer for peer in catalogs[task] if not wanted or peer.name in wanted]
        items = work_items(task, args.sample)
        try:
            model = {
                "classify": lambda: args.classify_model,
                "embed": peer_catalog.embed_model,
                "rerank": lambda: peer_catalog.rerank_model(args.rerank_model),
            }[task]()
        except PeerUnavailable as e:
            results["skipped"] += [{"peer": peer.name, "task": task, "reason": str(e)} for peer in peers]
            continue
        t0 = time.perf_counter()
        reference, names = reference_answers(task, model, items)
        gold = [names[label] for _, label in sample] if task == "classify" else None
        results["references"][task] = {
            "model": str(model),
            "how": "transformers fp32, in the bench process",
            "n": len(reference),
        }
        print(f"{task}: fp32 reference on {len(items)} sentences in {time.perf_counter() - t0:.1f} s", flush=True)
        for peer in peers:
            run_peer(peer, items, reference, gold, args, quiet, results)
    if any(peer["server"] == "infinity" for peer in results["peers"]) and infinity_env.is_ready(args.work_dir):
        results["infinity_versions"] = infinity_env.versions(args.work_dir)
    results["summary"] = summarize(results["rows"])
    results["plots"] = []
    if args.plot:
        for task in tasks:
            rows = [r for r in results["rows"] if r["task"] == task]
            if rows:
                results["plots"] += plot(
                    rows,
                    args.plot_dir / f"peers-{task}.png",
                    title=f"{task}: single SST-2 sentences, {machine().get('cpus')} CPUs",
                )
    print_results(results)
    write_json(out, results)
    print(f"\nwrote {out} {' '.join(results['plots'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
