"""Embedding N sentences three ways on the same all-MiniLM-L6-v2 weights, same machine, same run:
  batch   python -m batch --task embed on bertserve's int8 ONNX export (the job's own wall time, load included)
  st      sentence-transformers' best CPU backend that installs: onnx + optimum int8 when optimum is there, else torch
  server  python -m serving on the same int8 export, driven by the SDK (AsyncClient) at each --concurrency; best kept
A table on stdout and JSON (--json); the batch rows also give the job's own rows/s once the model has loaded. Sentences: SQuAD contexts cut into sentences (the shared data directory).

    python -m bench.batch_bench --rows 50000 --json bench/results/batch.json
"""

from __future__ import annotations

import argparse
import asyncio
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


def run_batch(artifact: Path, texts: list[str], work: Path, workers: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = work / "input.parquet"
    pq.write_table(pa.table({"text": texts}), source)
    out = work / f"batch-out-{workers}"
    command = [sys.executable, "-m", "batch", "--task", "embed", "--model", str(artifact), "--input", str(source)]
    command += ["--output", str(out), "--overwrite", "--workers", str(workers)]
    started = time.perf_counter()
    run = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    # the job's own figure, once the model has loaded (its closing line: "... (X rows/s, ...")
    loaded = re.search(r"\(([\d.]+) rows/s", run.stderr.splitlines()[-1])
    return {
        "name": f"batch int8 (workers {workers})",
        "seconds": elapsed,
        "rows_per_s": len(texts) / elapsed,
        "rows_per_s_loaded": float(loaded.group(1)) if loaded else None,
    }


def run_sentence_transformers(model: Path, texts: list[str]) -> dict:
    from sentence_transformers import SentenceTransformer

    try:
        import optimum  # noqa: F401

        st = SentenceTransformer(
            str(model), device="cpu", backend="onnx", model_kwargs={"file_name": "model_qint8_avx512_vnni.onnx"}
        )
        backend = "onnx int8"
    except Exception:  # noqa: BLE001 - optimum absent or the int8 file missing: its torch backend
        st = SentenceTransformer(str(model), device="cpu")
        backend = "torch"
    started = time.perf_counter()
    st.encode(texts, batch_size=64, normalize_embeddings=True)
    elapsed = time.perf_counter() - started
    return {"name": f"sentence-transformers ({backend})", "seconds": elapsed, "rows_per_s": len(texts) / elapsed}


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
                            await client.embed(queue.pop())

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--per-request", type=int, default=32, help="texts per SDK request")
    parser.add_argument("--work", default=str(WORK), help="where the int8 export is cached (the peers' directory)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    model = embed_model()
    artifact = bertserve_export(model, Path(args.work), "embed", "int8")
    texts = sentences(args.rows)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in dict.fromkeys(args.workers):
            rows.append(run_batch(artifact, texts, Path(tmp), workers))
    rows.append(run_sentence_transformers(model, texts))
    rows.append(run_server(artifact, texts, args.concurrency, args.per_request))
    # sentence-transformers and the server are timed once loaded: so is the batch job in the speed-ups
    best_batch = max(r["rows_per_s_loaded"] or r["rows_per_s"] for r in rows if r["name"].startswith("batch"))
    for r in rows:
        r["batch_speedup"] = best_batch / r["rows_per_s"]
    print(f"embed of {len(texts)} sentences, all-MiniLM-L6-v2, {os.cpu_count()} CPUs")
    print_table(
        rows,
        [
            ("name", "run"),
            ("seconds", "seconds"),
            ("rows_per_s", "rows/s"),
            ("rows_per_s_loaded", "rows/s once loaded"),
            ("batch_speedup", "best batch x"),
        ],
    )
    if args.json:
        write_json(args.json, {"rows": len(texts), "machine": machine(), "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
