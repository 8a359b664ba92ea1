"""A/B of two checkouts, interleaved: both servers up at once, the same load on each in turn, in short windows.

    git worktree add --detach ../before f08e9d4
    python -m bench.ab --before ../before --task classify,embed --concurrency 8,32 --rounds 8 --seconds 5
    python -m bench.ab --before ../before --task classify --model serving/demo_model   # one model, each server
    python -m bench.ab --before ../before --batch-args "--task embed --model MINILM --input X.parquet" --rounds 4
    python -m bench.ab --before . --task classify     # A/A: the noise floor of the method on this machine

Whole runs of the same code minutes apart spread by up to a third on a shared 2-core machine
(docs/benchmarks.md): the machine's speed drifts, and a run-after-run A/B measures the drift. Here both
checkouts' servers run at once (the idle one uses next to no CPU), and each round sends `--seconds` of
closed-loop load (bench/server_bench.py's generator, after `--warmup`) to one, then the other, in ABBA order
(before, after; after, before; ...), so every window of one side has a window of the other seconds away.
Per task and level it reports each side's median requests/s, their ratio (after / before), each round's
ratio, and a bootstrap 95 % interval of the ratio of medians (rounds resampled). By default each checkout
serves its own default export (`python -m export.onnx` of that checkout, no precision flags: bench.peers'
`bertserve-default`); `--model` serves one model on both instead, which separates the server from the graph.

`--batch-args` also runs `python -m batch ARGS --output TMP` from each checkout in turn (ABBA, `--batch-rounds`
rounds) and compares the rows/s each job reports for its time after loading the model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, machine, print_table, write_json
from bench.cpu import CpuMeter, wait_until_quiet
from bench.peers import WORK, PeerUnavailable
from bench.peers import catalog as peer_catalog
from bench.server_bench import (
    ServerFailed,
    add_quiet_arguments,
    batch_figures,
    load,
    serve,
    server_counters,
    work_items,
)

TASKS = ("classify", "embed", "rerank")


def ratio_interval(before: list[float], after: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of median(after) / median(before), each side's rounds resampled."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(after, k=len(after))) / statistics.median(rng.choices(before, k=len(before)))
        for _ in range(draws)
    )
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def compare(before: list[float], after: list[float]) -> dict:
    """The figures one task and level (or the batch job) reports: medians, their ratio, per-round ratios."""
    ratio = statistics.median(after) / statistics.median(before)
    low, high = ratio_interval(before, after)
    return {
        "before": before,
        "after": after,
        "before_median": statistics.median(before),
        "after_median": statistics.median(after),
        "ratio": ratio,
        "ratio_95": [low, high],
        "round_ratios": [a / b for a, b in zip(after, before, strict=True)],
    }


def order(round_index: int) -> tuple[str, str]:
    """ABBA: before first in even rounds, after first in odd ones, so neither side always runs second."""
    return ("before", "after") if round_index % 2 == 0 else ("after", "before")


def side_peer(task: str, root: Path, args) -> object:
    """The peer that runs checkout `root`'s server: its default export of the task's model, or `--model`.
    Exports go under the work directory by checkout (an A/A run shares one)."""
    if args.model:
        return peer_catalog.bertserve_peer(
            "bertserve", task, args.model.resolve(), args.threads, shlex.split(args.server_args), root=root
        )
    work = args.work_dir / ("ab-" + hashlib.sha256(str(root).encode()).hexdigest()[:10])
    peers = peer_catalog.catalog(task, args.classify_model, args.threads, work, False, root, args.rerank_model)
    for peer in peers:
        if peer.name == args.peer:
            return peer
    raise PeerUnavailable(f"no peer {args.peer!r} for {task}; choose from {', '.join(p.name for p in peers)}")


def run_servers(task: str, roots: dict[str, Path], args, rows: list[dict]) -> dict:
    """Both sides' servers for `task`, up at once; `--rounds` ABBA rounds per level. Returns the comparisons."""
    peers = {side: side_peer(task, root, args) for side, root in roots.items()}
    items = work_items(task, args.sample)
    out = {}
    bodies = {side: [peer.adapter.body(item) for item in items] for side, peer in peers.items()}
    with contextlib.ExitStack() as stack:
        running = {}
        for side, peer in peers.items():
            if peer.prepare:
                peer.prepare()
            running[side] = stack.enter_context(serve(peer, timeout=args.startup_timeout))
        pids = {proc.pid for proc, _ in running.values()} | {os.getpid()}
        for c in args.levels:
            measured: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(args.rounds):
                check = wait_until_quiet(pids, args.max_other_cpu, args.busy, args.busy_wait, args.check_seconds)
                for side in order(r):
                    (proc, url), path = running[side], peers[side].adapter.path
                    port = int(url.rsplit(":", 1)[1])
                    counted = server_counters(port)
                    result = asyncio.run(
                        load(url + path, bodies[side], c, args.seconds, args.warmup, "raw", CpuMeter(proc.pid))
                    )
                    if result["errors"] or not result["ok"]:
                        raise RuntimeError(
                            f"{side} ({roots[side]}): {result['errors']} errors, status {result['status']}"
                        )
                    result.update(batch_figures(counted, server_counters(port), args.seconds + args.warmup))
                    measured[side].append(result["requests_per_s"])
                    rows.append(
                        {"task": task, "concurrency": c, "round": r, "side": side, "busy": check["busy"], **result}
                    )
                    print(
                        f"{task:9s} c={c:<3d} round {r + 1}/{args.rounds} {side:6s} {result['requests_per_s']:8.1f} "
                        f"req/s  p50 {result['p50_ms']:7.1f} ms  server CPU {result['server_cpu_cores']:.2f}  "
                        f"other {result['other_cpu_cores']:.2f}{'  BUSY' if check['busy'] else ''}",
                        flush=True,
                    )
            out[str(c)] = compare(measured["before"], measured["after"])
    return out


