"""Server level on the GPU: bertserve (torch backend, CUDA) against a user's FastAPI + transformers server.

    python -m bench.gpu.server_level --model serving/demo_model --data DATA --out server.json
    python -m bench.gpu.server_level --dry-run ...          # CPU, 1 and 2 clients, a second each

The demo model (all three heads) behind both servers, one server at a time on a free loopback port;
closed-loop clients (1, 32, 256) send single SST-2 dev sentences to /classify, then SQuAD held-out
questions with their contexts to /qa, over raw keep-alive HTTP/1.1 (asyncio; cheap enough not to be the
bottleneck). Per level: requests/s, p50/p95/p99 latency, errors, and bertserve's mean batch size from
its /metrics. Rows are written to --out as they are measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.common import REPO, machine, percentile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bodies(task: str, data: Path, n: int = 2000) -> list[dict]:
    if task == "classify":
        lines = (data / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
        return [{"inputs": line.split("\t")[0].strip()} for line in lines[:n]]
    parts = sorted((data / "squad-train").glob("train-v1.1.part-*.json.gz"))
    with gzip.open(parts[-1], "rt", encoding="utf-8") as f:
        articles = json.load(f)["data"]
    out = []
    for article in reversed(articles):  # the held-out end of the data, as bench.server_bench
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                out.append({"question": qa["question"], "context": paragraph["context"]})
                if len(out) >= n:
                    return out
    return out


def start(cmd: list[str], port: int, ready: str, log_path: Path, timeout: float) -> subprocess.Popen:
    print("$", " ".join(cmd), flush=True)
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"server not ready after {timeout:.0f} s; see {log_path}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def post(reader, writer, host: str, path: str, body: bytes) -> int:
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines[1:] if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def load(port: int, path: str, payloads: list[dict], clients: int, seconds: float, warmup: float) -> dict:
    """`clients` closed-loop clients on keep-alive connections; counts what finishes after the warm-up."""
    encoded = [json.dumps(b).encode() for b in payloads]
    latencies: list[float] = []
    errors = 0
    begin = time.perf_counter()
    measure_from, stop_at = begin + warmup, begin + warmup + seconds
    counter = iter(range(10**9))

    async def client() -> None:
        nonlocal errors
        conn = None
        while time.perf_counter() < stop_at:
            body = encoded[next(counter) % len(encoded)]
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                code = await post(*conn, f"127.0.0.1:{port}", path, body)
            except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
                code, conn = 0, None
            if t0 >= measure_from:
                if code == 200:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(client() for _ in range(clients)))
    ok = len(latencies)
    return {
        "requests_per_s": ok / seconds,
        "ok": ok,
        "errors": errors,
        "p50_ms": 1e3 * percentile(latencies, 50) if ok else None,
        "p95_ms": 1e3 * percentile(latencies, 95) if ok else None,
        "p99_ms": 1e3 * percentile(latencies, 99) if ok else None,
    }


def batch_counters(port: int) -> dict[str, float]:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    wanted = ("bertserve_batch_size_sum", "bertserve_batch_size_count")
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.split(" ")[0] in wanted}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(REPO / "serving" / "demo_model"))
    p.add_argument("--data", required=True, help="folder with SST-2/dev.tsv and squad-train/")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu_server_level.json"))
    p.add_argument("--tasks", default="classify,qa")
    p.add_argument("--clients", default="1,32,256")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--deadline", type=float, help="unix time to stop starting levels at")
    p.add_argument("--logs", default=None, help="folder for the servers' own output (default: next to --out)")
    p.add_argument("--dry-run", action="store_true", help="CPU, 1 and 2 clients, 1 s per level, classify only")
    args = p.parse_args(argv)

    if args.dry_run:
        args.clients, args.seconds, args.warmup, args.tasks = "1,2", 1.0, 0.25, "classify"
    device = "cpu" if args.dry_run else "cuda"
    out = Path(args.out)
    logs = Path(args.logs) if args.logs else out.parent
    logs.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.clients.split(",")]
    report = {
        "machine": machine(),
        "model": args.model,
        "device": device,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "clients": levels,
        "rows": [],
        "speedup": {},
    }

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".tmp").write_text(json.dumps(report, indent=2) + "\n")
        out.with_suffix(".tmp").replace(out)

    def time_left() -> float:
        return float("inf") if args.deadline is None else args.deadline - time.time()

    needed_per_server = len(levels) * (args.seconds + args.warmup) + 30
    for task in args.tasks.split(","):
        payloads = bodies(task, Path(args.data))
        servers = {
            "bertserve": (
                [
                    sys.executable,
                    "-m",
                    "serving",
                    "--model",
                    args.model,
                    "--device",
                    device,
                    "--backend",
                    "torch",
                    "--log-level",
                    "warning",
                ],
                "/ready",
            ),
            "baseline": (
                [
                    sys.executable,
                    "-m",
                    "bench.gpu.baseline_gpu",
                    "--ckpt",
                    args.model,
                    "--task",
                    task,
                    "--device",
                    device,
                ],
                "/health",
            ),
        }
        for name, (cmd, ready) in servers.items():
            if time_left() < needed_per_server:
                report.setdefault("skipped", []).append(f"{task} {name}: not enough time left")
                save()
                continue
            port = free_port()
            try:
                proc = start(
                    cmd + ["--port", str(port)],
                    port,
                    ready,
                    logs / f"server-{name}-{task}.log",
                    timeout=min(300.0, max(30.0, time_left() - 30)),
                )
            except RuntimeError as e:
                report.setdefault("errors", []).append(f"{task} {name}: {e}")
                save()
                continue
            try:
                for clients in levels:
                    if time_left() < args.seconds + args.warmup + 10:
                        report.setdefault("skipped", []).append(f"{task} {name} {clients} clients: no time left")
                        break
                    before = batch_counters(port)
                    row = asyncio.run(load(port, f"/{task}", payloads, clients, args.seconds, args.warmup))
                    after = batch_counters(port)
                    count = after.get("bertserve_batch_size_count", 0) - before.get("bertserve_batch_size_count", 0)
                    if count > 0:
                        row["mean_batch"] = (
                            after["bertserve_batch_size_sum"] - before["bertserve_batch_size_sum"]
                        ) / count
                    report["rows"].append({"task": task, "server": name, "clients": clients, **row})
                    print(
                        f"{task:8s} {name:10s} {clients:4d} clients {row['requests_per_s']:9.1f} req/s  "
                        f"p50 {row['p50_ms'] or 0:8.1f} ms  p99 {row['p99_ms'] or 0:8.1f} ms  "
                        f"errors {row['errors']}  batch {row.get('mean_batch', 0):.1f}",
                        flush=True,
                    )
                    save()
            finally:
                stop(proc)
        by = {(r["task"], r["server"], r["clients"]): r["requests_per_s"] for r in report["rows"]}
        for clients in levels:
            ours, theirs = by.get((task, "bertserve", clients)), by.get((task, "baseline", clients))
            if ours and theirs:
                report["speedup"][f"{task} {clients}"] = ours / theirs
        save()
    dead = [
        f"{r['task']} {r['server']} {r['clients']} clients: no request answered ({r['errors']} errors)"
        for r in report["rows"]
        if r["ok"] == 0 and r["errors"]
    ]
    if dead:  # only errors, no answer: broken, not slow (its log is in --logs)
        report.setdefault("errors", []).extend(dead)
    report["status"] = "failed" if report.get("errors") else "interrupted" if report.get("skipped") else "ok"
    save()
    print(json.dumps(report["speedup"], indent=2))
    return {"ok": 0, "interrupted": 3, "failed": 1}[report["status"]]


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
