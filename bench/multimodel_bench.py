"""Several models in one server: does load on one starve another?

One server holds two /classify models, `busy` and `quiet` (by default the demo model's directory under both names:
one backend, loaded once, two queues, one compute gate). `quiet` is measured by one closed-loop client, first
while the server is otherwise idle, then while 32 clients load `busy`. The goal: quiet's p50 under load within 2x
of its idle p50. The busy model's throughput is measured alone too (no quiet client): what the gate's small
batches under contention cost it, and what one model alone gets (single-model throughput). Both with torch (the
checkpoint) and onnxruntime (its fp32 export, made here once and kept in --workdir).

    python -m bench.multimodel_bench --json bench/results/multimodel.json

--comparisons adds two reference points on the same load: the quiet client sending to `busy` itself (one queue
shared with the load: what a model without a queue of its own would see) and the quiet model on a server of its
own while a second server takes the load (two servers on the same cores). --baseline DIR runs every phase again
with the servers started from another checkout DIR (e.g. `git worktree add /tmp/base main`), back to back: an A/B
of the serving code on one machine in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import DATA_DIR, REPO, machine, print_table, sst2_sample, write_json
from bench.server_bench import free_port, load, start, stop

SENTENCES = [
    "a gripping, beautifully shot film",
    "the plot is thin and the acting is worse",
    "an honest, funny and moving portrait of a family",
    "it drags on for far too long",
]


def texts(n: int = 200) -> list[str]:
    if (DATA_DIR / "SST-2" / "dev.tsv").is_file():
        return [sentence for sentence, _ in sst2_sample(n)]
    return SENTENCES


def onnx_export(checkpoint: str, workdir: Path) -> Path:
    """The fp32 ONNX export of `checkpoint` (every head it has), made once per --workdir."""
    out = workdir / f"{Path(checkpoint).name}-onnx-fp32"
    if (out / "manifest.json").is_file():
        return out
    cmd = [sys.executable, "-m", "export.onnx", "--ckpt", checkpoint]
    cmd += ["--precision", "fp32", "--out", str(out)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    return out


async def measure(
    url: str,
    quiet: list[dict] | None,
    busy: list[dict] | None,
    clients: int,
    seconds: float,
    busy_url: str | None = None,
) -> dict:
    """The quiet client's latencies (None: no quiet client), with `clients` more loading `busy` meanwhile (None: no
    load), on `busy_url` (default: the same server)."""
    runs = {}
    if quiet is not None:
        runs["quiet"] = load(url, quiet, 1, seconds, warmup=1.0)
    if busy is not None:  # covers the quiet client's whole run
        runs["busy"] = load(busy_url or url, busy, clients, seconds + 1.0, warmup=0.5)
    results = await asyncio.gather(*runs.values())
    return {"quiet": None, "busy": None, **dict(zip(runs, results))}


def run_backend(args, backend: str, model: str, code: Path, label: str) -> list[dict]:
    """Every phase for one backend's model directory, servers started from the checkout `code`."""
    env = {"PYTHONPATH": str(code)}

    def server(port: int, *models: str) -> subprocess.Popen:
        flags = [a for m in models for a in ("--classify-model", m)]
        threads = ["--threads", str(args.threads)] if args.threads else []
        cmd = [sys.executable, "-m", "serving", "--port", str(port), "--log-level", "warning", *flags, *threads]
        return start(cmd, port, cwd=code, env=env)

    port = free_port()
    url = f"http://127.0.0.1:{port}/classify"
    sample = texts()
    bodies = {name: [{"inputs": t, "model": name} for t in sample] for name in ("busy", "quiet")}
    phases: list[tuple[str, dict]] = []
    proc = server(port, f"busy={model}", f"quiet={args.quiet or model}")
    try:
        run = lambda quiet, busy, **kw: asyncio.run(measure(url, quiet, busy, args.clients, args.seconds, **kw))  # noqa: E731
        phases.append(("quiet model, server idle", run(bodies["quiet"], None)))
        phases.append((f"quiet model, {args.clients} clients on busy", run(bodies["quiet"], bodies["busy"])))
        phases.append((f"busy model alone, {args.clients} clients", run(None, bodies["busy"])))
        if args.comparisons:
            phases.append((f"one queue: busy model, {args.clients} clients on it", run(bodies["busy"], bodies["busy"])))
    finally:
        stop(proc)
    if args.comparisons:  # the quiet model stays on a server; the load goes to a server of its own
        proc, other = server(port, f"quiet={args.quiet or model}"), free_port()
        second = server(other, f"busy={model}")
        try:
            busy_url = f"http://127.0.0.1:{other}/classify"
            two = asyncio.run(measure(url, bodies["quiet"], bodies["busy"], args.clients, args.seconds, busy_url))
            phases.append((f"two servers: quiet alone, {args.clients} clients on the other", two))
        finally:
            stop(second)
            stop(proc)
    base = phases[0][1]["quiet"]["p50_ms"]
    return [{"backend": backend, "code": label, "phase": phase, **_row(result, base)} for phase, result in phases]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", default=str(REPO / "serving" / "demo_model"), help="checkpoint of the loaded model")
    p.add_argument("--quiet", default=None, help="directory of the measured model (default: --busy's)")
    p.add_argument("--backends", default="torch,onnxruntime", help="comma-separated: torch, onnxruntime")
    p.add_argument("--clients", type=int, default=32, help="closed-loop clients loading the busy model")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per phase")
    p.add_argument("--threads", type=int, default=None, help="--threads of the server (default: its own)")
    p.add_argument("--comparisons", action="store_true", help="add the one-queue and two-server phases")
    p.add_argument("--baseline", default=None, help="another checkout: every phase again with its servers (A/B)")
    p.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "bertserve-multimodel-bench"))
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.quiet and "onnxruntime" in args.backends:
        p.error("--quiet names one directory; run it with --backends of that directory's kind")

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    models = {"torch": args.busy}
    if "onnxruntime" in args.backends.split(","):
        models["onnxruntime"] = str(onnx_export(args.busy, workdir))
    codes = [(REPO, "this")] + ([(Path(args.baseline).resolve(), "baseline")] if args.baseline else [])
    rows = []
    for backend in args.backends.split(","):
        for code, label in codes:
            rows += run_backend(args, backend, models[backend], code, label)

    print(f"\nmachine: {machine()} load average {os.getloadavg()[0]:.1f}")
    columns = [("backend", "backend"), ("phase", "measured")]
    columns += [("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("ratio", "p50 / idle p50"), ("busy_rps", "busy req/s")]
    print_table(rows, columns[:1] + ([("code", "code")] if args.baseline else []) + columns[1:])
    verdicts = {}
    for row in rows:
        if row["phase"].startswith("quiet model,") and "clients on busy" in row["phase"]:
            key = f"{row['backend']} ({row['code']})" if args.baseline else row["backend"]
            verdicts[key] = row["ratio"]
            met = row["ratio"] is not None and row["ratio"] <= 2
            print(
                f"{key}: quiet p50 under load / idle: {row['ratio']:.2f}x (goal: within 2x) -> {'met' if met else 'not met'}"
            )
    if args.json:
        payload = {"machine": machine(), "args": vars(args), "rows": rows, "ratios": verdicts}
        payload["goal_met"] = all(r is not None and r <= 2 for r in verdicts.values())
        print("wrote", write_json(args.json, payload))
    return 0


def _row(result: dict, base: float) -> dict:
    quiet, busy = result["quiet"], result["busy"]
    return {
        "p50_ms": quiet["p50_ms"] if quiet else None,
        "p99_ms": quiet["p99_ms"] if quiet else None,
        "ratio": quiet["p50_ms"] / base if quiet and quiet["p50_ms"] and base else None,
        "busy_rps": busy["requests_per_s"] if busy else None,
        "errors": (quiet["errors"] if quiet else 0) + (busy["errors"] if busy else 0),
    }


if __name__ == "__main__":
    sys.exit(main())
