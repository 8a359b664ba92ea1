"""Instructions the server executes per /classify (or /qa) request, counted by callgrind: a figure that the load of
a shared machine does not move, for comparing two checkouts' request paths.

    python -m bench.server_instructions --model ARTIFACT                  # this checkout
    python -m bench.server_instructions --model ARTIFACT --cwd /tmp/before
    python -m bench.server_instructions --model serving/demo_model --task qa

In one process, without sockets: uvicorn's HTTP protocol as `python -m serving` builds it (serving/protocol.py)
on an in-memory transport, the app on the no-op backend (bench/noop_backend.py), 32 kept-alive connections with
a request in flight on each, single SST-2 dev sentences (with --task qa: one held-out SQuAD question and its
paragraph each, bench/server_bench.py's). Two runs under `valgrind --tool=callgrind` (256 and 768 requests after as many of warm-up);
their difference over the extra requests is the figure, so start-up cancels out. It counts every thread (the
no-op inference worker's share is small) and no kernel time (socket reads and writes). Each run takes a minute
or two under valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import subprocess
import sys
from pathlib import Path

from bench.common import DATA_DIR, REPO

SST2_DEV = DATA_DIR / "SST-2" / "dev.tsv"
PATHS = {"classify": "/classify", "qa": "/qa"}


class _Transport:
    """What uvicorn's protocol writes to; the response's bytes are kept for a check."""

    def __init__(self):
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args, **kwargs) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def _bodies(task: str) -> list[dict]:
    if task == "qa":
        from bench.server_bench import work_items

        return work_items("qa", 872)
    return [{"inputs": line.split("\t")[0]} for line in SST2_DEV.read_text().splitlines()[1:]]


async def _drive(model: str, requests: int, concurrency: int, task: str = "classify") -> None:
    import orjson
    import uvicorn
    from uvicorn.server import ServerState

    from serving.app import create_app
    from serving.engine import Engine
    from serving.metrics import Metrics
    from serving.protocol import http_protocol
    from serving.settings import Settings

    raw = []
    for item in _bodies(task):
        body = orjson.dumps(item)
        head = (
            f"POST {PATHS[task]} HTTP/1.1\r\nhost: 127.0.0.1:8000\r\naccept: */*\r\naccept-encoding: gzip, deflate\r\n"
            f"connection: keep-alive\r\nuser-agent: python-httpx/0.28.1\r\ncontent-length: {len(body)}\r\n"
            "content-type: application/json\r\n\r\n"
        )
        raw.append(head.encode() + body)
    try:  # the collector's threshold, as `python -m serving` sets it where it does
        from serving.__main__ import GC_YOUNG_THRESHOLD

        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    except ImportError:
        pass
    settings = Settings(model=model, backend="bench.noop_backend:NoopBackend", log_level="warning")
    engine = Engine(settings, Metrics())
    engine.load()
    app = create_app(settings, engine=engine)
    config = uvicorn.Config(app, http=http_protocol(settings.header_timeout_s), access_log=False, log_level="warning")
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()

    async def client(k: int, count: int) -> None:
        # One kept-alive connection per client, as the load generators keep theirs (bench/server_bench.py).
        protocol = config.http_protocol_class(config=config, server_state=state, app_state={})
        transport = _Transport()
        protocol.connection_made(transport)
        for i in range(count):
            done = loop.create_future()
            transport.out.clear()
            protocol.data_received(raw[(k * 997 + i) % len(raw)])
            finish = protocol.cycle.on_response

            def on_response(finish=finish, done=done):
                finish()
                done.done() or done.set_result(None)

            protocol.cycle.on_response = on_response
            await done
            if not transport.out or not transport.out[0].startswith(b"HTTP/1.1 200 "):
                raise RuntimeError(f"unexpected response: {b''.join(transport.out)[:300]!r}")
        protocol.connection_lost(None)

    async with app.router.lifespan_context(app):
        while not app.state.server.ready:
            await asyncio.sleep(0.05)
        for _ in range(2):  # warm-up, then the counted requests
            await asyncio.gather(*(client(k, requests // concurrency) for k in range(concurrency)))


def _collected(cwd: Path, model: str, requests: int, concurrency: int, task: str) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(Path(__file__).resolve()),  # this file, run against `cwd`'s serving/ and bert/ (an older one lacks it)
        "--model",
        model,
        "--drive",
        str(requests),
        "--concurrency",
        str(concurrency),
        "--task",
        task,
    ]
    env = {**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or not found:
        raise SystemExit(f"callgrind run failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="an artifact or checkpoint dir (its config and tokenizer)")
    p.add_argument("--cwd", type=Path, default=REPO, help="checkout whose serving/ and bert/ run")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--task", choices=tuple(PATHS), default="classify")
    p.add_argument("--drive", type=int, help=argparse.SUPPRESS)  # inside valgrind: serve this many requests
    args = p.parse_args(argv)
    if args.drive is not None:
        import uvloop

        uvloop.run(_drive(args.model, args.drive, args.concurrency, args.task))
        return 0
    small, large = 256, 768
    counts = [
        _collected(args.cwd.resolve(), str(Path(args.model).resolve()), n, args.concurrency, args.task)
        for n in (small, large)
    ]
    per_request = (counts[1] - counts[0]) / (2 * (large - small))
    print(f"{args.cwd}: {per_request / 1e6:.3f}M instructions per {PATHS[args.task]} request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
