"""Where a bertserve server's CPU goes under load, per thread and per stage of a request.

    python -m bench.server_profile --model artifacts/demo-int8 --concurrency 32 --seconds 20
    python -m bench.server_profile --model artifacts/demo-int8 --cwd /tmp/head   # another checkout's serving/
    python -m bench.server_profile --model artifacts/demo-int8 --before /tmp/main  # before -> after, alternated

Starts `python -m serving` (from --cwd, default this checkout), drives it with the load generator of
bench/server_bench.py (single SST-2 dev sentences to /classify, /embed with --task embed, or with --task qa one
held-out SQuAD question and its paragraph per /qa request), and measures
two things at once:
- each thread's CPU, from /proc (exact): the event loop, the codec pool (tokenise, decode), the
  inference workers (onnxruntime runs without the GIL), native threads;
- what the Python threads do while they hold the GIL: `py-spy record --gil --nonblocking --threads`
  (`pip install py-spy`; ptrace). Each sample goes to the first stage of STAGES with a matching frame;
  samples / rate / requests = milliseconds per request holding the GIL in that stage. Only one thread
  holds the GIL at a time, so these add up to at most one core: the ceiling of the Python side.
On a machine other processes load, GIL time includes stretches where the holder waits for a core.

The server's own cost (its "overhead") is the CPU of every thread but the inference workers and the native
threads (onnxruntime's pool): the event loop and the codec threads, which parse, validate, tokenise, decode
and render. The inference workers' own Python (batching, padding, splitting: GIL samples outside the model
run) is printed beside it, so that work moved into them shows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
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
    ("model run", [r"onnxruntime", r"^\w+ \(torch/", r"runtime/backends/"]),
    ("tokenize", [r"bert/tokenizer\.py", r"tokenizers/", r"^encode \(bert/tasks/"]),
    ("decode (logits -> labels)", [r"^decode \(bert/tasks/", r"softmax"]),
    ("batching (queue, pad, split)", [r"serving/batcher\.py", r"pad_batch"]),
    ("request validation (pydantic)", [r"pydantic", r"fastapi/dependencies/", r"_validate"]),
    (
        "JSON (parse, render)",
        [
            r"\(json/",
            r"orjson",
            r"render \(starlette",
            r"JSONResponse",
            r"Request\.(json|body)",
            r"^AnswerResponse\.render ",
            r"^_parse\b.* \(serving/routes/lean\.py",
        ],
    ),
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


def server_overhead(thread_rows: list[dict], found: dict, samples_per_ms: float) -> dict:
    """The server's own CPU per request (threads other than the inference workers and native ones), its share of
    all the threads' CPU, and the inference workers' GIL samples outside the model run (`samples_per_ms`: samples
    per millisecond of a request)."""
    model_threads = [r for r in thread_rows if _is_model_thread(r["thread"])]
    total = sum(r["cpu_ms_per_request"] for r in thread_rows)
    model = sum(r["cpu_ms_per_request"] for r in model_threads)
    python = sum(
        n
        for kind, stages in found["threads"].items()
        if _is_model_thread(kind)
        for stage, n in stages.items()
        if stage != "model run"
    )
    return {
        "overhead_ms_per_request": total - model,
        "overhead_share": (total - model) / total if total else 0.0,
        "inference_python_ms_per_request": python / samples_per_ms,
    }


def _is_model_thread(kind: str) -> bool:
    return kind.startswith("infer-") or kind.startswith("native")


def _py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")  # a virtual environment's own, on PATH or not
    return str(beside) if beside.is_file() else shutil.which("py-spy") or "py-spy"


def profile(args, cwd: Path, out: Path) -> dict:
    """One server (the serving/ of checkout `cwd`) under load: its CPU per thread, its GIL time per stage and
    its overhead, per request; the raw py-spy samples go to `out`."""
    peer = bertserve_peer("bertserve", args.task, args.model, args.threads, args.serving_args.split())
    peer.cwd = cwd
    # The server imports the serving/ of `cwd`, whatever PYTHONPATH this process runs with.
    peer.env = {**peer.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))}
    bodies = [peer.adapter.body(s) for s in work_items(args.task, 872)]
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"c{args.concurrency}.raw.txt"
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
    return {
        "cwd": str(cwd),
        "load": result,
        "threads": thread_rows,
        **server_overhead(thread_rows, found, args.rate * args.seconds / result["window_s"] / per_request),
        "gil_stages": stage_rows,
        "gil_cores": sum(gil_seconds.values()) / result["window_s"],
        "thread_kinds": list(found["threads"]),
        "raw": str(raw),
    }


def print_profile(run: dict, concurrency: int) -> None:
    load_ = run["load"]
    print(
        f"\n{load_['requests_per_s']:.1f} req/s at {concurrency} clients; server CPU "
        f"{load_['server_cpu_cores']:.2f} cores = {1e3 * load_['server_cpu_cores'] / load_['requests_per_s']:.2f} "
        f"ms per request; other processes {load_['other_cpu_cores']:.2f} cores\n"
    )
    print_table(
        run["threads"], [("thread", "thread"), ("cpu_ms_per_request", "CPU ms/request"), ("cpu_cores", "cores")]
    )
    print(
        f"\nserver overhead (event loop + codec threads): {run['overhead_ms_per_request']:.3f} ms per request = "
        f"{100 * run['overhead_share']:.1f} % of the request's CPU; the inference workers' Python outside the "
        f"model run: {run['inference_python_ms_per_request']:.3f} ms (GIL samples)"
    )
    print(f"\nholding the GIL, ms per request ({run['gil_cores']:.2f} of one core):")
    print_table(
        run["gil_stages"],
        [("stage", "stage"), ("gil_ms_per_request", "all threads"), *((kind, kind) for kind in run["thread_kinds"])],
    )


def compare(before: list[dict], after: list[dict]) -> list[dict]:
    """Before and after side by side, each the median of its runs: ms per request by thread kind and by stage
    (GIL time), the overhead and its share."""

    def middle(runs: list[dict], pick) -> float:
        return statistics.median(pick(r) for r in runs)  # a run that others' load disturbed moves a mean

    def row(name: str, pick) -> dict:
        b, a = middle(before, pick), middle(after, pick)
        return {"what": name, "before": b, "after": a, "change": f"{100 * (a - b) / b:+.0f} %" if b else ""}

    def cpu_of(kind: str):
        return lambda r: sum(t["cpu_ms_per_request"] for t in r["threads"] if _thread_group(t["thread"]) == kind)

    def gil_of(stage: str):
        return lambda r: next((s["gil_ms_per_request"] for s in r["gil_stages"] if s["stage"] == stage), 0.0)

    rows = [row("requests/s", lambda r: r["load"]["requests_per_s"])]
    rows.append(row("server CPU, ms/request", lambda r: sum(t["cpu_ms_per_request"] for t in r["threads"])))
    kinds = dict.fromkeys(_thread_group(t["thread"]) for r in before + after for t in r["threads"])
    rows += [row(f"  CPU: {kind}", cpu_of(kind)) for kind in kinds]
    rows.append(row("overhead, ms/request", lambda r: r["overhead_ms_per_request"]))
    rows.append(row("overhead, % of the request's CPU", lambda r: 100 * r["overhead_share"]))
    rows.append(row("inference workers' Python, ms/request", lambda r: r["inference_python_ms_per_request"]))
    stages = [name for name, _ in STAGES] + ["other"]
    rows += [row(f"  GIL: {stage}", gil_of(stage)) for stage in stages]
    return rows


def _thread_group(kind: str) -> str:
    """A thread kind as the comparison groups it: infer-MODEL -> inference."""
    if kind.startswith("infer-"):
        return "inference"
    return "native" if kind.startswith("native") else kind


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="what `python -m serving --model` serves (an int8 artifact, say)")
    p.add_argument("--serving-args", default="", help="more flags for `python -m serving`")
    p.add_argument("--cwd", type=Path, default=REPO, help="checkout whose serving/ runs (default: this one)")
    p.add_argument(
        "--before",
        type=Path,
        help="another checkout (e.g. `git archive main | tar -x -C DIR`) to profile too, alternated with --cwd "
        "--rounds times, and to print side by side with it (before -> after)",
    )
    p.add_argument("--rounds", type=int, default=2, help="with --before: runs of each side, alternated")
    p.add_argument("--task", choices=("classify", "embed", "qa"), default="classify")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=20.0, help="recorded seconds (after 3 s of warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--py-spy", default=_py_spy())
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "server_profile")
    args = p.parse_args(argv)

    settings = {"model": args.model, "serving_args": args.serving_args, "concurrency": args.concurrency}
    if args.before is None:
        run = profile(args, args.cwd, args.out)
        print_profile(run, args.concurrency)
        path = write_json(args.out / f"c{args.concurrency}.json", {**settings, **run})
        print(f"\nwrote {path} ({run['raw']})")
        return 0
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.rounds):
        for side, cwd in (("before", args.before), ("after", args.cwd)):
            print(f"\n== {side} ({cwd}), round {i + 1} of {args.rounds}")
            runs[side].append(profile(args, cwd, args.out / f"{side}-{i}"))
            print_profile(runs[side][-1], args.concurrency)
    rows = compare(runs["before"], runs["after"])
    print(f"\nbefore ({args.before}) -> after ({args.cwd}), median of {args.rounds} alternated runs each:")
    print_table(rows, [("what", ""), ("before", "before"), ("after", "after"), ("change", "change")])
    path = write_json(args.out / f"c{args.concurrency}-compare.json", {**settings, "compare": rows, **runs})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
