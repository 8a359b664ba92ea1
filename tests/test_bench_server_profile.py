"""bench.server_profile's bookkeeping, on py-spy's raw format written by hand: each sample goes to the stage of
its innermost matching frame, the overhead is every thread but the model's, and before -> after rows line up."""

from __future__ import annotations

import pytest

from bench.server_profile import categorize, compare, server_overhead

LOOP = "thread (101): MainThread;run (asyncio/runners.py:118)"
WORKER = "thread (102): infer-demo_0;_work (serving/batcher.py:200)"
RAW = "\n".join(
    [
        # tokenising under the route: the innermost stage wins over "routes + engine glue"
        f"{LOOP};endpoint (serving/routes/api.py:10);encode (bert/tokenizer.py:168) 30",
        f"{LOOP};_answer (serving/routes/lean.py:60);AnswerResponse.render (serving/routes/api.py:39) 5",
        f"{LOOP};__call__ (serving/routes/lean.py:45);_parse (serving/routes/lean.py:90) 4",
        f"{LOOP};__call__ (serving/middleware.py:120) 10",
        f"{WORKER};run (runtime/backends/onnx_backend.py:80) 40",
        f"{WORKER} 20",  # the batcher's own Python
        "not a sample line",
    ]
)


@pytest.fixture
def found(tmp_path):
    raw = tmp_path / "c32.raw.txt"
    raw.write_text(RAW)
    return categorize(raw)


def test_samples_go_to_the_innermost_stage(found):
    assert found["stages"] == {
        "tokenize": 30,
        "JSON (parse, render)": 9,
        "HTTP + ASGI (uvicorn, starlette, fastapi, middleware)": 10,
        "model run": 40,
        "batching (queue, pad, split)": 20,
    }
    assert found["names"] == {101: "MainThread", 102: "infer-demo"}


def test_overhead_is_every_thread_but_the_models(found):
    threads = [
        {"thread": "MainThread", "cpu_ms_per_request": 0.6},
        {"thread": "codec", "cpu_ms_per_request": 0.2},
        {"thread": "infer-demo", "cpu_ms_per_request": 2.8},
        {"thread": "native (no Python frames)", "cpu_ms_per_request": 0.4},
    ]
    overhead = server_overhead(threads, found, samples_per_ms=100.0)
    assert overhead["overhead_ms_per_request"] == pytest.approx(0.8)
    assert overhead["overhead_share"] == pytest.approx(0.8 / 4.0)
    assert overhead["inference_python_ms_per_request"] == pytest.approx(0.2)  # 20 samples outside the model run


def _run(loop_ms: float, model_ms: float, rps: float) -> dict:
    threads = [
        {"thread": "MainThread", "cpu_ms_per_request": loop_ms},
        {"thread": "infer-demo", "cpu_ms_per_request": model_ms},
    ]
    return {
        "load": {"requests_per_s": rps},
        "threads": threads,
        "overhead_ms_per_request": loop_ms,
        "overhead_share": loop_ms / (loop_ms + model_ms),
        "inference_python_ms_per_request": 0.1,
        "gil_stages": [{"stage": "tokenize", "gil_ms_per_request": loop_ms / 2}],
    }


def test_compare_gives_the_median_of_each_side():
    before = [_run(0.8, 2.4, 500), _run(0.6, 2.4, 520), _run(0.7, 2.4, 90)]  # the last run disturbed
    rows = {r["what"]: r for r in compare(before, [_run(0.5, 2.4, 560)])}
    assert rows["requests/s"]["before"] == pytest.approx(500)
    assert rows["overhead, ms/request"]["before"] == pytest.approx(0.7)
    assert rows["overhead, ms/request"]["after"] == pytest.approx(0.5)
    assert rows["overhead, ms/request"]["change"] == "-29 %"
    assert rows["  CPU: inference"]["after"] == pytest.approx(2.4)
    assert rows["  GIL: tokenize"]["before"] == pytest.approx(0.35)
    assert rows["overhead, % of the request's CPU"]["after"] == pytest.approx(100 * 0.5 / 2.9)
