"""Embedding N sentences on the same all-MiniLM-L6-v2 weights, same machine, same run:
  batch   python -m batch --task embed on bertserve's int8 ONNX export (the job's own wall time, load included)
  ray     the same job with --ray on a one-node Ray cluster of this machine (ray start --head; skipped without ray)
  st      sentence-transformers' best CPU backend: backend="onnx" with optimum's dynamic int8 (bench/st_encode.py, in
          the infinity venv bench/.peers/infinity-venv when ours lacks optimum), else its torch backend
  server  python -m serving on the same int8 export, driven by the SDK (AsyncClient) at each --concurrency; best kept
A table on stdout and JSON (--json); the batch rows also give the job's own rows/s once the model has loaded.
Sentences: SQuAD contexts cut into sentences (the shared data directory), repeated past its 90,000-odd.

    python -m bench.batch_bench --rows 50000 --json bench/results/batch.json
    python -m bench.batch_bench --profile --rows 5000        # where one worker's time goes (cProfile)
    python -m bench.batch_bench --rss --rows 1000000 --json bench/results/batch_rss.json   # peak RSS vs rows
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import DATA_DIR, REPO, machine, print_table, write_json
from bench.peers import WORK
from bench.peers.catalog import bertserve_export, embed_model
from export.bf16 import native_bf16


def sentences(n: int) -> list[str]:
    from bert.tasks.qa import read_squad_articles
    from bert.tasks.rerank import sentence_spans

    out: list[str] = []
    for article in read_squad_articles(sorted((DATA_DIR / "squad-train").glob("train-v1.1.part-*.json.gz"))):
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            out.extend(context[a:b] for a, b in sentence_spans(context) if context[a:b].strip())
            if len(out) >= n:
                return out[:n]
    return (out * (n // max(len(out), 1) + 1))[:n]


def write_input(texts: list[str], work: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = work / f"input-{len(texts)}.parquet"
    if not source.is_file():
        pq.write_table(pa.table({"id": range(len(texts)), "text": texts}), source, row_group_size=10_000)
    return source


def run_batch(
    artifact: Path, texts: list[str], work: Path, workers: int, extra: list[str] = (), env: dict | None = None
) -> dict:
    source = write_input(texts, work)
    out = work / f"batch-out-{workers}"
    command = [sys.executable, "-m", "batch", "--task", "embed", "--model", str(artifact), "--input", str(source)]
    # --truncate: cut a text at the model's limit as sentence-transformers does (SQuAD has sentences over 256 tokens)
    command += ["--output", str(out), "--overwrite", "--truncate", "--workers", str(workers), *extra]
    started, cpu = time.perf_counter(), _children_cpu()
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    elapsed, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {run.returncode}\n{run.stderr[-3000:]}")
    # the job's own figure, once the model has loaded (its closing line: "... (X rows/s, ..."; none on Ray)
    loaded = re.search(r"\(([\d.]+) rows/s", run.stderr.splitlines()[-1])
    return {
        "name": f"batch int8 (workers {workers})",
        "seconds": elapsed,
        "rows_per_s": len(texts) / elapsed,
        "rows_per_s_loaded": float(loaded.group(1)) if loaded else None,
        "cpu_s": cpu,  # the job and its worker processes (on Ray, the cluster's processes are added by run_ray)
    }


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for children and theirs: a job and the workers it waited for."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _python_with_optimum(work: Path) -> str | None:
    """A python whose sentence-transformers has optimum: ours, else the infinity venv's (bench/peers)."""
    probe = "import optimum.onnxruntime, sentence_transformers"
    for python in (sys.executable, str(work / "infinity-venv" / "bin" / "python")):
        if Path(python).is_file() and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
            return python
    return None


def run_sentence_transformers(model: Path, texts: list[str], work: Path, bf16: bool = False) -> dict:
    """sentence-transformers in a process of its own (its timing starts once loaded and warmed up); bf16: its torch
    backend with the model in bfloat16 (on a CPU with AMX / AVX512-BF16, its fastest there)."""
    python = None if bf16 else _python_with_optimum(work)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "texts.json"
        source.write_text(json.dumps(texts))
        command = [python or sys.executable, str(REPO / "bench" / "st_encode.py"), str(model), str(source), str(work)]
        flags = ["--torch", "--bf16"] if bf16 else [] if python else ["--torch"]
        run = subprocess.run([*command, *flags], check=True, capture_output=True, text=True)
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    elapsed = answer["seconds"]
    return {
        "name": f"sentence-transformers ({answer['backend']})",
        "seconds": elapsed,
        "rows_per_s": len(texts) / elapsed,
    }


