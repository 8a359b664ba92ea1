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
    from runtime.backends.torch_backend import TorchBackend

    class SlowTorchBackend(TorchBackend):
        def run(self, batch):
            time.sleep(0.05)
            return super().run(batch)

    return SlowTorchBackend(spec, settings)


def test_sigterm_finishes_admitted_requests_and_exits_0(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server(
        "--model", str(checkpoint), "--backend", "test_serving_shutdown:slow_backend", "--max-batch-requests", "8"
    ).wait_ready()
    url = server.url
    requests = 30  # x 8 inputs = 240 sequences = 30+ batches of >= 50 ms

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=100)) as c:
            tasks = [asyncio.create_task(c.post("/ner", json={"inputs": [TEXT] * 8})) for _ in range(requests)]
            # SIGTERM once every request has been admitted: its 8 sequences are queued, running or done
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                metrics = (await c.get("/metrics")).text
                queued = float(
                    next(line.split()[-1] for line in metrics.splitlines() if line.startswith("bertserve_queue_depth "))
                )
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
    print(
        f"bar 5: {in_flight} of {requests} requests in flight at SIGTERM; statuses {set(statuses)}; late request "
        f"-> {late_status}; exit code {returncode} after {elapsed:.1f}s"
    )
    assert in_flight > 0, "the load was over before SIGTERM; the test proves nothing"
    assert statuses == [200] * requests, statuses
    assert all(len(a.json()) == 8 for a in answers)
    if isinstance(late, httpx.Response):
        assert late.status_code == 503 and late.json()["error_type"] == "unavailable"
    assert returncode == 0, server.log()[-2000:]


def very_slow_backend(spec, settings):
    from runtime.backends.torch_backend import TorchBackend

    class VerySlowTorchBackend(TorchBackend):
        def run(self, batch):
            time.sleep(0.25)
            return super().run(batch)

    return VerySlowTorchBackend(spec, settings)


