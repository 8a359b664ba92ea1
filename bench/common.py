"""Shared pieces of the benchmarks: timing, the machine description, table and JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("BERTSERVE_TEST_DATA", REPO.parent / "shared" / "data"))


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def time_call(fn: Callable[[], object], *, warmup: int = 3, min_iters: int = 10, min_seconds: float = 3.0) -> dict:
    """Latency of fn in seconds: p50/p99/mean over at least min_iters calls and min_seconds."""
    for _ in range(warmup):
        fn()
    latencies: list[float] = []
    start = time.perf_counter()
    while len(latencies) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - t0)
    return {
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "mean": statistics.fmean(latencies),
        "iters": len(latencies),
    }


def print_table(rows: list[dict], columns: list[tuple[str, str]]) -> None:
    """columns: (key, header). Floats print with 3 significant decimals."""

    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))

    cells = [[fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (_, h) in enumerate(columns)]
    print(" | ".join(h.ljust(w) for (_, h), w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for c in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(c, widths)))


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def sst2_sample(n: int) -> list[tuple[str, int]]:
    """The first n SST-2 dev rows: the fixed labelled sample every variant is scored on."""
    rows = []
    with open(DATA_DIR / "SST-2" / "dev.tsv", encoding="utf-8") as f:
        next(f)
        for line in f:
            sentence, label = line.rstrip("\n").split("\t")
            rows.append((sentence.strip(), int(label)))
    return rows[:n]
