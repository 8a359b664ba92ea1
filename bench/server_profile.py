"""Where a bertserve server's CPU goes under load, per thread and per stage of a request.

    python -m bench.server_profile --model artifacts/demo-int8 --concurrency 32 --seconds 20
    python -m bench.server_profile --model artifacts/demo-int8 --cwd /tmp/head   # another checkout's serving/

Starts `python -m serving` (from --cwd, default this checkout), drives it with the load generator of
bench/server_bench.py (single SST-2 dev sentences to /classify, or /embed with --task embed), and measures
two things at once:
- each thread's CPU, from /proc (exact): the event loop, the codec pool (tokenise, decode), the
  inference workers (onnxruntime runs without the GIL), native threads;
- what the Python threads do while they hold the GIL: `py-spy record --gil --nonblocking --threads`
  (`pip install py-spy`; ptrace). Each sample goes to the first stage of STAGES with a matching frame;
  samples / rate / requests = milliseconds per request holding the GIL in that stage. Only one thread
  holds the GIL at a time, so these add up to at most one core: the ceiling of the Python side.
On a machine other processes load, GIL time includes stretches where the holder waits for a core.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.common import REPO, print_table, write_json
from bench.cpu import CpuMeter, thread_cpu_seconds
from bench.peers.catalog import bertserve_peer
from bench.server_bench import load, serve, work_items

# (stage, frame patterns). A sample goes to the stage of its innermost frame that matches one, so time
# in pydantic under FastAPI is validation, time in a queue put under the engine is a thread hand-off.
STAGES = [
    ("model run", [r"onnxruntime", r"^\w+ \(torch/", r"serving/backends/"]),
    ("tokenize", [r"bert/tokenizer\.py", r"tokenizers/", r"^encode \(bert/tasks/"]),
    ("decode (logits -> labels)", [r"^decode \(bert/tasks/", r"softmax"]),
    ("batching (queue, pad, split)", [r"serving/batcher\.py", r"pad_batch"]),
    ("request validation (pydantic)", [r"pydantic", r"fastapi/dependencies/", r"_validate"]),
    ("JSON (parse, render)", [r"\(json/", r"orjson", r"render \(starlette", r"JSONResponse", r"Request\.(json|body)"]),
    ("metrics (prometheus)", [r"prometheus_client", r"serving/metrics\.py"]),
    (
        "thread hand-offs (executor submit, wake-ups)",
        [
            r"concurrent/futures",
            r"threading\.py",
            r"queue\.py",
            r"run_in_executor",
            r"_chain_future",
            r"call_soon_threadsafe",
        ],
    ),
    ("asyncio / uvloop event loop", [r"asyncio/"]),
    (
        "HTTP + ASGI (uvicorn, starlette, fastapi, middleware)",
        [r"uvicorn/", r"starlette/", r"fastapi/", r"serving/middleware\.py", r"serving/protocol\.py"],
    ),
    ("routes + engine glue", [r"serving/routes/", r"serving/engine\.py", r"serving/app\.py"]),
]
THREAD = re.compile(r"thread \((\d+)\): ([^;]*)")


def thread_kind(name: str) -> str:
    """A Python thread's name without its pool index: codec_0 -> codec."""
    return re.sub(r"_\d+$", "", name.strip())


