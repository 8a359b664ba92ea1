"""Server-level benchmark: bertserve vs the baseline server a user would write, same machine, same run.

    python -m bench.server_bench --ckpt serving/demo_model --task classify --concurrency 1,8,32,64
    python -m bench.server_bench --ckpt runs/sst2/best --task classify --bertserve-args "--backend onnxruntime"

Starts each server in turn on a free loopback port (never both at once: they would share the CPU),
then sweeps concurrency with an asyncio load generator (raw keep-alive HTTP/1.1 by default, httpx with
--client httpx) sending real texts (SST-2
sentences; SQuAD questions with their contexts for qa; CoNLL sentences for ner). Each level runs
for --seconds after a warm-up, once the machine is quiet (--busy). Reports requests/s, p50/p95/p99
latency, errors, and the CPU the server, the load generator and everything else used; prints a
table, writes JSON, and with matplotlib installed draws throughput and p99 against concurrency (PNG).

The load generator and the sweep drive any peer (bench/peers: a command line plus an adapter to its
HTTP API); `python -m bench.peers` runs the same load against infinity and bertserve's variants.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import itertools
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import DATA_DIR, REPO, machine, percentile, print_table, sst2_sample, write_json
from bench.cpu import CpuMeter, wait_until_quiet
from bench.peers import Peer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work_items(task: str, n: int = 2000) -> list:
    """What the load generator sends, before an adapter shapes it: SST-2 dev sentences (classify, embed),
    CoNLL-2003 valid sentences (ner), {"question", "context"} dicts from SQuAD (qa), {"query", "texts"} dicts
    of a SQuAD question and RERANK_TEXTS sentences of its article, its own paragraph's first (rerank)."""
    if task in ("classify", "embed"):
        return [s for s, _ in sst2_sample(n)]
    if task == "rerank":
        return rerank_items(n)
    if task == "ner":
        from bert.tasks.ner import read_conll

        return [" ".join(sentence.words) for sentence in read_conll(DATA_DIR / "conll2003" / "valid.txt")][:n]
    out = []
    with gzip.open(DATA_DIR / "squad-train" / "train-v1.1.part-04.json.gz", "rt") as f:
        for article in reversed(json.load(f)["data"]):
            for para in article["paragraphs"]:
                for qa in para["qas"]:
                    out.append({"question": qa["question"], "context": para["context"]})
                    if len(out) >= n:
                        return out
    return out


RERANK_TEXTS = 20


def rerank_items(n: int, texts: int = RERANK_TEXTS) -> list[dict]:
    """Per SQuAD question of the last articles of part-04 (never trained on: bert.tasks.qa.split_heldout), the
    question and `texts` sentences of its article: its paragraph's, then the other paragraphs' in order."""
    from bert.tasks.rerank import article_requests

    with gzip.open(DATA_DIR / "squad-train" / "train-v1.1.part-04.json.gz", "rt") as f:
        articles = json.load(f)["data"]
    requests = (r for article in reversed(articles) for r in article_requests(article, texts))
    return [{"query": query, "texts": candidates} for query, candidates in itertools.islice(requests, n)]


class ServerFailed(RuntimeError):
    """The server exited or never got ready. `headline`: the line of its log that says why; `log`: its tail."""

    def __init__(self, what: str, log: str):
        self.headline = f"{what}: {log_headline(log)}"
        self.log = log
        super().__init__(f"{self.headline}\n{log}")