def run_ray(artifact: Path, texts: list[str], work: Path, workers: int) -> dict | None:
    """The batch job with --ray on a one-node cluster of this machine: one logical CPU more than the cores, so
    that `workers` model-holding actors leave one to the read and write tasks."""
    ray = Path(sys.executable).with_name("ray")
    if not ray.is_file():
        return None
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port)]
        + ["--num-cpus", str(workers + 1), "--include-dashboard", "false", "--disable-usage-stats"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(10)  # the head's processes start; the job's ray.init waits for the rest
        cluster = _TreeCpu(head.pid)
        try:
            row = run_batch(artifact, texts, work, workers, ["--ray", f"127.0.0.1:{port}"], env)
        finally:
            cluster.stop()
        row["cpu_s"] += cluster.seconds  # the actors, the read and write tasks and Ray's own processes
        row["name"] = f"batch int8 on Ray, one node ({workers} actors)"
        return row
    finally:
        head.terminate()
        head.wait(60)


class _TreeCpu:
    """CPU seconds used by a process's descendants while it runs, sampled twice a second from /proc: Ray's
    actors end with the job and their CPU time is not added to a parent's, so each is read while it lives."""

    def __init__(self, pid: int):
        import threading

        from bench.cpu import _cpu_seconds, _stat, process_tree

        def used() -> dict[int, float]:
            out = {}
            for member in process_tree(pid):
                fields = _stat(member)
                if fields is not None:
                    out[member] = _cpu_seconds(fields, with_reaped_children=False)
            return out

        self.first, self.last = used(), {}
        self.done = threading.Event()

        def sample():
            while not self.done.wait(0.5):
                self.last.update(used())

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        self.used = used

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self.last.update(self.used())

    @property
    def seconds(self) -> float:
        return sum(value - self.first.get(member, 0.0) for member, value in self.last.items())


def run_server(artifact: Path, texts: list[str], concurrency: list[int], per_request: int) -> dict:
    import socket

    from bertserve_client import AsyncClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "serving", "--model", str(artifact), "--port", str(port), "--log-level", "warning"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        best = None
        chunks = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
        for c in concurrency:

            async def drive(c=c):
                async with AsyncClient(base_url=url, timeout=300) as client:
                    queue = list(reversed(chunks))

                    async def worker():
                        while queue:
                            await client.embed(queue.pop(), truncate=True)

                    await asyncio.gather(*(worker() for _ in range(c)))

            started = time.perf_counter()
            asyncio.run(drive())
            elapsed = time.perf_counter() - started
            row = {
                "name": f"server int8 + SDK (concurrency {c})",
                "seconds": elapsed,
                "rows_per_s": len(texts) / elapsed,
            }
            best = row if best is None or row["rows_per_s"] > best["rows_per_s"] else best
        return best
    finally:
        server.terminate()
        server.wait(30)


def tiny_model(work: Path) -> Path:
    """A random BERT of hidden 32 and 2 layers with all-MiniLM-L6-v2's tokenizer: a long run in minutes (the
    job's own buffers, not the model's, are what could grow with rows)."""
    target = work / "tiny-embed"
    if not (target / "config.json").is_file():
        from bert.checkpoint import init_model, save_checkpoint
        from bert.config import BertConfig

        config = BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
        )
        save_checkpoint(init_model(config, seed=0), target, tokenizer=embed_model())
    return target


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of `pid`, and of its descendants together (/proc)."""
    from bench.cpu import process_tree

    return _rss(pid), sum(_rss(member) for member in process_tree(pid) if member != pid)


def run_rss(model: Path, texts: list[str], work: Path, workers: int, part_rows: int) -> dict:
    """The job's peak RSS (its process and workers together) sampled twice a second, against the rows its
    manifest records done: flat means the peak after the first parts is the peak after the last."""
    source = write_input(texts, work)
    out = work / "rss-out"
    command = [sys.executable, "-m", "batch", "--task", "embed", "--model", str(model), "--input", str(source)]
    command += ["--output", str(out), "--overwrite", "--workers", str(workers), "--part-rows", str(part_rows)]
    job = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples, started = [], time.perf_counter()
    while job.poll() is None:
        own, workers_rss = _tree_rss(job.pid)
        try:
            done = json.loads((out / "_manifest.json").read_text())["rows_done"]
        except (OSError, ValueError, KeyError):
            done = 0
        samples.append(
            {
                "seconds": time.perf_counter() - started,
                "rows_done": done,
                "rss_mb": (own + workers_rss) / 2**20,
                "job_rss_mb": own / 2**20,
                "workers_rss_mb": workers_rss / 2**20,
            }
        )
        time.sleep(0.5)
    stderr = job.stderr.read()
    if job.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {job.returncode}\n{stderr[-3000:]}")
    elapsed = time.perf_counter() - started
    rows = len(texts)
    # peak RSS in each tenth of the rows (by the manifest's count when sampled)
    tenths = []
    for k in range(10):
        lo, hi = rows * k // 10, rows * (k + 1) // 10
        inside = [x for x in samples if lo <= x["rows_done"] < hi or (k == 9 and x["rows_done"] >= hi)]
        peak = {key: max((x[key] for x in inside), default=None) for key in ("rss_mb", "job_rss_mb", "workers_rss_mb")}
        tenths.append({"rows": f"{lo}-{hi}", **{f"peak_{key}": value for key, value in peak.items()}})
    return {"rows": rows, "seconds": elapsed, "workers": workers, "tenths": tenths, "samples": samples}


def run_profile(artifact: Path, texts: list[str], work: Path, top: int) -> dict:
    """One worker's job in this process under cProfile: where the time of the thread that computes goes
    (reading and writing run in threads of their own, outside the profile)."""
    import cProfile
    import io
    import pstats

    from batch.job import run
    from batch.predict import default_options

    source = write_input(texts, work)
    options = default_options(task="embed", model=str(artifact))
    options.update(input=str(source), output=str(work / "profile-out"), overwrite=True, workers=1, format="auto")
    options.update(ray=None, progress_interval=3600.0)
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.runcall(run, options, log=lambda line: None)
    elapsed = time.perf_counter() - started
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return {"rows": len(texts), "seconds": elapsed, "report": out.getvalue()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--per-request", type=int, default=32, help="texts per SDK request")
    parser.add_argument("--work", default=str(WORK), help="where the int8 export is cached (the peers' directory)")
    parser.add_argument("--skip", nargs="*", default=[], choices=("ray", "st", "server"), help="runs left out")
    parser.add_argument("--rss", action="store_true", help="instead: peak RSS against rows done, on a tiny model")
    parser.add_argument("--rss-model", default=None, help="--rss: this model rather than a tiny random one")
    parser.add_argument("--part-rows", type=int, default=20_000, help="--rss: the job's --part-rows")
    parser.add_argument("--profile", action="store_true", help="instead: cProfile of a one-worker job")
    parser.add_argument(
        "--export",
        choices=("int8", "default"),
        default="int8",
        help="the job's and the server's artifact: --precision int8, or the exporter's default (precision auto: "
        "bf16 matmuls on a CPU with AMX / AVX512-BF16 where that is the fastest faithful candidate)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    work = Path(args.work)
    model = embed_model()
    texts = sentences(args.rows)
    if args.rss:
        # the tiny model as an fp32 ONNX artifact: onnxruntime, not torch's per-operator overhead, sets the pace
        rss_model = (
            Path(args.rss_model)
            if args.rss_model
            else bertserve_export(tiny_model(work), work / "tiny", "embed", "fp32")
        )
        with tempfile.TemporaryDirectory() as tmp:
            result = run_rss(rss_model, texts, Path(tmp), max(args.workers), args.part_rows)
        print(
            f"embed of {result['rows']} rows on {rss_model.name}, {result['workers']} workers, {result['seconds']:.0f}s"
        )
        print_table(
            result["tenths"],
            [
                ("rows", "rows done"),
                ("peak_rss_mb", "peak RSS MB (job + workers)"),
                ("peak_job_rss_mb", "job process"),
                ("peak_workers_rss_mb", "workers"),
            ],
        )
        if args.json:
            write_json(args.json, {"machine": machine(), "model": str(rss_model), **result})
        return 0
    artifact = bertserve_export(model, work, "embed", None if args.export == "default" else "int8")
    label = json.loads((artifact / "manifest.json").read_text())["precision"]
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_profile(artifact, texts, Path(tmp), 30)
        print(f"one worker, {result['rows']} rows, {result['seconds']:.1f}s under cProfile")
        print(result["report"])
        if args.json:
            write_json(args.json, {"machine": machine(), **result})
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in dict.fromkeys(args.workers):
            rows.append(run_batch(artifact, texts, Path(tmp), workers))
        if "ray" not in args.skip:
            ray_row = run_ray(artifact, texts, Path(tmp), max(args.workers))
            if ray_row is not None:
                local = next(r for r in rows if r["name"] == f"batch int8 (workers {max(args.workers)})")
                ray_row["ray_vs_local"] = ray_row["rows_per_s"] / local["rows_per_s"]  # both wall, load included
                rows.append(ray_row)
    if "st" not in args.skip:
        rows.append(run_sentence_transformers(model, texts, work))
        if native_bf16():
            rows.append(run_sentence_transformers(model, texts, work, bf16=True))
    if "server" not in args.skip:
        rows.append(run_server(artifact, texts, args.concurrency, args.per_request))
    # sentence-transformers and the server are timed once loaded: so is the batch job in the speed-ups
    best_batch = max(r["rows_per_s_loaded"] or r["rows_per_s"] for r in rows if r["name"].startswith("batch int8 ("))
    for r in rows:
        r["batch_speedup"] = best_batch / r["rows_per_s"]
        r["name"] = r["name"].replace(" int8", f" {label}")  # the export's precision (the default may be bf16)
    print(f"embed of {len(texts)} sentences, all-MiniLM-L6-v2, {os.cpu_count()} CPUs")
    print_table(
        rows,
        [
            ("name", "run"),
            ("seconds", "seconds"),
            ("rows_per_s", "rows/s"),
            ("rows_per_s_loaded", "rows/s once loaded"),
            ("cpu_s", "CPU s"),
            ("batch_speedup", "best batch x"),
            ("ray_vs_local", "Ray / local (wall)"),
        ],
    )
    if args.json:
        write_json(args.json, {"rows": len(texts), "machine": machine(), "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
