"""export.triton: the generated config.pbtxt parses with Triton's own protobuf schema and matches the graph."""

from __future__ import annotations

import json

import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("torch")
model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="pip install 'tritonclient[grpc]' for Triton's config schema"
)
from google.protobuf import text_format  # noqa: E402

from export.triton import cli, config_pbtxt  # noqa: E402

ONNX_TO_TRITON = {"tensor(int64)": "TYPE_INT64", "tensor(float)": "TYPE_FP32"}


def parse(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, minilm_dir):
    from export.onnx import cli as export_cli

    out = tmp_path_factory.mktemp("tiny-classify-int8")
    assert (
        export_cli(
            [
                "--ckpt",
                "tiny",
                "--random-init",
                "--precision",
                "int8",
                "--out",
                str(out),
                "--max-seq",
                "64",
                "--max-batch",
                "16",
            ]
        )
        == 0
    )
    return out


def test_onnxruntime_repository_parses_and_matches_graph(artifact, tmp_path):
    assert cli(["--artifact", str(artifact), "--repo", str(tmp_path), "--name", "sst2"]) == 0
    model_dir = tmp_path / "sst2"
    assert (model_dir / "1" / "model.onnx").is_file()
    assert (model_dir / "labels.txt").read_text() == "LABEL_0\nLABEL_1\n"
    config = parse((model_dir / "config.pbtxt").read_text())
    assert config.name == "sst2" and config.backend == "onnxruntime"
    assert config.max_batch_size == 16
    assert config.HasField("dynamic_batching")
    sess = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    graph_inputs = {i.name: i for i in sess.get_inputs()}
    assert [i.name for i in config.input] == list(graph_inputs)
    for spec in config.input:
        assert model_config_pb2.DataType.Name(spec.data_type) == ONNX_TO_TRITON[graph_inputs[spec.name].type]
        assert list(spec.dims) == [-1]
    graph_outputs = {o.name: o for o in sess.get_outputs()}
    assert [o.name for o in config.output] == list(graph_outputs) == ["logits"]
    logits = config.output[0]
    assert model_config_pb2.DataType.Name(logits.data_type) == "TYPE_FP32"
    assert list(logits.dims) == [2] and logits.label_filename == "labels.txt"
    assert (model_dir / "vocab.txt").is_file() and (model_dir / "manifest.json").is_file()


def test_tensorrt_backend_needs_a_plan(artifact, tmp_path):
    assert cli(["--artifact", str(artifact), "--repo", str(tmp_path), "--backend", "tensorrt"]) == 2


def test_tensorrt_repository_parses(artifact, tmp_path):
    fake = tmp_path / "artifact"
    fake.mkdir()
    for f in artifact.iterdir():
        (fake / f.name).write_bytes(f.read_bytes())
    (fake / "model.plan").write_bytes(b"not a real engine")
    manifest = json.loads((fake / "manifest.json").read_text())
    manifest["tensorrt"] = {"profile": {"min": [1, 1], "opt": [4, 32], "max": [8, 64]}}
    (fake / "manifest.json").write_text(json.dumps(manifest))
    assert (
        cli(["--artifact", str(fake), "--repo", str(tmp_path / "repo"), "--backend", "tensorrt", "--max-batch", "16"])
        == 2
    )  # over the engine's profile
    assert cli(["--artifact", str(fake), "--repo", str(tmp_path / "repo"), "--backend", "tensorrt"]) == 0
    config = parse((tmp_path / "repo" / "artifact" / "config.pbtxt").read_text())
    assert config.backend == "tensorrt" and config.max_batch_size == 8
    assert (tmp_path / "repo" / "artifact" / "1" / "model.plan").is_file()


def test_every_task_layout_parses():
    seq = ["batch", "sequence"]
    inputs = [{"name": n, "dtype": "int64", "shape": seq} for n in ("input_ids", "attention_mask", "token_type_ids")]
    cases = {
        "qa": [
            {"name": "start_logits", "dtype": "float32", "shape": seq},
            {"name": "end_logits", "dtype": "float32", "shape": seq},
        ],
        "encoder": [
            {"name": "last_hidden_state", "dtype": "float32", "shape": seq + [128]},
            {"name": "pooler_output", "dtype": "float32", "shape": ["batch", 128]},
        ],
        "multi": [
            {"name": "classify_logits", "dtype": "float32", "shape": ["batch", 2]},
            {"name": "ner_logits", "dtype": "float32", "shape": seq + [3]},
        ],
    }
    labels = {"qa": None, "encoder": None, "multi": {"classify": ["neg", "pos"], "ner": ["O", "B", "I"], "qa": []}}
    for task, outputs in cases.items():
        manifest = {"task": task, "labels": labels[task], "inputs": inputs, "outputs": outputs}
        config = parse(config_pbtxt(manifest, task, "onnxruntime", 8, 500))
        assert [o.name for o in config.output] == [o["name"] for o in outputs]
        dims = {o.name: list(o.dims) for o in config.output}
        if task == "multi":
            assert dims == {"classify_logits": [2], "ner_logits": [-1, 3]}
            assert [o.label_filename for o in config.output] == ["labels.txt", "ner_labels.txt"]
        if task == "qa":
            assert dims == {"start_logits": [-1], "end_logits": [-1]}
