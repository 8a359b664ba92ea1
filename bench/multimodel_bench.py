"""Several models in one server: does load on one model starve another?

One server holds two /classify models, `busy` and `quiet` (by default the demo model's directory under both names:
one backend, loaded once, two queues). `quiet` is measured by one closed-loop client, first while the server is
otherwise idle, then while 32 clients load `busy`. The goal: quiet's p50 under load within 2x of its idle p50.
Two comparisons: the same quiet client sending to `busy` itself under the same load (one queue shared with the
load: what the quiet model's requests would see without a queue of their own), and the quiet model on a server of
its own while a second server takes the load (what two servers, the way before several models per task, give on
the same cores: what is left there is the machine's contention, not the server's).

    python -m bench.multimodel_bench --seconds 10 --json bench/results/multimodel.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from bench.common import DATA_DIR, REPO, machine, print_table, sst2_sample, write_json
from bench.server_bench import free_port, load, start, stop

SENTENCES = [
    "a gripping, beautifully shot film",
    "the plot is thin and the acting is worse",
    "an honest, funny and moving portrait of a family",
    "it drags on for far too long",
]


def texts(n: int = 200) -> list[str]:
    if (DATA_DIR / "SST-2" / "dev.tsv").is_file():
        return [sentence for sentence, _ in sst2_sample(n)]
    return SENTENCES


async def measure(
    url: str, quiet: list[dict], busy: list[dict] | None, clients: int, seconds: float, busy_url: str | None = None
) -> dict:
    """The quiet client's latencies, with `clients` more loading `busy` meanwhile (None: no load), on `busy_url`
    (default: the same server)."""
    runs = [load(url, quiet, 1, seconds, warmup=1.0)]
    if busy is not None:  # covers the quiet client's whole run
        runs.append(load(busy_url or url, busy, clients, seconds + 1.0, warmup=0.5))
    results = await asyncio.gather(*runs)
    return {"quiet": results[0], "busy": results[1] if busy is not None else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", default=str(REPO / "serving" / "demo_model"), help="directory of the loaded model")
    p.add_argument("--quiet", default=None, help="directory of the measured model (default: --busy's)")
    p.add_argument("--clients", type=int, default=32, help="closed-loop clients loading the busy model")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--threads", type=int, default=None, help="--threads of the server (default: its own)")
    p.add_argument("--no-separate", action="store_true", help="skip the two-server comparison")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    def server(port: int, *models: str) -> list[str]:
        flags = [a for m in models for a in ("--classify-model", m)]
        threads = ["--threads", str(args.threads)] if args.threads else []
        return [sys.executable, "-m", "serving", "--port", str(port), "--log-level", "warning", *flags, *threads]

    port = free_port()
    url = f"http://127.0.0.1:{port}/classify"
    sample = texts()
    bodies = {name: [{"inputs": t, "model": name} for t in sample] for name in ("busy", "quiet")}
    proc = start(server(port, f"busy={args.busy}", f"quiet={args.quiet or args.busy}"), port)
    try:
        idle = asyncio.run(measure(url, bodies["quiet"], None, args.clients, args.seconds))
        loaded = asyncio.run(measure(url, bodies["quiet"], bodies["busy"], args.clients, args.seconds))
        shared = asyncio.run(measure(url, bodies["busy"], bodies["busy"], args.clients, args.seconds))
        separate = None
        if not args.no_separate:  # the quiet model stays here; the load goes to a server of its own
            other = free_port()
            second = start(server(other, f"busy={args.busy}"), other)
            try:
                busy_url = f"http://127.0.0.1:{other}/classify"
                separate = asyncio.run(
                    measure(url, bodies["quiet"], bodies["busy"], args.clients, args.seconds, busy_url)
                )
            finally:
                stop(second)
    finally:
        stop(proc)

    base = idle["quiet"]["p50_ms"]
    rows = [
        {"phase": "quiet model, server idle", **_row(idle, base)},
        {"phase": f"quiet model, {args.clients} clients on busy", **_row(loaded, base)},
        {"phase": f"one queue: busy model, {args.clients} clients on it", **_row(shared, base)},
    ]
    if separate is not None:
        rows.append({"phase": f"two servers: quiet alone, {args.clients} clients on the other", **_row(separate, base)})
    print_table(
        rows,
        [
            ("phase", "measured client"),
            ("p50_ms", "p50 ms"),
            ("p99_ms", "p99 ms"),
            ("ratio", "p50 / idle p50"),
            ("busy_rps", "busy req/s"),
        ],
    )
    ratio = rows[1]["ratio"]
    print(f"quiet p50 under load / idle: {ratio:.2f}x (goal: within 2x) -> {'met' if ratio <= 2 else 'not met'}")
    if args.json:
        payload = {
            "machine": machine(),
            "args": vars(args),
            "rows": rows,
            "ratio": ratio,
            "goal_met": ratio <= 2,
            "raw": {"idle": idle, "loaded": loaded, "shared": shared, "separate": separate},
        }
        print("wrote", write_json(args.json, payload))
    return 0


def _row(result: dict, base: float) -> dict:
    quiet, busy = result["quiet"], result["busy"]
    return {
        "p50_ms": quiet["p50_ms"],
        "p99_ms": quiet["p99_ms"],
        "ratio": quiet["p50_ms"] / base if quiet["p50_ms"] and base else None,
        "busy_rps": busy["requests_per_s"] if busy else None,
        "errors": quiet["errors"] + (busy["errors"] if busy else 0),
    }


if __name__ == "__main__":
    sys.exit(main())
