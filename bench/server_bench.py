"""Server-level benchmark: bertserve vs the baseline server a user would write, same machine, same run.

    python -m bench.server_bench --ckpt serving/demo_model --task classify --concurrency 1,8,32,64
    python -m bench.server_bench --ckpt runs/sst2/best --task classify --bertserve-args "--backend onnxruntime"

Starts each server in turn on a free loopback port (never both at once: they would share the CPU),
then sweeps concurrency with an asyncio load generator (raw keep-alive HTTP/1.1 by default, httpx with
--client httpx) sending real texts (SST-2
sentences; SQuAD questions with their contexts for qa; CoNLL sentences for ner). Each level runs
for --seconds after a warm-up. Reports requests/s, p50/p95/p99 latency and errors; prints a table,
writes JSON, and with matplotlib installed draws throughput and p99 against concurrency (PNG).
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.common import DATA_DIR, REPO, machine, percentile, print_table, sst2_sample, write_json


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def payloads(task: str, n: int = 2000) -> list[dict]:
    if task == "classify":
        return [{"inputs": s} for s, _ in sst2_sample(n)]
    if task == "ner":
        sentences, words = [], []
        for line in (DATA_DIR / "conll2003" / "valid.txt").read_text().splitlines():
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append({"inputs": " ".join(words)})
                words = []
            else:
                words.append(line.split()[0])
        return sentences[:n]
    out = []
    with gzip.open(DATA_DIR / "squad-train" / "train-v1.1.part-04.json.gz", "rt") as f:
        for article in reversed(json.load(f)["data"]):
            for para in article["paragraphs"]:
                for qa in para["qas"]:
                    out.append({"question": qa["question"], "context": para["context"]})
                    if len(out) >= n:
                        return out
    return out


def start(cmd: list[str], port: int, timeout: float = 300.0) -> subprocess.Popen:
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    ready = "/ready" if "serving" in cmd else "/health"
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server on port {port} not ready after {timeout:.0f} s")


class RawConnection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON: the load generator's default transport.

    The load generator shares the machine with the server it measures, so it must be cheap: measured
    here at 32 clients, httpx spends 2.5 ms of CPU per request and this 0.09 ms (docs/benchmarks.md),
    CPU that both servers would otherwise lose to the client. Responses must carry Content-Length
    (uvicorn's do for JSON bodies)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post(self, path: str, body: dict) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith(b"content-length:")), None)
        if length is None:
            raise ConnectionError("response without Content-Length")
        await self.reader.readexactly(length)
        if any(line.lower() == b"connection: close" for line in lines[1:]):
            await self.close()
        return int(lines[0].split()[1])

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def load(url: str, bodies: list[dict], concurrency: int, seconds: float, warmup: float,
               client: str = "raw") -> dict:
    """`concurrency` closed-loop clients, each sending its next request when the last is answered."""
    latencies: list[float] = []
    errors = 0
    status: dict[int, int] = {}
    stop_at = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup
    counter = iter(range(10**9))
    parsed = httpx.URL(url)

    async def worker(send) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            body = bodies[next(counter) % len(bodies)]
            t0 = time.perf_counter()
            try:
                code = await send(body)
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ValueError):
                code = 0
            if t0 >= measure_from:
                status[code] = status.get(code, 0) + 1
                if code == 200:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1

    async def raw_worker() -> None:
        conn = RawConnection(parsed.host, parsed.port)

        async def send(body):
            try:
                return await conn.post(parsed.path, body)
            except BaseException:
                await conn.close()  # a fresh connection for the next request
                raise
        try:
            await worker(send)
        finally:
            await conn.close()

    if client == "raw":
        await asyncio.gather(*(raw_worker() for _ in range(concurrency)))
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            async def send(body):
                return (await http.post(url, json=body)).status_code
            await asyncio.gather(*(worker(send) for _ in range(concurrency)))
    ok = len(latencies)
    return {"requests_per_s": ok / seconds, "ok": ok, "errors": errors, "status": status,
            "p50_ms": percentile(latencies, 50) * 1e3 if ok else None,
            "p95_ms": percentile(latencies, 95) * 1e3 if ok else None,
            "p99_ms": percentile(latencies, 99) * 1e3 if ok else None}


def server_counters(port: int) -> dict[str, float]:
    """bertserve's batch counters from /metrics (sum and count of batch sizes, model seconds); {} elsewhere."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    wanted = ("bertserve_batch_size_sum", "bertserve_batch_size_count", "bertserve_inference_duration_seconds_sum")
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.split(" ")[0] in wanted}