def categorize(raw: Path) -> dict:
    """From py-spy's raw (collapsed) output: samples per stage, per thread kind and stage, and the
    Python name of each thread id."""
    compiled = [(name, [re.compile(p) for p in patterns]) for name, patterns in STAGES]
    total, by_thread, names = Counter(), {}, {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        thread = THREAD.search(stack)
        kind = "?"
        if thread:
            names[int(thread.group(1))] = kind = thread_kind(thread.group(2))
        stage = next(
            (name for f in reversed(frames) for name, patterns in compiled if any(p.search(f) for p in patterns)),
            "other",
        )
        total[stage] += int(count)
        by_thread.setdefault(kind, Counter())[stage] += int(count)
    return {"stages": dict(total), "threads": {k: dict(v) for k, v in by_thread.items()}, "names": names}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="what `python -m serving --model` serves (an int8 artifact, say)")
    p.add_argument("--serving-args", default="", help="more flags for `python -m serving`")
    p.add_argument("--cwd", type=Path, default=REPO, help="checkout whose serving/ runs (default: this one)")
    p.add_argument("--task", choices=("classify", "embed"), default="classify")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=20.0, help="recorded seconds (after 3 s of warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "server_profile")
    args = p.parse_args(argv)

    peer = bertserve_peer("bertserve", args.task, args.model, args.threads, args.serving_args.split())
    peer.cwd = args.cwd
    bodies = [peer.adapter.body(s) for s in work_items(args.task, 872)]
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / f"c{args.concurrency}.raw.txt"
    with serve(peer) as (proc, url):
        asyncio.run(load(url + peer.adapter.path, bodies, args.concurrency, 3.0, 0.0))  # warm-up, not recorded
        spy = subprocess.Popen(
            [
                args.py_spy,
                "record",
                "--pid",
                str(proc.pid),
                "--duration",
                str(int(args.seconds)),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--threads",
                "--gil",
                "--nonblocking",
                "--output",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)
        threads0 = thread_cpu_seconds(proc.pid)
        result = asyncio.run(
            load(url + peer.adapter.path, bodies, args.concurrency, args.seconds - 1.0, 0.0, meter=CpuMeter(proc.pid))
        )
        threads1 = thread_cpu_seconds(proc.pid)
        if spy.wait(60) != 0 or not raw.is_file():
            raise SystemExit(f"py-spy failed: {spy.stderr.read()[-1000:]}")
    found = categorize(raw)
    requests = result["ok"] + result["errors"]
    per_request = 1e3 / requests  # seconds over the window -> ms per request

    thread_cpu = Counter()
    for tid, seconds in threads1.items():
        thread_cpu[found["names"].get(tid, "native (no Python frames)")] += seconds - threads0.get(tid, 0.0)
    thread_rows = [
        {"thread": kind, "cpu_ms_per_request": seconds * per_request, "cpu_cores": seconds / result["window_s"]}
        for kind, seconds in thread_cpu.most_common()
    ]
    # GIL samples span the whole py-spy run (seconds - 0.5 s before the window); scale to the window.
    gil_seconds = {stage: n / args.rate * result["window_s"] / args.seconds for stage, n in found["stages"].items()}
    stage_rows = [
        {
            "stage": stage,
            "gil_ms_per_request": sec * per_request,
            **{
                kind: by.get(stage, 0) / args.rate * result["window_s"] / args.seconds * per_request
                for kind, by in found["threads"].items()
            },
        }
        for stage, sec in sorted(gil_seconds.items(), key=lambda kv: -kv[1])
    ]
    print(
        f"\n{result['requests_per_s']:.1f} req/s at {args.concurrency} clients; server CPU "
        f"{result['server_cpu_cores']:.2f} cores = {1e3 * result['server_cpu_cores'] / result['requests_per_s']:.2f} "
        f"ms per request; other processes {result['other_cpu_cores']:.2f} cores\n"
    )
    print_table(thread_rows, [("thread", "thread"), ("cpu_ms_per_request", "CPU ms/request"), ("cpu_cores", "cores")])
    print(f"\nholding the GIL, ms per request ({sum(gil_seconds.values()) / result['window_s']:.2f} of one core):")
    print_table(
        stage_rows,
        [("stage", "stage"), ("gil_ms_per_request", "all threads"), *((kind, kind) for kind in found["threads"])],
    )
    path = write_json(
        args.out / f"c{args.concurrency}.json",
        {
            "model": args.model,
            "cwd": str(args.cwd),
            "serving_args": args.serving_args,
            "load": result,
            "threads": thread_rows,
            "gil_stages": stage_rows,
            "raw": str(raw),
        },
    )
    print(f"\nwrote {path} ({raw})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
