"""python -m batch --ray on a real local Ray cluster of two nodes (a head and a second `ray start --address` on
127.0.0.1, each stopped by its PID): the same rows, order, schema and manifest as the local job; and the worker
node killed (SIGKILL, its whole process tree) in the middle of a job, which still completes with every row once.
Skipped without ray (pip install 'bertserve[ray]': not in dev, a 240 MB install)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


def _local_then_ray(common: list, env: dict, tmp_path, address: str) -> None:
    """The job `common` locally into tmp_path/local, then on the cluster into tmp_path/ray, run from tmp_path (a
    directory without bertserve: the nodes find it only on the PYTHONPATH the job gives them); both must succeed."""
    local = subprocess.run([*common, "--output", str(tmp_path / "local")], env=env, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    started = time.monotonic()
    on_ray = subprocess.run(
        [*common, "--output", str(tmp_path / "ray"), "--ray", address],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    print(f"ray job: {time.monotonic() - started:.1f}s")
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a worker node, each `ray start --block` (it stops the processes it started when it is
    stopped): a model-holding actor per node and room for the read and write tasks. The head has 3 logical CPUs
    so that, once the worker node is killed, it holds both actors and still runs the read and write tasks."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    # RAY_AUTH_MODE=disabled: once a token is in ~/.ray/auth_token (any ray.init() of a new local cluster writes
    # one), `ray start` turns token authentication on, and a driver given an explicit address does not send it.
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ADDRESS", None)
    # The nodes start without bertserve on their PYTHONPATH, as on a cluster where it is not installed (the job
    # gives its own PYTHONPATH to the model-holding actors where the driver's directory, which Ray puts on the
    # workers' path, is not bertserve's).
    nodes_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    logs = tmp_path_factory.mktemp("ray")
    # A temp dir of its own (short: Ray's socket paths live under it): the machine's /tmp/ray/ray_current_cluster,
    # what `--ray auto` connects to, is left alone.
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    common = ["--block", "--disable-usage-stats"]
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
            "--num-cpus",
            "3",
            "--temp-dir",
            temp,
            *common,
        ],
        env=nodes_env,
        cwd=temp,
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
            [RAY, "start", "--address", address, "--node-ip-address", "127.0.0.1", "--num-cpus", "2", *common],
            env=nodes_env,
            cwd=temp,
            stdout=open(logs / "node.log", "w"),
            stderr=subprocess.STDOUT,
        )
        nodes.append(worker)
        while _alive_nodes(address, env) < 2:
            assert worker.poll() is None and time.monotonic() < deadline, (logs / "node.log").read_text()[-2000:]
            time.sleep(1)
        yield address, env, worker
    finally:
        for process in reversed(nodes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_ray_job_writes_what_the_local_job_writes(cluster, tmp_path):
    address, env, _ = cluster
    model = build_checkpoint(tmp_path / "multi")
    texts = ["I loved this film.", "Terrible.", "My name is Wolfgang and I live in Berlin.", "ok", None, ""]
    ids = list(range(60))
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "text": [texts[i % len(texts)] for i in ids]}), source, row_group_size=10)
    common = [sys.executable, "-m", "batch", "--task", "classify", "--model", str(model), "--input", str(source)]
    common += ["--keep", "id", "--part-rows", "20", "--window-rows", "8", "--workers", "2", "--threads", "1"]
    # From a directory without bertserve, which the nodes then find only on the PYTHONPATH the job gives the
    # model-holding actors (the killed-node test below runs from the checkout, whose directory Ray hands over).
    _local_then_ray(common, env, tmp_path, address)
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


def test_a_ray_job_gives_a_kept_column_the_local_jobs_one_type_in_every_part(cluster, tmp_path):
    """Ray Data types each JSONL block on its own: ids ints in one block, strings in another, both in a third (Ray's
    pickled Python objects), a column null in a whole block or float where ints meet nulls. The parts share the
    local job's types, so that the output reads as one table; files without a row are in the manifest, in no read."""
    address, env, _ = cluster
    model = build_checkpoint(tmp_path / "multi")
    data = tmp_path / "data"
    data.mkdir()
    text = "I loved this film."
    rows = [{"id": i, "n": None, "text": text} for i in range(10)]  # a.jsonl
    rows += [{"id": f"s{i}", "n": i, "text": text} for i in range(10, 20)]  # b.jsonl
    rows += [{"id": i if i % 2 else f"s{i}", "n": None if i % 3 else i, "text": text} for i in range(20, 30)]
    for name, part in (("a", rows[:10]), ("b", rows[10:20]), ("c", rows[20:])):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (data / "d-empty.jsonl").write_bytes(b"")
    (data / "e-blank.jsonl").write_bytes(b"\n\n")
    common = [sys.executable, "-m", "batch", "--task", "classify", "--model", str(model), "--input", str(data)]
    common += ["--keep", "id,n", "--part-rows", "5", "--window-rows", "5", "--workers", "2", "--threads", "1"]
    local = subprocess.run([*common, "--output", str(tmp_path / "local")], env=env, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    on_ray = subprocess.run(
        [*common, "--output", str(tmp_path / "ray"), "--ray", address], env=env, capture_output=True, text=True
    )
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    ours, theirs = pq.read_table(tmp_path / "ray"), pq.read_table(tmp_path / "local")  # every part: one schema
    assert ours.schema.field("id").type == theirs.schema.field("id").type == pa.string()
    assert ours.schema.field("n").type == theirs.schema.field("n").type == pa.int64()
    assert ours.select(["id", "n"]).to_pylist() == theirs.select(["id", "n"]).to_pylist()
    assert ours["id"].to_pylist() == [str(r["id"]) for r in rows] and ours["error"].null_count == 30
    manifest = json.loads((tmp_path / "ray" / "_manifest.json").read_text())
    local_manifest = json.loads((tmp_path / "local" / "_manifest.json").read_text())
    assert manifest["input"] == local_manifest["input"] and len(manifest["input"]["files"]) == 5
    assert manifest["rows_done"] == 30 and manifest["complete"]


def test_a_ray_job_reads_jsonl_values_as_the_local_job_reads_them(cluster, tmp_path):
    """A JSONL line's values are what the local job's parser gives (json.loads), not pandas' guesses (Ray Data's
    read_json): ids "007" stay text, texts that look numeric ("5") are answered, date-like names (created_at) stay
    text, an integer above 2**53 beside nulls keeps its digits, a text that is a number or null is its row's
    error, and a line that is not JSON is its row's error, not the read's. From a directory without bertserve:
    the read tasks, which parse the lines, find it on the job's PYTHONPATH as the model-holding actors do."""
    address, env, _ = cluster
    model = build_checkpoint(tmp_path / "multi")
    data = tmp_path / "data"
    data.mkdir()
    big = 2**53 + 1
    a = [  # texts that all look numeric: pandas makes the column numbers
        {"id": "007", "text": "5", "created_at": "2024-01-02T03:04:05Z", "big": big},
        {"id": "010", "text": "12", "created_at": "2024-02-03", "big": None},
        {"id": "011", "text": "3.5", "created_at": "2024-03-04 05:06:07", "big": big + 2},
    ]
    b = [
        {"id": "012", "text": "I loved this film.", "created_at": "2024-04-05", "big": None},
        {"id": "013", "text": None, "created_at": None, "big": 2**62 + 3},
        {"id": "014", "text": 7, "created_at": "1700000000", "big": None},
        {"id": "015", "text": "Terrible.", "created_at": "2024-06-07T08:09:10+02:00", "big": big},
    ]
    (data / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in a))
    lines = [json.dumps(r) for r in b]
    lines.insert(2, '{"id": "bad", "text": ')  # not JSON: that row's error
    lines.insert(1, "")  # a blank line: no row, but counted in the next lines' numbers
    (data / "b.jsonl").write_text("\n".join(lines) + "\n")
    common = [sys.executable, "-m", "batch", "--task", "classify", "--model", str(model), "--input", str(data)]
    common += ["--keep", "id,created_at,big,text", "--part-rows", "4", "--window-rows", "3"]
    common += ["--workers", "2", "--threads", "1"]
    _local_then_ray(common, env, tmp_path, address)
    ours, theirs = pq.read_table(tmp_path / "ray"), pq.read_table(tmp_path / "local")  # parts in input order
    assert ours.schema == theirs.schema and ours.num_rows == theirs.num_rows == 8
    for name in theirs.column_names:
        mine, local_values = ours[name].to_pylist(), theirs[name].to_pylist()
        if name == "score":
            assert [m is None for m in mine] == [t is None for t in local_values]
            assert all(abs(m - t) < 1e-5 for m, t in zip(mine, local_values) if t is not None)
        else:
            assert mine == local_values, name
    # What the local job gives, spelled out: Ray's own read_json gave 7 for "007", numbers for the texts, ...
    assert theirs["id"].to_pylist() == ["007", "010", "011", "012", "013", None, "014", "015"]
    assert theirs["big"].to_pylist() == [big, None, big + 2, None, 2**62 + 3, None, None, big]
    assert theirs["created_at"].to_pylist()[:2] == ["2024-01-02T03:04:05Z", "2024-02-03"]
    errors = theirs["error"].to_pylist()
    assert errors[:4] == [None] * 4 and errors[4] == "null" and errors[6] == "not a string (int)"
    assert errors[5].startswith("line 4 is not JSON") and errors[7] is None
    manifest = json.loads((tmp_path / "ray" / "_manifest.json").read_text())
    local_manifest = json.loads((tmp_path / "local" / "_manifest.json").read_text())
    assert manifest["rows_done"] == local_manifest["rows_done"] == 8
    assert manifest["errors"] == local_manifest["errors"] == 3