def sweep(name: str, cmd: list[str], port: int, task: str, bodies, levels, seconds, warmup,
          client: str = "raw") -> list[dict]:
    proc = start(cmd, port)
    rows = []
    try:
        for c in levels:
            before, cpu0 = server_counters(port), time.process_time()
            r = asyncio.run(load(f"http://127.0.0.1:{port}/{task}", bodies, c, seconds, warmup, client))
            # The load generator shares the machine: its own CPU use is part of the picture.
            r["client_cpu_share"] = (time.process_time() - cpu0) / (seconds + warmup)
            after = server_counters(port)
            if after.get("bertserve_batch_size_count", 0) > before.get("bertserve_batch_size_count", 0):
                batches = after["bertserve_batch_size_count"] - before["bertserve_batch_size_count"]
                r["mean_batch"] = (after["bertserve_batch_size_sum"] - before["bertserve_batch_size_sum"]) / batches
                r["model_busy_share"] = (after["bertserve_inference_duration_seconds_sum"]
                                         - before["bertserve_inference_duration_seconds_sum"]) / (seconds + warmup)
            rows.append({"server": name, "concurrency": c, **r})
            extra = (f"  batch {r['mean_batch']:5.1f}  model busy {100 * r['model_busy_share']:3.0f} %"
                     if "mean_batch" in r else "")
            print(f"{name:10s} c={c:<4d} {r['requests_per_s']:8.1f} req/s  p50 {r['p50_ms'] or 0:8.1f}  "
                  f"p99 {r['p99_ms'] or 0:8.1f} ms  errors {r['errors']}  load-generator CPU "
                  f"{100 * r['client_cpu_share']:3.0f} %{extra}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def plot(rows: list[dict], out: Path) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots")
        return []
    files = []
    for key, label in (("requests_per_s", "requests/s"), ("p99_ms", "p99 latency (ms)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for server in sorted({r["server"] for r in rows}):
            pts = [(r["concurrency"], r[key]) for r in rows if r["server"] == server and r[key] is not None]
            ax.plot(*zip(*pts), marker="o", label=server)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(alpha=0.3)
        path = out.with_name(f"{out.stem}-{key}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        files.append(str(path))
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint both servers load (bertserve may serve an artifact via --bertserve-model)")
    p.add_argument("--bertserve-model", help="what bertserve serves (default: --ckpt), e.g. an ONNX artifact directory")
    p.add_argument("--bertserve-args", default="", help="extra flags for `python -m serving`")
    p.add_argument("--task", choices=("classify", "ner", "qa"), default="classify")
    p.add_argument("--concurrency", default="1,4,16,32,64", help="comma list of concurrent clients")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each level")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="load generator transport: raw asyncio HTTP/1.1 (cheap) or httpx (2.5 ms CPU per request)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "server_bench.json"))
    args = p.parse_args(argv)

    levels = [int(c) for c in args.concurrency.split(",")]
    bodies = payloads(args.task)
    rows = []
    port = free_port()
    ours = [sys.executable, "-m", "serving", "--model", args.bertserve_model or args.ckpt, "--port", str(port),
            "--threads", str(args.threads), *shlex.split(args.bertserve_args)]
    rows += sweep("bertserve", ours, port, args.task, bodies, levels, args.seconds, args.warmup, args.client)
    if not args.skip_baseline:
        port = free_port()
        base = [sys.executable, "-m", "bench.baseline_server", "--ckpt", str(args.ckpt), "--task", args.task,
                "--port", str(port), "--threads", str(args.threads)]
        rows += sweep("baseline", base, port, args.task, bodies, levels, args.seconds, args.warmup, args.client)
        by = {(r["server"], r["concurrency"]): r for r in rows}
        for c in levels:
            b = by[("baseline", c)]["requests_per_s"]
            by[("bertserve", c)]["speedup"] = by[("bertserve", c)]["requests_per_s"] / b if b else None
    print()
    print_table(rows, [("server", "server"), ("concurrency", "clients"), ("requests_per_s", "req/s"),
                       ("p50_ms", "p50 ms"), ("p95_ms", "p95 ms"), ("p99_ms", "p99 ms"), ("errors", "errors"),
                       ("speedup", "speedup"), ("mean_batch", "batch"), ("client_cpu_share", "client CPU")])
    out = Path(args.out)
    plots = plot(rows, out)
    write_json(out, {"machine": machine(), "task": args.task, "ckpt": str(args.ckpt), "seconds": args.seconds,
                     "bertserve_args": args.bertserve_args, "client": args.client, "rows": rows, "plots": plots})
    print(f"\nwrote {out} {' '.join(plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