async def _load_then_signal(server, requests: int, signals: list[float]):
    """`requests` /ner requests of 8 texts; once all are admitted, SIGTERM at each offset in `signals` (s).
    Returns (in flight at the first signal, each request's response or exception, seconds from the first
    signal to the process's exit)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=100)) as c:
        tasks = [asyncio.create_task(c.post("/ner", json={"inputs": [TEXT] * 8})) for _ in range(requests)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every request admitted: its sequences are queued or running
            metrics = (await c.get("/metrics")).text
            queued = float(
                next(line.split()[-1] for line in metrics.splitlines() if line.startswith("bertserve_queue_depth "))
            )
            if queued / 8 + sum(t.done() for t in tasks) + 2 >= requests:
                break
            await asyncio.sleep(0.01)
        in_flight = sum(not t.done() for t in tasks)
        first = time.monotonic()
        for offset in signals:
            await asyncio.sleep(max(0.0, first + offset - time.monotonic()))
            server.process.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*tasks, return_exceptions=True)
    while server.process.poll() is None and time.monotonic() - first < 60:
        await asyncio.sleep(0.01)
    return in_flight, answers, time.monotonic() - first


def _statuses(answers) -> list:
    out = []
    for a in answers:
        if isinstance(a, httpx.Response):
            assert a.status_code in (200, 503), (a.status_code, a.text)
            if a.status_code == 503:
                assert a.json()["error_type"] == "unavailable" and "shutting down" in a.json()["error"]
            out.append(a.status_code)
        else:
            out.append(repr(a))
    return out


def test_sigterm_past_the_timeout_answers_the_rest_with_json_503(tmp_path):
    """Issue 11, bar 3: 32 long requests in flight, a timeout shorter than their work: each gets 200 or a
    JSON 503 (never a plain-text 500 or a cut connection), and the process exits 0 soon after the timeout."""
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server(
        "--model",
        str(checkpoint),
        "--backend",
        "test_serving_shutdown:very_slow_backend",
        "--max-batch-requests",
        "8",
        "--inference-workers",
        "1",
        "--shutdown-timeout-s",
        "1",
    ).wait_ready()
    in_flight, answers, exit_s = asyncio.run(_load_then_signal(server, 32, [0.0]))
    statuses = _statuses(answers)
    print(
        f"bar 3: {in_flight} of 32 in flight at SIGTERM; {statuses.count(200)} x 200, {statuses.count(503)} x 503; "
        f"exit {server.process.returncode} {exit_s:.2f}s after SIGTERM (timeout 1 s)"
    )
    assert in_flight >= 16, "the load was over before SIGTERM; the test proves nothing"
    assert set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses, statuses
    assert server.process.returncode == 0, server.log()[-3000:]
    assert exit_s < 1 + 2, exit_s  # the timeout, then at most 1 s for the 503s to go out and 1 s to stop
    assert "Traceback" not in server.log(), server.log()[-3000:]


def test_second_sigterm_exits_at_once(tmp_path):
    """Issue 11, bar 3: a second SIGTERM during a long drain stops the server within 2 s, and every admitted
    request still gets 200 or a JSON 503."""
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server(
        "--model",
        str(checkpoint),
        "--backend",
        "test_serving_shutdown:very_slow_backend",
        "--max-batch-requests",
        "8",
        "--inference-workers",
        "1",
        "--shutdown-timeout-s",
        "60",
    ).wait_ready()
    in_flight, answers, exit_s = asyncio.run(_load_then_signal(server, 32, [0.0, 0.5]))
    statuses = _statuses(answers)
    second_to_exit = exit_s - 0.5
    print(
        f"bar 3: second SIGTERM -> exit {server.process.returncode} after {second_to_exit:.2f}s; "
        f"{statuses.count(200)} x 200, {statuses.count(503)} x 503"
    )
    assert in_flight >= 16
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    assert second_to_exit < 2.0, second_to_exit
    assert server.process.returncode == 128 + signal.SIGTERM, server.log()[-3000:]


def test_drain_delay_keeps_serving_while_ready_says_503(tmp_path):
    """Issue 21: on SIGTERM /ready turns 503 at once, while every request that arrives during --drain-delay-s
    is still answered (a load balancer needs that long to notice); after it, admission closes as before."""
    checkpoint = build_checkpoint(tmp_path / "multi")
    delay = 2.0
    server = Server(
        "--model", str(checkpoint), "--backend", "test_serving_shutdown:slow_backend", "--drain-delay-s", str(delay)
    ).wait_ready()

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            sent: list[tuple[float, object]] = []  # (seconds after SIGTERM it was sent, response or exception)
            signalled = [None]

            async def client():  # closed loop, new requests through the delay's first half
                # Sent no later than that, a request reaches the server well inside the delay even on a loaded
                # machine; one sent just before the delay ends may be read after it (a 503, or a connection
                # closed unread at exit): the contract's other side, not a fault.
                while signalled[0] is None or time.monotonic() - signalled[0] < delay / 2:
                    at = time.monotonic() - (signalled[0] or time.monotonic())
                    try:
                        sent.append((at, await c.post("/classify", json={"inputs": TEXT})))
                    except httpx.TransportError as e:
                        sent.append((at, e))

            clients = [asyncio.create_task(client()) for _ in range(4)]
            await asyncio.sleep(0.5)
            signalled[0] = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            ready = await c.get("/ready")
            await asyncio.gather(*clients)
            await asyncio.sleep(delay + 0.5 - (time.monotonic() - signalled[0]))
            try:  # past the delay: admission closed (a JSON 503), or the port already closed
                late = await c.post("/classify", json={"inputs": TEXT}, headers={"connection": "close"})
            except httpx.TransportError as e:
                late = e
            return signalled[0], ready, sent, late

    signalled, ready, sent, late = asyncio.run(scenario())
    returncode = server.process.wait(timeout=30)
    exit_s = time.monotonic() - signalled
    during = [r for at, r in sent if at >= 0]
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in during]
    print(
        f"drain delay {delay}s: /ready -> {ready.status_code} at 0.1 s; {len(during)} requests sent during the "
        f"delay: {set(statuses)}; late -> {getattr(late, 'status_code', type(late).__name__)}; "
        f"exit {returncode} after {exit_s:.2f}s"
    )
    assert ready.status_code == 503 and "shutting down" in ready.json()["error"]
    assert len(during) >= 8 and statuses == [200] * len(during), statuses
    assert all(r.headers["connection"] == "close" for r in during)  # no kept-alive connection outlives the delay
    if isinstance(late, httpx.Response):
        assert late.status_code == 503 and late.json()["error_type"] == "unavailable"
    assert returncode == 0, server.log()[-2000:]
    assert delay <= exit_s < delay + 3, exit_s


def test_second_sigterm_during_the_drain_delay_exits_at_once(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server("--model", str(checkpoint), "--drain-delay-s", "30").wait_ready()
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert httpx.get(server.url + "/ready").status_code == 503
    assert httpx.post(server.url + "/classify", json={"inputs": TEXT}).status_code == 200
    second = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    returncode = server.process.wait(timeout=10)
    assert time.monotonic() - second < 2.0
    assert returncode == 128 + signal.SIGTERM, server.log()[-2000:]
