"""A backend that fails on one batch: the requests in that batch get a JSON 500, the server keeps
serving (Ray Serve semantics). The failing backend is selected with `--backend module:factory`."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest
from test_serving_support import Server, build_checkpoint

POISON = "[MASK]"  # a special token: always exactly one id (103) in the uncased vocab
POISON_ID = 103


def failing_backend(spec, settings):
    """The torch backend, except that a batch holding the [MASK] id raises (used by the server process)."""
    from runtime.backends.torch_backend import TorchBackend

    class FailingTorchBackend(TorchBackend):
        name = "torch-failing"

        def run(self, batch):
            if np.any(batch["input_ids"] == POISON_ID):
                raise RuntimeError("poisoned batch")
            return super().run(batch)

    return FailingTorchBackend(spec, settings)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "multi")
    srv = Server(
        "--model",
        str(checkpoint),
        "--backend",
        "test_serving_failures:failing_backend",
        "--max-wait-ms",
        "30",
        "--max-batch-requests",
        "4",
    )
    with srv:
        yield srv


def test_failing_batch_fails_its_requests_only(server):
    url = server.url
    alone = httpx.post(url + "/classify", json={"inputs": f"this is {POISON} bad"}, timeout=30)
    assert alone.status_code == 500
    assert alone.json()["error_type"] == "backend" and "poisoned batch" in alone.json()["error"]
    # one poisoned input fails its whole request, whatever else the request held
    mixed = httpx.post(url + "/classify", json={"inputs": ["fine", f"{POISON} here"]}, timeout=30)
    assert mixed.status_code == 500 and set(mixed.json()) == {"error", "error_type"}

    async def burst():
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            bodies = [
                {"inputs": f"poison {POISON} {i}"} if i % 4 == 0 else {"inputs": f"clean text number {i}"}
                for i in range(24)
            ]
            answers = await asyncio.gather(*(c.post("/classify", json=b) for b in bodies))
            return list(zip(bodies, answers))

    results = asyncio.run(burst())
    poisoned = [r for b, r in results if POISON in b["inputs"]]
    clean = [r for b, r in results if POISON not in b["inputs"]]
    assert all(r.status_code == 500 and r.json()["error_type"] == "backend" for r in poisoned)
    # a clean request fails only when it shared a batch (at most 4 sequences) with a poisoned one
    clean_failed = sum(r.status_code == 500 for r in clean)
    assert all(r.status_code in (200, 500) for r in clean)
    assert clean_failed <= 3 * len(poisoned), clean_failed
    print(
        f"bar 4: {len(poisoned)} poisoned -> 500; clean: {len(clean) - clean_failed} x 200, "
        f"{clean_failed} x 500 (shared a poisoned batch)"
    )
    # later requests succeed
    for i in range(5):
        r = httpx.post(url + "/ner", json={"inputs": f"later request {i} in Berlin"}, timeout=30)
        assert r.status_code == 200, r.text
    assert httpx.get(url + "/ready").status_code == 200
    metrics = httpx.get(url + "/metrics").text
    assert 'bertserve_requests_total{endpoint="/classify",status="500"}' in metrics


def slow_warmup_backend(spec, settings):
    """The torch backend with a warm-up that takes a while, to watch /ready."""
    import time

    from runtime.backends.torch_backend import TorchBackend

    class SlowWarmup(TorchBackend):
        def warmup(self, **kwargs):
            time.sleep(2.0)
            super().warmup(**kwargs)

    return SlowWarmup(spec, settings)


def test_ready_only_after_warmup(tmp_path):
    import time

    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server("--model", str(checkpoint), "--backend", "test_serving_failures:slow_warmup_backend")
    try:
        deadline = time.monotonic() + 60
        while True:  # wait for the port to answer at all
            try:
                first = httpx.get(server.url + "/ready", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.process.poll() is None, server.log()
                time.sleep(0.05)
        assert first.status_code == 503 and first.json()["error_type"] == "unavailable", first.text
        assert httpx.get(server.url + "/health").status_code == 200
        early = httpx.post(server.url + "/classify", json={"inputs": "too early"})
        # the port answers from before the model loads (serving/startup.py): "loading", then "warming up"
        assert early.status_code == 503 and re.search("loading|warming up", early.json()["error"]), early.text
        server.wait_ready(30)
        assert httpx.post(server.url + "/classify", json={"inputs": "now"}).status_code == 200
    finally:
        assert server.stop() == 0
