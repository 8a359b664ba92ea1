"""export.tensorrt: engine build, profile, timing cache, parity with onnxruntime, TrtEngine runtime.

The engine tests run where `tensorrt` imports and a CUDA device is present (marker `tensorrt`);
elsewhere they skip with the reason. The no-TensorRT message and the fp16 ONNX that TensorRT is
fed are checked everywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[1]


def tensorrt_available() -> tuple[bool, str]:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False, "tensorrt is not installed (pip install bertserve[gpu], or the NVIDIA TensorRT container)"
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "tensorrt imports but no CUDA device is visible"
    except ImportError:
        pass
    return True, ""


HAS_TRT, NO_TRT_REASON = tensorrt_available()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, minilm_dir):
    from export.onnx import cli

    out = tmp_path_factory.mktemp("tiny-for-trt")
    assert (
        cli(
            [
                "--ckpt",
                "tiny",
                "--random-init",
                "--out",
                str(out),
                "--max-seq",
                "64",
                "--max-batch",
                "8",
                "--opt-seq",
                "32",
                "--opt-batch",
                "4",
            ]
        )
        == 0
    )
    return out


def test_without_tensorrt_one_line_exit_2(artifact):
    if HAS_TRT:
        pytest.skip("tensorrt is installed here")
    result = subprocess.run(
        [sys.executable, "-m", "export.tensorrt", "--artifact", str(artifact)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "pip install bertserve[gpu]" in lines[0] and "container" in lines[0]


def test_fused_graph_is_refused_before_anything_else(artifact):
    from export.tensorrt import cli

    assert cli(["--onnx", str(artifact / "model.onnx")]) == 2  # com.microsoft ops: TensorRT cannot parse them
    assert cli(["--artifact", str(artifact), "--max-batch", "2", "--opt-batch", "4"]) == 2  # opt > max


def test_fp16_graph_for_tensorrt_keeps_io_and_runs(artifact, tmp_path):
    """The graph TensorRT builds from: fp16 inside, int64 in, fp32 out, fp32 LayerNorm/Softmax."""
    import onnx

    from export.tensorrt import fp16_onnx

    path = fp16_onnx(artifact / "model.portable.onnx", tmp_path / "fp16.onnx")
    model = onnx.load(str(path))
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {onnx.TensorProto.INT64}
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {onnx.TensorProto.FLOAT}
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node), "portable graph must use standard ops only"
    feeds = {
        "input_ids": np.array([[101, 2023, 2003, 102, 0]]),
        "attention_mask": np.array([[1, 1, 1, 1, 0]]),
        "token_type_ids": np.zeros((1, 5), np.int64),
    }
    ref = ort.InferenceSession(str(artifact / "model.portable.onnx"), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    try:
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"onnxruntime CPU cannot run this fp16 graph: {e}")
    assert np.abs(got[0] - ref[0]).max() < 1e-2


def test_profile_shapes_from_manifest(artifact):
    from export.manifest import read_manifest
    from export.tensorrt import profile_shapes

    assert profile_shapes(read_manifest(artifact)) == ((1, 1), (4, 32), (8, 64))


@pytest.fixture(scope="module")
def engine_artifact(artifact):
    if not HAS_TRT:
        pytest.skip(NO_TRT_REASON)
    from export.tensorrt import cli

    assert cli(["--artifact", str(artifact), "--workspace-gb", "1"]) == 0
    return artifact


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRT, reason=NO_TRT_REASON)
def test_engine_built_verified_and_recorded(engine_artifact):
    manifest = json.loads((engine_artifact / "manifest.json").read_text())
    assert (engine_artifact / "model.plan").stat().st_size > 0
    assert (engine_artifact / "timing.cache").stat().st_size > 0
    assert manifest["files"]["plan"]["path"] == "model.plan"
    assert manifest["tensorrt"]["parity"]["passed"] is True
    assert manifest["tensorrt"]["profile"] == {"min": [1, 1], "opt": [4, 32], "max": [8, 64]}


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRT, reason=NO_TRT_REASON)
def test_runtime_matches_onnxruntime_and_checks_shapes(engine_artifact):
    from bert.tensorrt_runtime import TrtEngine

    engine = TrtEngine(engine_artifact / "model.plan")
    assert engine.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert engine.output_names == ["logits"]
    assert (engine.max_batch, engine.max_seq) == (8, 64)
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(1000, 2000, (3, 17)),
        "attention_mask": np.ones((3, 17), np.int64),
        "token_type_ids": np.zeros((3, 17), np.int64),
    }
    feeds["attention_mask"][2, 9:] = 0
    ref = ort.InferenceSession(str(engine_artifact / "model.portable.onnx"), providers=["CPUExecutionProvider"]).run(
        ["logits"], feeds
    )[0]
    got = engine.run(feeds)["logits"]
    assert got.shape == (3, 2)
    assert np.abs(got - ref).max() < 2e-2
    with pytest.raises(ValueError, match="built for"):
        engine.run({k: np.ones((9, 8), np.int64) for k in engine.input_names})


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRT, reason=NO_TRT_REASON)
def test_rebuild_reuses_timing_cache(engine_artifact, tmp_path):
    from export.tensorrt import cli

    assert (
        cli(
            [
                "--artifact",
                str(engine_artifact),
                "--out",
                str(tmp_path / "again.plan"),
                "--timing-cache",
                str(engine_artifact / "timing.cache"),
                "--no-verify",
            ]
        )
        == 0
    )
    assert (tmp_path / "again.plan").stat().st_size > 0
    # The docker entrypoint's form: --onnx FILE, --out an existing directory.
    (tmp_path / "dir").mkdir()
    assert (
        cli(
            [
                "--onnx",
                str(engine_artifact / "model.portable.onnx"),
                "--out",
                str(tmp_path / "dir"),
                "--timing-cache",
                str(engine_artifact / "timing.cache"),
            ]
        )
        == 0
    )
    assert (tmp_path / "dir" / "model.plan").stat().st_size > 0
