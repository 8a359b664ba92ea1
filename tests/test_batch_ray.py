"""python -m batch --ray on a real local Ray cluster of two nodes (a head and a second `ray start --address` on
127.0.0.1, each stopped by its PID): the same rows, order, schema and manifest as the local job. Skipped without
ray (pip install 'bertserve[ray]': not in dev, a 240 MB install)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install 'bertserve[ray]')")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402
from test_serving_support import build_checkpoint, free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"


def _alive_nodes(address: str, env: dict) -> int:
    probe = (
        f"import ray; ray.init(address={address!r}, log_to_driver=False); "
        "print(sum(n['Alive'] for n in ray.nodes())); ray.shutdown()"
    )
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    return int(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 and run.stdout.strip() else 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a worker node, each `ray start --block` (it stops the processes it started when it is
    stopped), 2 logical CPUs each: a model-holding actor per node and room for the read and write tasks."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    logs = tmp_path_factory.mktemp("ray")
    common = ["--block", "--num-cpus", "2", "--disable-usage-stats"]
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--include-dashboard",
            "false",
            *common,
        ],
        env=env,
        stdout=open(logs / "head.log", "w"),
        stderr=subprocess.STDOUT,
    )
    nodes = [head]
    try:
        deadline = time.monotonic() + 120
        while _alive_nodes(address, env) < 1:
            assert head.poll() is None and time.monotonic() < deadline, (logs / "head.log").read_text()[-2000:]
            time.sleep(1)
        worker = subprocess.Popen(
            [RAY, "start", "--address", address, "--node-ip-address", "127.0.0.1", *common],
            env=env,
            stdout=open(logs / "node.log", "w"),
            stderr=subprocess.STDOUT,
        )
        nodes.append(worker)
        while _alive_nodes(address, env) < 2:
            assert worker.poll() is None and time.monotonic() < deadline, (logs / "node.log").read_text()[-2000:]
            time.sleep(1)
        yield address, env
    finally:
        for process in reversed(nodes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_a_ray_job_writes_what_the_local_job_writes(cluster, tmp_path):
    address, env = cluster
    model = build_checkpoint(tmp_path / "multi")
    texts = ["I loved this film.", "Terrible.", "My name is Wolfgang and I live in Berlin.", "ok", None, ""]
    ids = list(range(60))
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "text": [texts[i % len(texts)] for i in ids]}), source, row_group_size=10)
    common = [sys.executable, "-m", "batch", "--task", "classify", "--model", str(model), "--input", str(source)]
    common += ["--keep", "id", "--part-rows", "20", "--window-rows", "8", "--workers", "2", "--threads", "1"]
    local = subprocess.run([*common, "--output", str(tmp_path / "local")], env=env, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    on_ray = subprocess.run(
        [*common, "--output", str(tmp_path / "ray"), "--ray", address], env=env, capture_output=True, text=True
    )
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    ours, theirs = pq.read_table(tmp_path / "ray"), pq.read_table(tmp_path / "local")
    assert ours.schema == theirs.schema
    assert ours["id"].to_pylist() == ids  # every row once, in input order
    assert ours["label"].to_pylist() == theirs["label"].to_pylist()
    assert ours["error"].to_pylist() == theirs["error"].to_pylist() and ours["error"].null_count == 40
    for a, b in zip(ours["score"].to_pylist(), theirs["score"].to_pylist()):
        assert (a is None and b is None) or abs(a - b) < 1e-5
    manifest = json.loads((tmp_path / "ray" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rows_done"] == 60 and manifest["errors"] == 20
    assert manifest["parts"][0]["rows"][0] == 0 and manifest["parts"][-1]["rows"][1] == 60
    local_manifest = json.loads((tmp_path / "local" / "_manifest.json").read_text())
    assert manifest["schema"] == local_manifest["schema"] and manifest["options"] == local_manifest["options"]