def start(
    cmd: list[str],
    port: int,
    timeout: float = 300.0,
    ready_path: str | None = None,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start a server and wait until GET ready_path answers 200 (default: /ready for bertserve, /health
    otherwise). Its output goes to a log file (proc.log_path), never to an unread pipe that could fill
    and stall it; the log's tail is in the error when it exits or never gets ready."""
    print("$", " ".join(cmd), flush=True)
    log = tempfile.NamedTemporaryFile("w", prefix="bench-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    proc.log_path = log.name
    deadline = time.time() + timeout
    ready = ready_path or ("/ready" if "serving" in cmd else "/health")
    while time.time() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"server exited with {proc.returncode}", log_tail(proc))
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise ServerFailed(f"server on port {port} not ready after {timeout:.0f} s", log_tail(proc))


def log_headline(log: str) -> str:
    """The line of a server log that says what went wrong: the last that mentions an error (a traceback's
    last line, "error: ..."), else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    said = [line for line in lines if "error" in line.lower() and "application startup failed" not in line.lower()]
    return (said or lines or ["(no output)"])[-1]


def log_tail(proc: subprocess.Popen, chars: int = 2000) -> str:
    try:
        return Path(proc.log_path).read_text(errors="replace")[-chars:]
    except (AttributeError, OSError):
        return ""


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def serve(peer: Peer, port: int | None = None, timeout: float = 300.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """The peer's server, running and ready, as (process, base URL); stopped on exit."""
    port = port or free_port()
    proc = start(peer.command(port), port, timeout, peer.ready_path, peer.cwd, peer.env)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        with contextlib.suppress(OSError):
            os.unlink(proc.log_path)


@contextlib.contextmanager
def bertserve(model, *flags: str, port: int | None = None) -> Iterator[str]:
    """`python -m serving --model MODEL FLAGS` (log level warning), running and ready, as its base URL; stopped on
    exit."""
    port = port or free_port()
    proc = start(
        [sys.executable, "-m", "serving", "--model", str(model), "--port", str(port), "--log-level", "warning", *flags],
        port,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


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
        return (await self.request(path, body))[0]

    async def request(self, path: str, body: dict) -> tuple[int, bytes]:
        """(status, response body)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            (int(line.split(b":", 1)[1]) for line in lines[1:] if line.lower().startswith(b"content-length:")), None
        )
        if length is None:
            raise ConnectionError("response without Content-Length")
        payload = await self.reader.readexactly(length)
        if any(line.lower() == b"connection: close" for line in lines[1:]):
            await self.close()
        return int(lines[0].split()[1]), payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def load(
    url: str,
    bodies: list[dict],
    concurrency: int,
    seconds: float,
    warmup: float,
    client: str = "raw",
    meter: CpuMeter | None = None,
) -> dict:
    """`concurrency` closed-loop clients, each sending its next request when the last is answered.
    With a meter, the CPU used during the measured seconds (not the warm-up) is in the result."""
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

    async def start_meter() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        meter.start()

    marks = [start_meter()] if meter else []
    if client == "raw":
        await asyncio.gather(*marks, *(raw_worker() for _ in range(concurrency)))
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:

            async def send(body):
                return (await http.post(url, json=body)).status_code

            await asyncio.gather(*marks, *(worker(send) for _ in range(concurrency)))
    ok = len(latencies)
    return {
        "requests_per_s": ok / seconds,
        "ok": ok,
        "errors": errors,
        "status": status,
        "p50_ms": percentile(latencies, 50) * 1e3 if ok else None,
        "p95_ms": percentile(latencies, 95) * 1e3 if ok else None,
        "p99_ms": percentile(latencies, 99) * 1e3 if ok else None,
        **(meter.stop() if meter else {}),
    }


async def collect(url: str, bodies: list[dict], concurrency: int = 8) -> list[tuple[int, bytes]]:
    """Each body sent once, `concurrency` at a time, over the load generator's transport: (status,
    response body) in the order of `bodies`. For scoring answers, not for timing."""
    parsed = httpx.URL(url)
    out: list[tuple[int, bytes]] = [(0, b"")] * len(bodies)
    todo = iter(range(len(bodies)))

    async def worker() -> None:
        conn = RawConnection(parsed.host, parsed.port)
        try:
            for i in todo:
                try:
                    out[i] = await conn.request(parsed.path, bodies[i])
                except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                    await conn.close()
                    out[i] = (0, str(e).encode())
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def server_counters(server: int | str) -> dict[str, float]:
    """bertserve's batch counters from /metrics (sum and count of batch sizes, model seconds); {} elsewhere.
    `server`: a port on 127.0.0.1, or a base URL."""
    base = f"http://127.0.0.1:{server}" if isinstance(server, int) else server.rstrip("/")
    try:
        response = httpx.get(f"{base}/metrics", timeout=5)
    except httpx.HTTPError:
        return {}
    wanted = ("bertserve_batch_size_sum", "bertserve_batch_size_count", "bertserve_inference_duration_seconds_sum")
    return {
        line.split()[0]: float(line.split()[1])
        for line in response.text.splitlines()
        if response.status_code == 200 and line.split(" ")[0] in wanted
    }


def batch_figures(before: dict[str, float], after: dict[str, float], window_s: float) -> dict[str, float]:
    """From two server_counters readings: the mean batch between them and the share of `window_s` the model ran;
    {} where the server counted no batch (not bertserve, or idle)."""
    batches = after.get("bertserve_batch_size_count", 0) - before.get("bertserve_batch_size_count", 0)
    if batches <= 0:
        return {}
    return {
        "mean_batch": (after["bertserve_batch_size_sum"] - before["bertserve_batch_size_sum"]) / batches,
        "model_busy_share": (
            after["bertserve_inference_duration_seconds_sum"] - before["bertserve_inference_duration_seconds_sum"]
        )
        / window_s,
    }


@dataclass
class QuietPolicy:
    """What to do when other processes use the CPU before a level (see bench.cpu.wait_until_quiet)."""

    busy: str = "wait"  # warn | wait | refuse
    max_other_cores: float = 0.25  # CPU (in cores) that other processes may use while we measure
    max_wait_s: float = 120.0
    sample_s: float = 1.0  # how long each check watches the machine


def run_levels(
    peer: Peer,
    proc: subprocess.Popen,
    url: str,
    items: list,
    levels: list[int],
    seconds: float,
    warmup: float,
    client: str = "raw",
    quiet: QuietPolicy | None = None,
) -> list[dict]:
    """Sweep concurrency against a running peer: a quiet check, then `seconds` of closed-loop load
    after `warmup`, per level."""
    quiet = quiet or QuietPolicy()
    port = httpx.URL(url).port
    bodies = [peer.adapter.body(item) for item in items]
    rows = []
    for c in levels:
        check = wait_until_quiet(
            {proc.pid, os.getpid()}, quiet.max_other_cores, quiet.busy, quiet.max_wait_s, quiet.sample_s
        )
        before = server_counters(port)
        r = asyncio.run(load(url + peer.adapter.path, bodies, c, seconds, warmup, client, CpuMeter(proc.pid)))
        r["load_check"] = check
        r["busy"] = check["busy"] or r["other_cpu_cores"] > quiet.max_other_cores
        if r["server_cpu_cores"]:
            r["requests_per_server_cpu_s"] = r["requests_per_s"] / r["server_cpu_cores"]
        r.update(batch_figures(before, server_counters(port), seconds + warmup))
        rows.append({"peer": peer.name, "server": peer.server, "task": peer.task, "concurrency": c, **r})
        extra = (
            f"  batch {r['mean_batch']:5.1f}  model busy {100 * r['model_busy_share']:3.0f} %"
            if "mean_batch" in r
            else ""
        )
        print(
            f"{peer.name:22s} c={c:<4d} {r['requests_per_s']:8.1f} req/s  p50 {r['p50_ms'] or 0:8.1f}  "
            f"p99 {r['p99_ms'] or 0:8.1f} ms  errors {r['errors']}  CPU server {r['server_cpu_cores']:.2f} "
            f"client {r['client_cpu_cores']:.2f} other {r['other_cpu_cores']:.2f}"
            f"{'  BUSY' if r['busy'] else ''}{extra}",
            flush=True,
        )
    return rows


def sweep(
    peer: Peer,
    items: list,
    levels: list[int],
    seconds: float,
    warmup: float,
    client: str = "raw",
    quiet: QuietPolicy | None = None,
) -> list[dict]:
    """Start the peer, sweep the levels, stop it."""
    if peer.prepare:
        peer.prepare()
    with serve(peer) as (proc, url):
        return run_levels(peer, proc, url, items, levels, seconds, warmup, client, quiet)


def plot(rows: list[dict], out: Path, title: str = "") -> list[str]:
    """requests/s and p99 against concurrency, one line per peer: OUT-requests_per_s.png, OUT-p99_ms.png.
    Line style by server (bertserve solid, others dashed or dotted); a level measured while other processes
    used the CPU (busy) has a hollow marker."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots")
        return []
    files = []
    for key, label in (("requests_per_s", "requests/s"), ("p99_ms", "p99 latency (ms)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        styles = {}
        for peer in dict.fromkeys(r["peer"] for r in rows):
            mine = [r for r in rows if r["peer"] == peer and r[key] is not None]
            if not mine:
                continue
            server = mine[0].get("server", peer)
            style = styles.setdefault(server, ("-", "--", ":", "-.")[len(styles) % 4])
            (line,) = ax.plot([r["concurrency"] for r in mine], [r[key] for r in mine], style, label=peer)
            for r in mine:
                ax.plot(
                    r["concurrency"],
                    r[key],
                    "o",
                    color=line.get_color(),
                    markerfacecolor="none" if r.get("busy") else line.get_color(),
                )
        if any(r.get("busy") for r in rows):
            ax.text(
                0.99,
                0.01,
                "hollow marker: machine busy",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize="x-small",
                color="gray",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        if key == "p99_ms":
            ax.set_yscale("log")
        if title:
            ax.set_title(title)
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
        path = out.with_name(f"{out.stem}-{key}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        files.append(str(path))
    return files


def add_quiet_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--busy",
        choices=("warn", "wait", "refuse"),
        default="wait",
        help="before each level, when other processes use more than --max-other-cpu cores: measure "
        "anyway and flag the level (warn), wait up to --busy-wait seconds for quiet (wait), "
        "or stop (refuse)",
    )
    p.add_argument("--max-other-cpu", type=float, default=0.25, help="cores other processes may use (default 0.25)")
    p.add_argument("--busy-wait", type=float, default=120.0, help="longest wait for a quiet machine, seconds")
    p.add_argument("--check-seconds", type=float, default=1.0, help="how long each quiet check watches the machine")


def main(argv=None) -> int:
    from bench.peers.catalog import baseline_peer, bertserve_peer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--ckpt",
        required=True,
        help="checkpoint both servers load (bertserve may serve an artifact via --bertserve-model)",
    )
    p.add_argument("--bertserve-model", help="what bertserve serves (default: --ckpt), e.g. an ONNX artifact directory")
    p.add_argument("--bertserve-args", default="", help="extra flags for `python -m serving`")
    p.add_argument("--task", choices=("classify", "ner", "qa"), default="classify")
    p.add_argument("--concurrency", default="1,4,16,32,64", help="comma list of concurrent clients")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each level")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="load generator transport: raw asyncio HTTP/1.1 (cheap) or httpx (2.5 ms CPU per request)",
    )
    add_quiet_arguments(p)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "server_bench.json"))
    args = p.parse_args(argv)

    levels = [int(c) for c in args.concurrency.split(",")]
    quiet = QuietPolicy(args.busy, args.max_other_cpu, args.busy_wait, args.check_seconds)
    items = work_items(args.task)
    peers = [
        bertserve_peer(
            "bertserve", args.task, args.bertserve_model or args.ckpt, args.threads, shlex.split(args.bertserve_args)
        )
    ]
    if not args.skip_baseline:
        peers.append(baseline_peer("baseline", args.task, args.ckpt, args.threads))
    rows = []
    for peer in peers:
        rows += sweep(peer, items, levels, args.seconds, args.warmup, args.client, quiet)
    if not args.skip_baseline:
        by = {(r["peer"], r["concurrency"]): r for r in rows}
        for c in levels:
            b = by[("baseline", c)]["requests_per_s"]
            by[("bertserve", c)]["speedup"] = by[("bertserve", c)]["requests_per_s"] / b if b else None
    print()
    print_table(
        rows,
        [
            ("peer", "server"),
            ("concurrency", "clients"),
            ("requests_per_s", "req/s"),
            ("p50_ms", "p50 ms"),
            ("p95_ms", "p95 ms"),
            ("p99_ms", "p99 ms"),
            ("errors", "errors"),
            ("speedup", "speedup"),
            ("mean_batch", "batch"),
            ("server_cpu_cores", "server CPU"),
            ("client_cpu_cores", "client CPU"),
            ("other_cpu_cores", "other CPU"),
        ],
    )
    out = Path(args.out)
    plots = plot(rows, out)
    write_json(
        out,
        {
            "machine": machine(),
            "task": args.task,
            "ckpt": str(args.ckpt),
            "seconds": args.seconds,
            "bertserve_args": args.bertserve_args,
            "client": args.client,
            "peers": [peer.describe() for peer in peers],
            "rows": rows,
            "plots": plots,
        },
    )
    print(f"\nwrote {out} {' '.join(plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
