"""The cost of a request is bounded before its work (issue 11, bar 2), and the server refuses what it
cannot serve at startup: a blank API key, a model that fails warm-up.

The figures for the closing note come from `python -m bench.qa_bound` on the demo model; this test holds
the same properties on a tiny model with generous margins (2 shared cores)."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import pytest
from test_serving_support import PYTHON, REPO, Server, build_checkpoint

CONTEXT_1MB = ("The quick brown fox jumps over the lazy dog near the river bank. " * 16_000)[:1_000_000]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("limits") / "multi")
    srv = Server("--model", str(checkpoint)).wait_ready()
    yield srv
    srv.stop()


def _rss_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def _huge_qa_body(url: str) -> bytes:
    schema = httpx.get(url + "/openapi.json").json()["components"]["schemas"]["QARequest"]
    max_stride = next(b["maximum"] for b in schema["properties"]["doc_stride"]["anyOf"] if b.get("type") == "integer")
    return json.dumps(
        {"question": "What does the fox jump over?", "context": CONTEXT_1MB, "doc_stride": max_stride}
    ).encode()


def test_huge_qa_context_is_refused_before_the_work(server):
    body = _huge_qa_body(server.url)
    peak_before = _rss_mb(server.process.pid, "VmHWM")
    times = []
    for _ in range(3):
        started = time.perf_counter()
        response = httpx.post(
            server.url + "/qa", content=body, headers={"content-type": "application/json"}, timeout=60
        )
        times.append(time.perf_counter() - started)
        assert response.status_code == 413, response.text
        assert "more than 256 windows" in response.json()["error"]
    growth = _rss_mb(server.process.pid, "VmHWM") - peak_before
    print(
        f"1 MB context at the largest doc_stride: 413 in {min(times):.3f}-{max(times):.3f} s, peak RSS +{growth:.1f} MB"
    )
    assert max(times) < 1.0 * 3  # the bar is 1 s; 3x for a shared CI machine
    assert growth < 50


def test_doc_stride_over_half_a_window_is_refused(server):
    response = httpx.post(server.url + "/qa", json={"question": "q", "context": "c", "doc_stride": 200})
    assert response.status_code == 422
    assert "at most 158" in response.json()["error"]


def test_short_requests_keep_their_latency_while_huge_ones_run(server):
    body = _huge_qa_body(server.url)

    def p99(client: httpx.Client, n: int = 150) -> float:
        latencies = []
        for _ in range(n):
            started = time.perf_counter()
            assert client.post("/classify", json={"inputs": "nice"}).status_code == 200
            latencies.append(time.perf_counter() - started)
        return sorted(latencies)[int(0.99 * n) - 1]

    stop, heavy_done = threading.Event(), [0]

    def heavy():
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while not stop.is_set():
                response = client.post("/qa", content=body, headers={"content-type": "application/json"})
                assert response.status_code == 413
                heavy_done[0] += 1

    with httpx.Client(base_url=server.url, timeout=60) as client:
        idle = p99(client)
        threads = [threading.Thread(target=heavy) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        try:
            loaded = p99(client)
        finally:
            stop.set()
            for t in threads:
                t.join()
    print(
        f"/classify p99 idle {idle * 1000:.1f} ms, with 4 huge /qa running {loaded * 1000:.1f} ms "
        f"({heavy_done[0]} of them answered meanwhile)"
    )
    assert heavy_done[0] >= 4
    assert loaded < max(3 * idle, idle + 0.15)  # the bar is 3x; + 150 ms of slack for a shared CI machine


def test_work_for_a_caller_that_has_gone_stops(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    with Server(
        "--model",
        str(checkpoint),
        "--backend",
        "test_serving_shutdown:very_slow_backend",
        "--inference-workers",
        "1",
        "--max-batch-requests",
        "4",
    ) as server:
        items = [{"question": "Where is the fox?", "context": "The fox is in the den. " * 400}] * 4  # 40 windows
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url + "/qa", json=items, timeout=0.6)
        time.sleep(1.0)
        run = _sequences_run(server.url)
        time.sleep(1.0)
        assert _sequences_run(server.url) == run, "batches kept running for a caller that had gone"
        assert run < 40
        assert httpx.post(server.url + "/classify", json={"inputs": "fine"}).status_code == 200


def _sequences_run(url: str) -> float:
    metrics = httpx.get(url + "/metrics").text
    return float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("bertserve_batch_size_sum")))


@pytest.mark.parametrize("key", ["", "   ", "\t"])
def test_blank_api_key_is_a_startup_error(key, tmp_path):
    run = subprocess.run(
        [PYTHON, "-m", "serving", "--model", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"BERTSERVE_API_KEY": key, "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "BERTSERVE_API_KEY" in lines[0] and "empty" in lines[0], run.stderr


def failing_warmup_backend(spec, settings):
    from runtime.backends.torch_backend import TorchBackend

    class FailingWarmup(TorchBackend):
        def warmup(self, **kwargs):
            raise RuntimeError("this model cannot run a batch")

    return FailingWarmup(spec, settings)


def test_a_model_that_fails_warm_up_makes_the_server_exit_2(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    server = Server("--model", str(checkpoint), "--backend", "test_serving_limits:failing_warmup_backend")
    code = server.process.wait(timeout=60)
    assert code == 2, server.log()
    assert "error: warm-up failed: RuntimeError: this model cannot run a batch" in server.log()
    assert "Traceback" not in server.log()


def _settings(argv, environ):
    from bert import options
    from serving.settings import Settings

    values = options.read(Settings, argv, environ=environ)
    return Settings(**{k: v for k, v in values.items() if values.sources[k] != "default"})


@pytest.mark.parametrize("argv, environ", [(["--qa-max-windows", "7"], {}), ([], {"BERTSERVE_QA_MAX_WINDOWS": "7"})])
def test_the_old_qa_max_windows_still_sets_the_fan_out_limit_with_a_warning(argv, environ, monkeypatch):
    """--qa-max-windows capped every task's fan-out, not only QA's: it is now --max-request-sequences, and
    deployed configurations that set the old name keep their limit (test_serving_api serves with it)."""
    assert _settings([], {}).max_request_sequences == 256
    for key, value in environ.items():
        monkeypatch.setenv(key, value)  # pydantic-settings reads the environment too
    with pytest.warns(FutureWarning, match="--qa-max-windows .* deprecated: use --max-request-sequences"):
        settings = _settings(argv, environ)
    assert settings.max_request_sequences == 7


def test_the_old_and_the_new_fan_out_limit_together_are_refused(capsys, monkeypatch):
    from serving.__main__ import main

    for key in ("BERTSERVE_QA_MAX_WINDOWS", "BERTSERVE_MAX_REQUEST_SEQUENCES"):
        monkeypatch.delenv(key, raising=False)
    assert main(["--qa-max-windows", "7", "--max-request-sequences", "9"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "deprecated name of max_request_sequences" in lines[0], lines