def test_the_jsonl_read_tasks_give_the_local_readers_values_wherever_the_bytes_are_cut(tmp_path):
    """No cluster: the tables a JSONL read task makes (batch/ray_job._jsonl_tables, the file's bytes in blocks of any
    size) hold the local reader's chunks (batch/inputs.read_rows): each text value itself (a number, an object,
    undecodable bytes), the row errors in the local job's words, the kept columns in their types, one schema."""
    from batch.inputs import ROW_ERROR, InputFile, conform, read_rows, survey
    from batch.ray_job import KEPT, _jsonl_tables, _jsonl_values

    data = (
        b'{"id": "007", "text": "5", "n": 9007199254740993}\n\r\n{"id": 7, "text": 7.0, "n": null}\n'
        b'{"id": "x", "text": \n[1, 2]\n{"id": "y", "text": "caf\xc3\xa9 \xff", "n": 1}\n'
        b'{"text": {"a": "\xc3\xa9"}, "n": 2}\n{"id": "010", "text": null}'
    )
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    file = InputFile(path, "jsonl", len(data))
    keep = ["id", "n", "text"]
    kept = pa.schema(list(survey([file], keep, 3).kept.items()))
    local = list(read_rows([file], ["text"], keep, 3))
    assert [len(c) for c in local] == [3, 3, 1] and "line 4 is not JSON" in local[0].values[ROW_ERROR][2]
    for size in (1, 2, 7, 64, len(data)):
        tables = list(_jsonl_tables((data[i : i + size] for i in range(0, len(data), size)), ["text"], kept, 3))
        assert len({t.schema for t in tables}) == 1 and [t.num_rows for t in tables] == [3, 3, 1]
        for table, chunk in zip(tables, local):
            assert _jsonl_values(table, "text") == chunk.values["text"]
            assert table[ROW_ERROR].to_pylist() == (chunk.values.get(ROW_ERROR) or [None] * len(chunk))
            for field in kept:
                column = table[KEPT + field.name if field.name == "text" else field.name]
                assert column.type == field.type
                assert column.to_pylist() == conform(chunk.keep[field.name], field.type).to_pylist()


