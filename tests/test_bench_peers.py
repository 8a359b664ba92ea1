"""The peer benchmark (bench/peers): one command drives a real bertserve and a server of another shape
through their adapters with the load generator, scores their answers against the fp32 reference,
skips a peer whose endpoint is missing, and writes its JSON with the keys the docs promise.
infinity itself runs only where its venv exists (python -m bench.peers.infinity_env)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from test_serving_support import CLS_LABELS, build_checkpoint

from bench.cpu import tree_cpu_seconds
from bench.peers import Peer, bertserve_adapter, infinity_adapter

# A stand-in for another product's server: infinity's /classify shape (labels by sentence length, so
# it disagrees with the model on some sentences), and no /embed at all.
FAKE_SERVER = """
import sys
import uvicorn
from fastapi import FastAPI

app = FastAPI()

@app.get("/health")
def health():
    return {"unix": 0.0}

@app.post("/classify")
def classify(body: dict):
    positive = 0.9 if len(body["input"][0]) % 2 else 0.1
    return {"object": "classify", "data": [sorted([{"score": positive, "label": "positive"},
                                                   {"score": 1 - positive, "label": "negative"}],
                                                  key=lambda s: -s["score"])]}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def fake_peer(name: str, server: str, task: str, adapter) -> Peer:
    return Peer(name, server, task, "none", "fp32", [sys.executable, "-c", FAKE_SERVER, "{port}"], adapter)


