"""SIGTERM under load: admitted requests all get their answers, new ones get 503, the process exits 0.

The backend is the torch one slowed to >= 50 ms a batch (`--backend module:factory`), so the load
outlasts the signal on any machine."""
from __future__ import annotations

import asyncio
import signal
import time

import httpx

from test_serving_support import Server, build_checkpoint

TEXT = "the film is slow but the actors carry it through to a satisfying and surprising end"


def slow_backend(spec, settings):
    from serving.backends.torch_backend import TorchBackend

    class SlowTorchBackend(TorchBackend):
        def run(self, batch):
            time.sleep(0.05)
            return super().run(batch)

    return SlowTorchBackend(spec, settings)


def test_sigterm_finishes_admitted_requests_and_exits_0(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server("--model", str(checkpoint), "--backend", "test_serving_shutdown:slow_backend",
                    "--max-batch-requests", "8").wait_ready()
    url = server.url
    requests = 30  # x 8 inputs = 240 sequences = 30+ batches of >= 50 ms

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=100)) as c:
            tasks = [asyncio.create_task(c.post("/ner", json={"inputs": [TEXT] * 8})) for _ in range(requests)]
            # SIGTERM once every request has been admitted: its 8 sequences are queued, running or done
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                metrics = (await c.get("/metrics")).text
                queued = float(next(line.split()[-1] for line in metrics.splitlines()
                                    if line.startswith("bertserve_queue_depth ")))
                if queued / 8 + sum(t.done() for t in tasks) + 2 >= requests:  # + one running, one ready
                    break
                await asyncio.sleep(0.01)
            in_flight = sum(not t.done() for t in tasks)
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            try:  # while draining, a new request is refused with a JSON 503 (or the port is already closed)
                late = await c.post("/classify", json={"inputs": "late"}, headers={"connection": "close"})
            except httpx.TransportError as e:
                late = e
            answers = await asyncio.gather(*tasks, return_exceptions=True)
            return in_flight, late, answers

    started = time.perf_counter()
    in_flight, late, answers = asyncio.run(scenario())
    returncode = server.process.wait(timeout=60)
    elapsed = time.perf_counter() - started
    statuses = [a.status_code if isinstance(a, httpx.Response) else repr(a) for a in answers]
    late_status = late.status_code if isinstance(late, httpx.Response) else type(late).__name__
    print(f"bar 5: {in_flight} of {requests} requests in flight at SIGTERM; statuses {set(statuses)}; late request "
          f"-> {late_status}; exit code {returncode} after {elapsed:.1f}s")
    assert in_flight > 0, "the load was over before SIGTERM; the test proves nothing"
    assert statuses == [200] * requests, statuses
    assert all(len(a.json()) == 8 for a in answers)
    if isinstance(late, httpx.Response):
        assert late.status_code == 503 and late.json()["error_type"] == "unavailable"
    assert returncode == 0, server.log()[-2000:]