def test_the_installed_rays_file_reading_has_the_hooks_the_jsonl_reader_extends():
    import ray
    from ray.data.datasource import DefaultFileMetadataProvider, FileBasedDatasource

    from batch.ray_job import check_reader_api

    check_reader_api(FileBasedDatasource, DefaultFileMetadataProvider, ray.__version__)


def test_a_ray_job_over_inputs_all_empty_writes_the_local_jobs_manifest_of_no_parts(tmp_path, capsys):
    """No row to read: the manifest of no parts the local job writes, and no cluster asked (the address is
    never dialled)."""
    from batch.__main__ import main

    model = build_checkpoint(tmp_path / "multi")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(b"")
    (data / "b.jsonl").write_bytes(b"\n \n")
    (data / "c.csv").write_bytes(b"")
    argv = ["--task", "classify", "--model", str(model), "--input", str(data), "--keep", "id"]
    assert main([*argv, "--output", str(tmp_path / "local")]) == 0
    assert main([*argv, "--output", str(tmp_path / "ray"), "--ray", f"127.0.0.1:{free_port()}"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("done on Ray: 0 rows in 0 parts, 0 errors"), lines
    ours, theirs = (json.loads((tmp_path / d / "_manifest.json").read_text()) for d in ("ray", "local"))
    assert ours["complete"] and ours["parts"] == theirs["parts"] == [] and ours["input"] == theirs["input"]


def _kill_tree(pid: int) -> None:
    from bench.cpu import process_tree

    for member in process_tree(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the node's processes in /proc")
def test_a_ray_job_completes_when_a_worker_node_is_killed(cluster, tmp_path):
    """Runs last: it kills the module's worker node. Ray Data restarts the lost actor and re-runs the lost tasks
    on the head; the staged part files are named by write task, so a re-run write replaces its own file."""
    address, env, worker = cluster
    model = build_checkpoint(tmp_path / "multi")
    texts = ["I loved this film.", "Terrible.", "My name is Wolfgang and I live in Berlin.", "ok", None]
    rows = 1500
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": range(rows), "text": [texts[i % len(texts)] for i in range(rows)]}), source, row_group_size=50
    )
    common = [sys.executable, "-m", "batch", "--task", "classify", "--model", str(model), "--input", str(source)]
    common += ["--keep", "id", "--part-rows", "50", "--window-rows", "5", "--workers", "2", "--threads", "1"]
    output = tmp_path / "ray"
    job = subprocess.Popen(
        [*common, "--output", str(output), "--ray", address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        staged = output / ".ray-parts"
        deadline = time.monotonic() + 300
        while len(list(staged.glob("*.parquet"))) < 2:  # the job is under way on both nodes
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.1)
        _kill_tree(worker.pid)
        assert job.poll() is None, "the job ended before the node was killed: give it more rows"
        written = len(list(staged.glob("*.parquet")))
        _, stderr = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, stderr[-3000:]
    assert written < rows // 50  # the kill came before the last part
    result = pq.read_table(output)
    assert result["id"].to_pylist() == list(range(rows))  # every row exactly once, in input order
    local = subprocess.run([*common, "--output", str(tmp_path / "local")], env=env, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    assert result["label"].to_pylist() == pq.read_table(tmp_path / "local")["label"].to_pylist()
    assert result["error"].null_count == rows - rows // len(texts)
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rows_done"] == rows and manifest["errors"] == rows // len(texts)
