"""Issue 11's figures for a hostile /qa: a 1 MB context at the largest doc_stride must get its 413 fast and
cheaply, and short /classify requests must keep their latency while 4 such requests run.

    python -m bench.qa_bound                 # starts `python -m serving` (the demo model) on a free port
    python -m bench.qa_bound --model DIR     # another model; --url URL to measure a running server

Prints the figures and writes bench/results/qa_bound.json."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

from bench.common import REPO, machine, percentile, write_json

CONTEXT_1MB = ("The quick brown fox jumps over the lazy dog near the river bank. " * 16_000)[:1_000_000]


def _rss_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def _classify_latencies(client: httpx.Client, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.post("/classify", json={"inputs": "nice"})
        response.raise_for_status()
        out.append(time.perf_counter() - started)
    return out


def measure(url: str, pid: int | None, requests: int = 300) -> dict:
    client = httpx.Client(base_url=url, timeout=60)
    schema = client.get("/openapi.json").json()["components"]["schemas"]["QARequest"]["properties"]["doc_stride"]
    stride = next(b["maximum"] for b in schema["anyOf"] if b.get("type") == "integer")
    body = json.dumps(
        {"question": "What does the fox jump over?", "context": CONTEXT_1MB, "doc_stride": stride}
    ).encode()
    peak_before = _rss_mb(pid, "VmHWM") if pid else None
    refusals = []
    for _ in range(5):
        started = time.perf_counter()
        response = client.post("/qa", content=body, headers={"content-type": "application/json"})
        refusals.append(time.perf_counter() - started)
        assert response.status_code == 413, response.text
    result = {
        "machine": machine(),
        "doc_stride": stride,
        "refusal_s": refusals,
        "peak_rss_growth_mb": (_rss_mb(pid, "VmHWM") - peak_before) if pid else None,
    }
    idle = _classify_latencies(client, requests)
    stop, answered = threading.Event(), [0]

    def heavy():
        with httpx.Client(base_url=url, timeout=60) as own:
            while not stop.is_set():
                own.post("/qa", content=body, headers={"content-type": "application/json"})
                answered[0] += 1

    threads = [threading.Thread(target=heavy) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    loaded = _classify_latencies(client, requests)
    stop.set()
    for t in threads:
        t.join()
    result.update(
        idle_p50_ms=statistics.median(idle) * 1000,
        idle_p99_ms=percentile(idle, 99) * 1000,
        loaded_p50_ms=statistics.median(loaded) * 1000,
        loaded_p99_ms=percentile(loaded, 99) * 1000,
        heavy_answered=answered[0],
    )
    result["p99_ratio"] = result["loaded_p99_ms"] / result["idle_p99_ms"]
    if pid:
        result["peak_rss_growth_mb"] = _rss_mb(pid, "VmHWM") - peak_before
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (its RSS is not measured)")
    parser.add_argument("--model", help="model for the server this starts (default: the demo model)")
    parser.add_argument("--requests", type=int, default=300, help="/classify requests per phase")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "qa_bound.json"))
    args = parser.parse_args(argv)
    process = None
    url = args.url
    if url is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "serving", "--port", str(port), "--log-level", "warning"]
        process = subprocess.Popen(command + (["--model", args.model] if args.model else []), cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    try:
        result = measure(url, process.pid if process else None, args.requests)
    finally:
        if process:
            process.terminate()
            process.wait(30)
    print(
        f"1 MB /qa context, doc_stride {result['doc_stride']}: 413 in {min(result['refusal_s']) * 1000:.0f}-"
        f"{max(result['refusal_s']) * 1000:.0f} ms; peak RSS growth {result['peak_rss_growth_mb']} MB"
    )
    print(
        f"/classify p99 idle {result['idle_p99_ms']:.1f} ms (p50 {result['idle_p50_ms']:.1f}); with 4 of those "
        f"/qa requests running {result['loaded_p99_ms']:.1f} ms (p50 {result['loaded_p50_ms']:.1f}): "
        f"{result['p99_ratio']:.2f}x"
    )
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