ROWS_PER_S = re.compile(r"\(([0-9.]+) rows/s")


def run_batch(roots: dict[str, Path], args) -> dict:
    """`python -m batch BATCH_ARGS --output TMP` from each checkout in turn; rows/s after the model loaded."""
    measured: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.batch_rounds or args.rounds):
        for side in order(r):
            out = Path(tempfile.mkdtemp(prefix=f"ab-batch-{side}-"))
            cmd = [sys.executable, "-m", "batch", *shlex.split(args.batch_args), "--output", str(out / "out")]
            print("$", " ".join(cmd), f"(in {roots[side]})", flush=True)
            try:
                run = subprocess.run(cmd, cwd=roots[side], capture_output=True, text=True)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            found = ROWS_PER_S.findall(run.stdout + run.stderr)
            if run.returncode != 0 or not found:
                said = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()] or ["no output"]
                raise RuntimeError(f"batch job in {roots[side]} (exit {run.returncode}): {said[-1].strip()}")
            measured[side].append(float(found[-1]))
            print(f"batch     round {r + 1} {side:6s} {measured[side][-1]:8.1f} rows/s", flush=True)
    return compare(measured["before"], measured["after"])


def print_summary(results: dict) -> None:
    table = []
    for task, levels in results["servers"].items():
        for c, figures in levels.items():
            table.append({"what": f"{task} requests/s", "clients": c, **figures})
    if results.get("batch"):
        table.append({"what": "batch job rows/s", "clients": "-", **results["batch"]})
    for row in table:
        row["interval"] = f"{row['ratio_95'][0]:.3f}-{row['ratio_95'][1]:.3f}"
        row["rounds"] = " ".join(f"{x:.2f}" for x in row["round_ratios"])
    print()
    print_table(
        table,
        [
            ("what", "what"),
            ("clients", "clients"),
            ("before_median", "before (median)"),
            ("after_median", "after (median)"),
            ("ratio", "after / before"),
            ("interval", "95 % interval"),
            ("rounds", "each round's ratio"),
        ],
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="the checkout to compare against (e.g. a worktree)")
    p.add_argument("--after", type=Path, default=REPO, help="the checkout measured (default: this one)")
    p.add_argument("--task", default="classify,embed", help=f"comma list from {', '.join(TASKS)}; '' for none")
    p.add_argument("--peer", default="bertserve-default", help="which bench.peers variant each checkout serves")
    p.add_argument("--model", type=Path, help="serve this model on both sides instead of each side's export")
    p.add_argument("--server-args", default="", help="extra flags for `python -m serving` with --model")
    p.add_argument("--concurrency", default="8,32", help="comma list of concurrent clients")
    p.add_argument("--rounds", type=int, default=8, help="ABBA rounds per level (each side once per round)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per window")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window")
    p.add_argument("--sample", type=int, default=200, help="texts the load cycles through")
    p.add_argument("--threads", type=int, default=2, help="inference threads of each server")
    p.add_argument("--classify-model", type=Path, default=REPO / "serving" / "demo_model")
    p.add_argument("--rerank-model", type=Path, help="cross-encoder directory for --task rerank")
    p.add_argument("--work-dir", type=Path, default=WORK, help="exports (cached per checkout)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--batch-args", default="", help="`python -m batch` arguments (all but --output) to compare too")
    p.add_argument("--batch-rounds", type=int, help="ABBA rounds of the batch job (default: --rounds)")
    add_quiet_arguments(p)
    p.add_argument("--out", type=Path, help="results JSON (default bench/results/ab-TIMESTAMP.json)")
    args = p.parse_args(argv)
    roots = {"before": args.before.resolve(), "after": args.after.resolve()}
    for side, root in roots.items():
        if not (root / "serving" / "__main__.py").is_file():
            print(f"error: --{side} {root} is not a bertserve checkout (no serving/__main__.py)", file=sys.stderr)
            return 2
    tasks = [t for t in args.task.split(",") if t]
    if unknown := set(tasks) - set(TASKS):
        p.error(f"unknown tasks {sorted(unknown)}; choose from {', '.join(TASKS)}")
    if args.rounds < 1 or args.seconds <= 0:
        p.error("--rounds must be at least 1 and --seconds positive")
    try:
        args.levels = [int(c) for c in args.concurrency.split(",") if c]
    except ValueError:
        p.error(f"--concurrency {args.concurrency!r}: a comma list of whole numbers")
    if not args.levels or min(args.levels) < 1:
        p.error("--concurrency needs at least one level of 1 client or more")
    results: dict = {
        "machine": machine(),
        "command": [sys.executable, "-m", "bench.ab", *(argv if argv is not None else sys.argv[1:])],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "roots": {side: str(root) for side, root in roots.items()},
        "commits": {side: _commit(root) for side, root in roots.items()},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "servers": {},
        "rows": [],
    }
    try:
        for task in tasks:
            results["servers"][task] = run_servers(task, roots, args, results["rows"])
        if args.batch_args:
            results["batch"] = run_batch(roots, args)
    except (PeerUnavailable, ServerFailed, RuntimeError) as e:
        print(f"error: {getattr(e, 'headline', None) or e}", file=sys.stderr)
        return 2
    print_summary(results)
    out = args.out or REPO / "bench" / "results" / f"ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json(out, results)
    print(f"\nwrote {out}")
    return 0


def _commit(root: Path) -> str | None:
    run = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
