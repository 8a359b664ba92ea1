"""SIGTERM under load: admitted requests all get their answers, new ones get 503, the process exits 0."""
from __future__ import annotations

import asyncio
import signal
import time

import httpx

from test_serving_support import Server, build_checkpoint

TEXT = "the film is slow but the actors carry it through to a satisfying and surprising end " * 4


def test_sigterm_finishes_admitted_requests_and_exits_0(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server("--model", str(checkpoint), "--max-batch-requests", "8", "--max-wait-ms", "5").wait_ready()
    url = server.url

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=100)) as c:
            tasks = [asyncio.create_task(c.post("/ner", json={"inputs": [TEXT] * 16})) for _ in range(30)]
            await asyncio.sleep(0.5)  # all 30 admitted and queued behind one another
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
    print(f"bar 5: {in_flight} of 30 requests in flight at SIGTERM; statuses {set(statuses)}; late request "
          f"-> {late_status}; exit code {returncode} after {elapsed:.1f}s")
    assert in_flight > 0, "the load was over before SIGTERM; the test proves nothing"
    assert statuses == [200] * 30, statuses
    assert all(len(a.json()) == 16 for a in answers)
    if isinstance(late, httpx.Response):
        assert late.status_code == 503 and late.json()["error_type"] == "unavailable"
    assert returncode == 0, server.log()[-2000:]