def test_peers_command_measures_bertserve_and_another_server(tmp_path, monkeypatch, data_dir, minilm_dir):
    from bench.peers import __main__ as peers_main
    from bench.peers import catalog

    ckpt = build_checkpoint(tmp_path / "ckpt")
    peers = {
        "classify": [
            catalog.bertserve_peer("bertserve-torch-fp32", "classify", ckpt, 1, ["--backend", "torch"], "torch"),
            fake_peer("fake-infinity", "infinity", "classify", infinity_adapter("classify")),
        ],
        "embed": [fake_peer("fake-bertserve-embed", "bertserve", "embed", bertserve_adapter("embed"))],
    }
    monkeypatch.setattr(catalog, "catalog", lambda task, *args: peers[task])
    out = tmp_path / "peers.json"
    t0 = time.monotonic()
    assert (
        peers_main.main(
            [
                "--task",
                "classify,embed",
                "--concurrency",
                "1,2",
                "--seconds",
                "1",
                "--warmup",
                "0.2",
                "--sample",
                "16",
                "--classify-model",
                str(ckpt),
                "--busy",
                "warn",
                "--check-seconds",
                "0.2",
                "--work-dir",
                str(tmp_path / "work"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    print(f"peer benchmark ran in {time.monotonic() - t0:.1f} s")
    result = json.loads(out.read_text())

    assert {
        "machine",
        "command",
        "settings",
        "versions",
        "peers",
        "quality",
        "rows",
        "skipped",
        "summary",
        "plots",
        "references",
    } <= set(result)
    rows = {(r["peer"], r["concurrency"]): r for r in result["rows"]}
    assert set(rows) == {(p, c) for p in ("bertserve-torch-fp32", "fake-infinity") for c in (1, 2)}
    for r in rows.values():
        assert r["task"] == "classify" and r["errors"] == 0 and r["requests_per_s"] > 0 and r["p99_ms"] > 0
        assert r["server_cpu_cores"] > 0 and r["client_cpu_cores"] > 0 and r["other_cpu_cores"] >= 0
        assert {"loadavg_1m", "other_cpu_cores", "busy", "busiest"} <= set(r["load_check"])
        assert isinstance(r["busy"], bool)
    assert rows[("bertserve-torch-fp32", 2)]["mean_batch"] >= 1  # bertserve's own counters, read from /metrics

    quality = {q["peer"]: q for q in result["quality"]}
    # bertserve's torch model and transformers' on the same fp32 weights: the same labels.
    assert quality["bertserve-torch-fp32"]["agree_pct"] == 100 and quality["bertserve-torch-fp32"]["failed"] == 0
    assert quality["bertserve-torch-fp32"]["n"] == 16 and "accuracy_pct" in quality["bertserve-torch-fp32"]
    assert quality["fake-infinity"]["failed"] == 0 and quality["fake-infinity"]["agree_pct"] < 100

    best = result["summary"]["classify"]["2"]
    assert best["best"]["bertserve"]["peer"] == "bertserve-torch-fp32"
    assert best["best"]["infinity"]["peer"] == "fake-infinity"
    assert best["bertserve_over_infinity"] == pytest.approx(
        rows[("bertserve-torch-fp32", 2)]["requests_per_s"] / rows[("fake-infinity", 2)]["requests_per_s"]
    )

    [skipped] = result["skipped"]
    assert skipped["peer"] == "fake-bertserve-embed" and skipped["task"] == "embed" and "404" in skipped["reason"]
    assert [p["name"] for p in result["peers"]] == ["bertserve-torch-fp32", "fake-infinity"]
    assert result["references"]["embed"]["n"] == 16


def test_server_cpu_counts_the_whole_process_tree():
    """A server's CPU includes its workers': here a grandchild that burns 1 s while the others sleep
    (two interpreter start-ups cost far less than the 0.9 s asked for)."""
    burn = "import time; t = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}]); import time; time.sleep(30)",
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while tree_cpu_seconds(parent.pid) < 0.9 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tree_cpu_seconds(parent.pid) >= 0.9
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.slow
def test_infinity_peer_classifies_through_its_adapter(tmp_path, data_dir, minilm_dir):
    import asyncio

    from bench.peers import catalog, infinity_env
    from bench.peers.quality import decode
    from bench.server_bench import collect, serve

    if not infinity_env.is_ready(catalog.WORK):
        pytest.skip(
            f"infinity's venv is not set up at {infinity_env.venv_dir(catalog.WORK)} "
            "(python -m bench.peers.infinity_env)"
        )
    ckpt = build_checkpoint(tmp_path / "ckpt", task="classify")
    hf = catalog.transformers_classifier(ckpt, tmp_path / "work")
    peer = catalog.infinity_peer(
        "infinity-torch-fp32", "classify", "torch", "fp32", lambda: hf, catalog.WORK, setup=False
    )
    peer.prepare()
    sentences = ["a gripping film", "dull", "I loved every minute of it."]
    with serve(peer, timeout=240) as (_, url):
        answers = decode(
            peer.adapter, asyncio.run(collect(url + peer.adapter.path, [peer.adapter.body(s) for s in sentences], 2))
        )
    assert all(a in CLS_LABELS for a in answers), answers


def test_bertserve_onnx_peers_serve_the_default_export_and_say_what_it_chose(tmp_path):
    from bench.peers import catalog

    peers = catalog.catalog("embed", tmp_path, 1, tmp_path / "work", setup=False)
    ours = [p.name for p in peers if p.server == "bertserve"]
    assert "bertserve-default" in ours and "bertserve-ort-int8" not in ours
    manifest = {
        "source": {"path": "/ckpt"},
        "precision": "int8",
        "precision_choice": {"candidates": {"fp32": {"seconds": 0.2}, "int8": {"seconds": 0.1}}},
        "quantization": {"agreement": 0.9961, "fp32_groups": ["layer 0 ffn-out", "embeddings"]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    line = catalog.describe_default_export(tmp_path)
    assert line.startswith("bertserve's default export (python -m export.onnx with no precision flags) of /ckpt: int8")
    assert "fp32 200 ms, int8 100 ms" in line and "0.9961" in line and "layer 0 ffn-out, embeddings" in line


def test_rerank_items_and_adapters_pick_the_best_text(data_dir):
    from bench.peers import catalog
    from bench.peers.quality import score
    from bench.server_bench import RERANK_TEXTS, work_items

    items = work_items("rerank", 5)
    assert len(items) == 5
    assert all(len(item["texts"]) == RERANK_TEXTS and item["query"].strip() for item in items)
    ours, theirs = bertserve_adapter("rerank"), infinity_adapter("rerank")
    assert ours.body(items[0]) == {"query": items[0]["query"], "texts": items[0]["texts"]}
    assert theirs.body(items[0])["documents"] == items[0]["texts"]
    # bertserve answers best first; infinity's results are compared by score, whatever their order
    assert ours.answer([{"index": 3, "score": 0.9}, {"index": 0, "score": 0.1}]) == 3
    assert theirs.answer({"results": [{"index": 0, "relevance_score": 0.1}, {"index": 2, "relevance_score": 0.7}]}) == 2
    assert score("rerank", [3, 1, None], [3, 2, 0])["agree_pct"] == pytest.approx(100 / 3)
    with pytest.raises(catalog.PeerUnavailable, match="--rerank-model"):
        catalog.rerank_model(None)


def test_a_preparation_step_that_does_not_end_makes_the_peer_unavailable():
    """A step that makes a peer's files (an export in infinity's venv) and runs past its time is stopped and the peer
    skipped with the reason, so that one peer's hang never holds up the others."""
    from bench.peers import PeerUnavailable
    from bench.peers.catalog import run_step

    with pytest.raises(PeerUnavailable, match="a slow export did not finish in 1 s"):
        run_step([sys.executable, "-c", "import time; time.sleep(600)"], "a slow export", timeout=1)


def test_deberta_bench_without_its_tokenizer_text_is_one_line_and_exit_2(tmp_path):
    """Its --help needs no data; a run without the WikiText-2 text the tokenizer is trained on stops before any
    work, with the path it looked for."""
    import os

    env = {**os.environ, "BERTSERVE_TEST_DATA": str(tmp_path)}
    command = [sys.executable, "-m", "bench.peers.deberta_xsmall"]
    shown = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and "--concurrency" in shown.stdout, shown.stderr
    run = subprocess.run(
        [*command, "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 2 and not (tmp_path / "work").exists()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "wikitext-2-raw" / "wiki.test.raw") in lines[0], run.stderr
