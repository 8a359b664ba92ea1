"""Embedding N sentences on the same all-MiniLM-L6-v2 weights, same machine, same run:
  batch   python -m batch --task embed (the job's own wall time, load included) on each engine: bertserve's int8 ONNX
          export (onnxruntime), its bf16 export (`--precision bf16`: the torch backend, bf16 matmuls) and the
          checkpoint itself with `--backend torch --precision bf16`; each as --workers 1 (two runs at once on one
          thread each) and --workers = the cores (one thread each). Each engine's embeddings are compared with fp32
          torch on a sample of the rows (--fidelity-rows): the largest |cosine - 1| goes in the JSON
  ray     the same job with --ray on a one-node Ray cluster of this machine (ray start --head on 127.0.0.1, stopped
          with the bench; skipped without ray), on the int8 export and on torch bf16, each in the layout of that
          engine's fastest local job and compared with it, which runs again right after (Ray / local is Ray's
          rows/s over the mean of the two: a machine whose speed drifts in minutes favours neither)
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import DATA_DIR, REPO, machine, print_table, write_json
from bench.peers import WORK
from bench.peers.catalog import bertserve_export, embed_model
from bert.precision import bf16_units


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


# Engines a job can run the model on: (name, what --model is, extra flags). "int8" and "bf16 export" are
# artifacts of `python -m export.onnx`; "torch bf16" is the checkpoint itself.
ENGINES = {
    "int8": ("int8 export", []),
    "bf16-export": ("bf16 export", []),
    "torch-bf16": ("checkpoint", ["--backend", "torch", "--precision", "bf16"]),
}


def run_batch(
    model: Path,
    texts: list[str],
    work: Path,
    workers: int,
    extra: list[str] = (),
    env: dict | None = None,
    engine: str = "int8",
) -> dict:
    source = write_input(texts, work)
    out = work / f"batch-out-{engine}-{workers}{'-ray' if '--ray' in extra else ''}"
    command = [sys.executable, "-m", "batch", "--task", "embed", "--model", str(model), "--input", str(source)]
    # --truncate: cut a text at the model's limit as sentence-transformers does (SQuAD has sentences over 256 tokens)
    command += ["--output", str(out), "--overwrite", "--truncate", "--workers", str(workers)]
    command += [*ENGINES[engine][1], *extra]
    started, cpu = time.perf_counter(), _children_cpu()
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    elapsed, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {run.returncode}\n{run.stderr[-3000:]}")
    # the job's own figure, once the model has loaded (its closing line: "... (X rows/s, ..."; none on Ray)
    loaded = re.search(r"\(([\d.]+) rows/s", run.stderr.splitlines()[-1])
    manifest = json.loads((out / "_manifest.json").read_text())["model"]
    threads = max(1, (os.cpu_count() or 1) // workers)
    return {
        "name": f"batch {engine} (workers {workers} x {threads} threads)",
        "engine": engine,
        "workers": workers,
        "threads": threads,
        "ran_as": f"{manifest['backend']} {manifest['precision']}",
        "seconds": elapsed,
        "rows_per_s": len(texts) / elapsed,
        "rows_per_s_loaded": float(loaded.group(1)) if loaded else None,
        "cpu_s": cpu,  # the job and its worker processes (on Ray, the cluster's processes are added by run_ray)
        "output": out,
    }


def fidelity(rows: list[dict], model: Path, texts: list[str], sample: int) -> dict:
    """Each batch row's embeddings against fp32 torch on the checkpoint (bertserve's reference: equal to
    sentence-transformers' to 1e-4), on `sample` rows spread over the input (0: all): the largest |cosine - 1|
    (the rows are normalized, so the cosine is the dot product)."""
    import numpy as np
    import pyarrow.parquet as pq

    from batch import Predictor

    step = max(1, len(texts) // sample) if sample else 1
    picked = list(range(0, len(texts), step))[: sample or None]
    reference = Predictor("embed", str(model), truncate=True, precision="fp32")({"text": [texts[i] for i in picked]})
    want = np.asarray(reference["embedding"].to_pylist(), dtype=np.float64)
    for row in rows:
        if row.get("output") is None:
            continue
        got = pq.read_table(row["output"], columns=["embedding"])["embedding"].take(picked).to_pylist()
        cosine = (np.asarray(got, dtype=np.float64) * want).sum(1)
        row["max_cos_dev"] = float(np.abs(cosine - 1).max())
        row["min_cosine"] = float(cosine.min())
        row["fidelity_rows"] = len(picked)
    return {"rows": len(picked), "reference": "torch fp32 on the checkpoint"}


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


def run_ray(
    model: Path, texts: list[str], work: Path, workers: int, engine: str = "int8", threads: int = 1
) -> dict | None:
    """The batch job with --ray on a one-node cluster of this machine, started and stopped here: `workers` actors
    of `threads` threads each (the local job's layout), and one logical CPU more, left to the read and write tasks.

    The cluster is the bench's own: `--temp-dir` of its own (the machine's /tmp/ray/ray_current_cluster, what
    `--ray auto` elsewhere connects to, is left alone) and RAY_AUTH_MODE=disabled for it and the job. Without the
    latter, once any `ray.init()` has written a token to ~/.ray/auth_token, `ray start` turns token
    authentication on while a driver given an explicit address does not send the token: "Failed to connect to
    Ray cluster at HOST:PORT" (InvalidAuthToken). Ray also rewrites 127.0.0.1 to the machine's address on both
    sides, so the cluster listens on that address whatever --node-ip-address says."""
    ray = Path(sys.executable).with_name("ray")
    if not ray.is_file():
        return None
    import shutil
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    temp = Path(tempfile.mkdtemp(prefix="bb-ray-", dir="/tmp"))  # short: Ray's socket paths live under it
    log = work / f"ray-head-{engine}.log"
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port)]
        + ["--num-cpus", str(workers * threads + 1), "--include-dashboard", "false", "--disable-usage-stats"]
        + ["--temp-dir", str(temp)],
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_cluster(address, env, head, log)
        cluster = _TreeCpu(head.pid)
        try:
            extra = ["--ray", address, "--threads", str(threads)]
            row = run_batch(model, texts, work, workers, extra, env, engine=engine)
        finally:
            cluster.stop()
        row["cpu_s"] += cluster.seconds  # the actors, the read and write tasks and Ray's own processes
        row["cluster_cpu_s"] = cluster.by_name
        row["name"] = f"batch {engine} on Ray, one node ({workers} actors x {threads} threads)"
        row["threads"] = threads
        row["output"] = None  # the same rows as the local job's (tests/test_batch_ray.py)
        return row
    finally:
        head.terminate()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_cluster(address: str, env: dict, head: subprocess.Popen, log: Path, limit: float = 180) -> None:
    """Until a driver connects to `address` and sees its node alive (a loaded machine starts a head in 10-30 s)."""
    probe = (
        f"import ray; ray.init(address={address!r}, log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited {head.returncode}:\n{log.read_text()[-3000:]}")
        run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=limit)
        if run.returncode == 0 and run.stdout.strip().splitlines()[-1:] != ["0"]:
            return
        time.sleep(1)
    raise RuntimeError(f"no Ray cluster at {address} after {limit:.0f}s:\n{run.stderr[-2000:]}")


class _TreeCpu:
    """CPU seconds used by a process's descendants while it runs, sampled twice a second from /proc: Ray's
    actors end with the job and their CPU time is not added to a parent's, so each is read while it lives."""

    def __init__(self, pid: int):
        import threading

        from bench.cpu import _comm, _cpu_seconds, _stat, process_tree

        self.names: dict[int, str] = {}

        def used() -> dict[int, float]:
            out = {}
            for member in process_tree(pid):
                fields = _stat(member)
                if fields is not None:
                    out[member] = _cpu_seconds(fields, with_reaped_children=False)
                    self.names[member] = _comm(member)  # Ray names a worker by what it runs (ray::MapWorker...)
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

    @property
    def by_name(self) -> dict[str, float]:
        """CPU seconds per process name, largest first: where the cluster's time went."""
        out: dict[str, float] = {}
        for member, value in self.last.items():
            name = self.names.get(member, "?")
            out[name] = out.get(name, 0.0) + value - self.first.get(member, 0.0)
        return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= 0.05}


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
    parser.add_argument(
        "--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES), help="the job's engines to time"
    )
    parser.add_argument(
        "--ray-engines", nargs="+", default=["int8", "torch-bf16"], choices=list(ENGINES), help="engines run on Ray"
    )
    parser.add_argument(
        "--fidelity-rows",
        type=int,
        default=5000,
        help="rows (spread over the input) whose embeddings each engine's are compared with fp32 torch on; 0: all, "
        "-1: none",
    )
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
    models = {"int8": artifact, "bf16-export": None, "torch-bf16": model}
    if "bf16-export" in args.engines:
        models["bf16-export"] = bertserve_export(model, work, "embed", "bf16")
    rows, fidelity_of = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines:
            for workers in dict.fromkeys(args.workers):
                rows.append(run_batch(models[engine], texts, Path(tmp), workers, engine=engine))
        if args.fidelity_rows >= 0:
            fidelity_of = fidelity(rows, model, texts, args.fidelity_rows)
        if "ray" not in args.skip:
            for engine in args.ray_engines:
                # in the layout of the engine's fastest local job, against that job (wall, load included in both)
                local = max((r for r in rows if r["engine"] == engine), key=lambda r: r["rows_per_s"])
                ray_row = run_ray(models[engine], texts, Path(tmp), local["workers"], engine, local["threads"])
                if ray_row is None:
                    break
                again = run_batch(models[engine], texts, Path(tmp), local["workers"], engine=engine)
                ray_row["local_rows_per_s"] = [local["rows_per_s"], again["rows_per_s"]]  # before and after Ray
                ray_row["ray_vs_local"] = ray_row["rows_per_s"] / statistics.mean(ray_row["local_rows_per_s"])
                ray_row["local"] = local["name"]
                rows.append(ray_row)
    for r in rows:
        r.pop("output", None)
    if "st" not in args.skip:
        rows.append(run_sentence_transformers(model, texts, work))
        if bf16_units():
            rows.append(run_sentence_transformers(model, texts, work, bf16=True))
    if "server" not in args.skip:
        rows.append(run_server(artifact, texts, args.concurrency, args.per_request))
    # sentence-transformers and the server are timed once loaded: so is the batch job in the speed-ups
    local = [r for r in rows if r.get("engine") and " on Ray" not in r["name"]]
    best = max(local, key=lambda r: r["rows_per_s_loaded"] or r["rows_per_s"])
    best_rate = best["rows_per_s_loaded"] or best["rows_per_s"]
    for r in rows:
        r["batch_speedup"] = best_rate / r["rows_per_s"]
        r["name"] = r["name"].replace(" int8", f" {label}")  # the export's precision (the default may be bf16)
    print(f"embed of {len(texts)} sentences, all-MiniLM-L6-v2, {os.cpu_count()} CPUs")
    shown = [{**r, "max_cos_dev": f"{r['max_cos_dev']:.1e}" if "max_cos_dev" in r else None} for r in rows]
    print_table(
        shown,
        [
            ("name", "run"),
            ("seconds", "seconds"),
            ("rows_per_s", "rows/s"),
            ("rows_per_s_loaded", "rows/s once loaded"),
            ("cpu_s", "CPU s"),
            ("max_cos_dev", "max |cos-1| vs fp32"),
            ("batch_speedup", "best batch x"),
            ("ray_vs_local", "Ray / local (wall)"),
        ],
    )
    print(f"best batch: {best['name']}; |cos-1| on {fidelity_of['rows'] if fidelity_of else 0} rows vs torch fp32")
    if args.json:
        payload = {"rows": len(texts), "machine": machine(), "best_batch": best["name"], "fidelity": fidelity_of}
        write_json(args.json, {**payload, "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
