"""The GPU benchmark (bench/gpu) can't rot: its one command runs here on CPU with tiny sizes.

The dry run is the GPU command (`python -m bench.gpu.kit`) with --dry-run: the same steps, files and
JSON, on a bundle that `python -m bench.gpu.prepare --tiny` makes from shared/data. The GPU run itself
needs a CUDA machine (bench/gpu/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
PART = "demo_model.tar.part-"
pytestmark = pytest.mark.slow  # the dry run: about a minute on 2 cores (45 s of CPU)


def run(*args, timeout=300):
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def tiny_kit(tmp_path_factory, data_dir):
    kit = tmp_path_factory.mktemp("gpu-kit") / "kit"
    run("-m", "bench.gpu.prepare", "--tiny", "--no-wheels", "--out", str(kit), "--data", str(data_dir))
    return kit


@pytest.fixture(scope="module")
def dry_run(tiny_kit, tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-kit-run")
    out, work = base / "out", base / "work"
    result = run(
        "-m",
        "bench.gpu.kit",
        "--dry-run",
        "--phase",
        "1",
        "--kit",
        str(tiny_kit),
        "--out",
        str(out),
        "--work",
        str(work),
        "--budget-s",
        "900",
        timeout=600,
    )
    return SimpleNamespace(
        out=out, work=work, kit=tiny_kit, stdout=result.stdout, results=json.loads((out / "results.json").read_text())
    )


def test_prepare_writes_the_bundle(tiny_kit):
    manifest = json.loads((tiny_kit / "manifest.json").read_text())
    assert set(manifest["files"]) == {"data.tar.xz", "squad_windows.json"}
    with tarfile.open(tiny_kit / "data.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"SST-2/train.tsv", "SST-2/dev.tsv", "conll2003/train.txt", "conll2003/valid.txt"} <= names
    assert any(n.startswith("squad-train/train-v1.1.part-") for n in names)
    windows = json.loads((tiny_kit / "squad_windows.json").read_text())
    assert windows["max_length"] == 384 and windows["windows"]
    assert all(2 < q < n <= 384 for q, n in windows["windows"])  # [CLS] question [SEP] context [SEP]
    assert manifest["kit_mib"] > 0


def test_wheels_are_the_serving_stack_the_gpu_image_lacks():
    from bench.gpu.prepare import GPU_IMAGE, closure, serve_requirements

    versions = closure(serve_requirements())
    bundled = {n for n in versions if n not in GPU_IMAGE}
    assert {"fastapi", "pydantic", "pydantic-core", "pydantic-settings", "uvicorn", "starlette"} <= bundled
    assert not {"torch", "numpy", "tokenizers", "onnxruntime", "prometheus-client"} & bundled


def test_target_packages_read_from_the_gpu_machines_freeze(tmp_path):
    from bench.gpu.prepare import GPU_IMAGE, target_packages

    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# pip list --format=freeze\nFastAPI==0.115.0\npydantic_core==2.27.1\ntorch @ file:///w/t.whl\n")
    assert target_packages(str(freeze)) == {"fastapi", "pydantic-core", "torch"}
    assert target_packages(None) is GPU_IMAGE


def test_dry_run_runs_every_step(dry_run):
    steps = dry_run.results["steps"]
    assert set(steps) == {"tests", "demo", "model", "server"}
    assert {name: r["status"] for name, r in steps.items()} == dict.fromkeys(steps, "ok"), dry_run.stdout[-3000:]
    assert "summary:" in dry_run.stdout  # the table a run's output ends with


def test_dry_run_writes_a_flat_folder_of_the_promised_names(dry_run):
    files = sorted(p for p in dry_run.out.rglob("*") if p.is_file())
    names = [p.name for p in files]
    assert all(p.parent == dry_run.out for p in files)
    assert {"results.json", "log.txt", "profile.txt"} <= set(names)
    assert all(n in ("results.json", "log.txt", "profile.txt") or n.startswith(PART) for n in names)
    assert all(p.stat().st_size <= 3 * 2**20 for p in files if p.name.startswith(PART))  # the dry run's --part-mib
    log = (dry_run.out / "log.txt").read_text()
    assert "step demo: ok" in log and "---- demo.log ----" in log  # the recipe's own output is in the log


def test_demo_parts_reassemble_into_a_servable_model(dry_run, tmp_path):
    from runtime.model_dir import read_model_spec

    demo = dry_run.results["steps"]["demo"]
    parts = sorted(dry_run.out.glob(PART + "*"))
    assert [p.name for p in parts] == [p["file"] for p in demo["package"]["parts"]] and len(parts) >= 2
    blob = b"".join(p.read_bytes() for p in parts)
    import hashlib

    assert hashlib.sha256(blob).hexdigest() == demo["package"]["sha256"]
    (tmp_path / "demo.tar").write_bytes(blob)
    with tarfile.open(tmp_path / "demo.tar") as tar:
        tar.extractall(tmp_path, filter="data")
    spec = read_model_spec(tmp_path / "demo_model")
    assert spec.headed_tasks == ["classify", "ner", "qa"] and spec.tasks[-1] == "embed"
    assert (tmp_path / "demo_run" / "metrics.json").is_file()
    scores = demo["scores"]
    assert set(scores["bar"]) == {"sst2_dev_accuracy", "conll_valid_f1", "squad_heldout_f1"}
    assert demo["backbone"]["what"].startswith("random tiny")


def test_dry_run_model_level_compares_both_sides_on_every_workload(dry_run):
    model = dry_run.results["steps"]["model"]
    seen = {(r["model"], r["workload"], r["variant"]) for r in model["rows"]}
    for workload in ("64x1", "64x4", "squad-windows/max_length", "squad-windows/longest"):
        assert {("large", workload, "transformers-sdpa"), ("large", workload, "bertserve")} <= seen
    assert {("base", "32x1", "bertserve"), ("base", "32x4", "transformers-sdpa")} <= seen
    assert {
        ("large", "squad-windows/max_length", "bertserve-padded"),  # the pieces, one by one
        ("large", "64x4", "bertserve-packed-no-graphs"),
    } <= seen
    assert ("large", "64x4", "bertserve-int8") in seen  # --precision int8: its speed and its agreement
    fp32 = [a for a in model["agreement"] if a.get("variant") != "bertserve-int8"]
    assert all(a["argmax_agree"] == 1.0 and a["max_abs_diff"] < 1e-3 for a in fp32)
    (int8,) = [a for a in model["agreement"] if a.get("variant") == "bertserve-int8"]
    assert int8["argmax_agree"] >= 0.9 and 1e-6 < int8["max_abs_diff"] < 0.5, int8
    assert model["backends"]["large"]["fast_path"]["packed"] is True
    assert "real_vs_max_length" in model["summary"]["bar"]


def test_dry_run_server_level_measures_both_servers(dry_run):
    rows = dry_run.results["steps"]["server"]["rows"]
    assert {(r["server"], r["clients"]) for r in rows} == {
        ("bertserve", 1),
        ("bertserve", 2),
        ("baseline", 1),
        ("baseline", 2),
    }
    assert all(r["errors"] == 0 for r in rows), rows
    assert all(r["ok"] > 0 for r in rows if r["server"] == "bertserve"), rows  # the baseline may be too slow


def test_phase_2_continues_where_phase_1_stopped(dry_run, tmp_path):
    """The work folder of an earlier run on the same machine says what is done: nothing is run again, the
    results are kept."""
    out = tmp_path / "out2"
    result = run(
        "-m",
        "bench.gpu.kit",
        "--dry-run",
        "--phase",
        "2",
        "--kit",
        str(dry_run.kit),
        "--out",
        str(out),
        "--work",
        str(dry_run.work),
        "--budget-s",
        "900",
    )
    results = json.loads((out / "results.json").read_text())
    assert results["planned"] == []
    assert {r.get("kept_from") for r in results["steps"].values()} == {"previous run"}
    assert "step model: $" not in result.stdout


def test_plan_reruns_only_what_did_not_finish(tmp_path):
    from bench.gpu.kit import Kit

    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "previous.json").write_text(
        json.dumps(
            {
                "steps": {
                    "tests": {"status": "failed"},
                    "demo": {"status": "interrupted"},
                    "model": {"status": "deferred"},
                    "server": {"status": "ok"},
                }
            }
        )
    )
    args = SimpleNamespace(
        phase="2",
        steps=None,
        budget_s=100,
        out=str(tmp_path / "o"),
        work=str(tmp_path / "w"),
        kit=str(kit),
        previous=None,
        dry_run=True,
    )
    assert Kit(args).plan() == ["demo", "model"]
    args.steps = "server,tests"
    assert Kit(args).plan() == ["tests", "server"]
    args.steps, args.phase = None, "1"
    assert Kit(args).plan() == ["tests", "demo", "model", "server"]


def test_a_step_that_cannot_fit_the_budget_is_deferred(tiny_kit, tmp_path):
    out = tmp_path / "out"
    run(
        "-m",
        "bench.gpu.kit",
        "--dry-run",
        "--steps",
        "model",
        "--kit",
        str(tiny_kit),
        "--out",
        str(out),
        "--work",
        str(tmp_path / "work"),
        "--budget-s",
        "1",
    )
    results = json.loads((out / "results.json").read_text())
    assert results["steps"]["model"]["status"] == "deferred"


def test_without_minilm_the_demo_step_starts_from_the_demo_encoder_with_fresh_heads(tmp_path):
    """What the GPU machine gets (no all-MiniLM-L6-v2 there): the checkout's demo encoder, heads re-initialised."""
    from bench.gpu.demo_step import find_backbone
    from bert.checkpoint import load_checkpoint
    from bert.model import BertForMultiTask

    path, what = find_backbone(tmp_path / "kit", tmp_path / "work", "demo-encoder")
    assert "encoder of the CPU-trained demo model" in what
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and not config.get("task_labels")
    _, report = load_checkpoint(
        path,
        model_cls=BertForMultiTask,
        from_backbone=True,
        config_overrides={"task_labels": {"classify": ["a", "b"], "ner": ["O"], "qa": []}},
    )
    assert {"classifier.weight", "token_classifier.weight", "qa_outputs.weight"} <= set(report.initialised)
