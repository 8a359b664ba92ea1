"""bf16 artifacts (export/bf16.py): `--precision bf16` writes the checkpoint's own weights, verified (bf16 matmuls)
against torch fp32, listed in the manifest, and `python -m serving --model DIR` serves them with the torch backend in
bf16; a changed weight file is refused; what bf16 cannot keep (a random-init preset, another task than the
checkpoint's) is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from test_artifact_integrity import TEXTS, make_checkpoint  # noqa: E402

from export.onnx import cli  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("bf16") / "ckpt", ["A", "B", "C"], seed=3)


@pytest.fixture(scope="module")
def artifact(checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bf16-art") / "art"
    assert cli(["--ckpt", str(checkpoint), "--precision", "bf16", "--out", str(out)]) == 0
    return out


def test_bf16_artifact_holds_the_checkpoints_weights(artifact, checkpoint):
    from safetensors import safe_open

    from bert.checkpoint import read_state_dict

    assert not (artifact / "model.onnx").exists()
    assert (artifact / "model.portable.onnx").is_file()  # for TensorRT, fp32 as for every precision
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["precision"] == "bf16" and manifest["runtime"] == "torch"
    assert manifest["files"]["weights"]["path"] == "model.safetensors"
    assert manifest["parity"]["verified"] is True and manifest["parity"]["model"]["precision"] == "bf16"
    source = read_state_dict(checkpoint)
    with safe_open(str(artifact / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(source)
        for key in f.keys():
            assert torch.equal(f.get_tensor(key), source[key])


def test_bf16_matmuls_only_in_the_encoder_layers(checkpoint):
    from bert.checkpoint import load_for_inference
    from bert.precision import bf16_matmuls

    model, _ = load_for_inference(checkpoint)
    fp32 = {n: p.dtype for n, p in model.named_parameters()}
    bf16_matmuls(model)
    for name, param in model.named_parameters():
        in_layers = ".encoder.layer." in f".{name}" and "LayerNorm" not in name
        assert param.dtype == (torch.bfloat16 if in_layers else fp32[name]), name
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)).outputs
    assert all(v.dtype == torch.float32 for v in out.values() if v.is_floating_point())  # heads stay fp32


def test_served_with_the_torch_backend_in_bf16_and_answers_as_fp32(artifact, checkpoint):
    from runtime.loading import load_model
    from serving.settings import Settings

    loaded = load_model(artifact, Settings())
    assert loaded.backend.name == "torch" and loaded.backend.precision == "bf16"
    reference = load_model(checkpoint, Settings()).backend  # the checkpoint itself: torch fp32
    assert reference.precision == "fp32"
    tokenizer = loaded.tokenizer
    encoded = tokenizer(TEXTS, max_length=32, truncation=True)
    width = max(len(row) for row in encoded["input_ids"])
    batch = {
        k: np.array([list(row) + [0] * (width - len(row)) for row in encoded[k]], dtype=np.int64)
        for k in ("input_ids", "attention_mask", "token_type_ids")
    }
    ours, theirs = loaded.backend.run(batch), reference.run(batch)
    key = next(k for k in theirs if k != "embedding")  # classify's scores, under the name every backend gives
    assert ours[key].dtype == np.float32
    assert np.abs(ours[key] - theirs[key]).max() < 0.05 * np.abs(theirs[key]).max() + 1e-3
    assert (ours[key].argmax(-1) == theirs[key].argmax(-1)).mean() >= 5 / 6
    # --precision on the command line still wins over the manifest's
    assert load_model(artifact, Settings(precision="fp32")).backend.precision == "fp32"


def test_a_changed_weight_file_is_refused(artifact, tmp_path):
    import shutil

    from runtime.loading import load_model
    from runtime.model_dir import ModelError
    from serving.settings import Settings

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="does not match its manifest"):
        load_model(copy, Settings())
    assert load_model(copy, Settings(allow_unverified=True)).backend.precision == "bf16"


def test_what_bf16_cannot_keep_is_one_line_and_exit_2(checkpoint, tmp_path, capsys):
    assert cli(["--ckpt", "tiny", "--random-init", "--precision", "bf16", "--out", str(tmp_path / "a")]) == 2
    assert "random-init" in capsys.readouterr().err
    assert cli(["--ckpt", str(checkpoint), "--task", "embed", "--precision", "bf16", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "serves classify, not --task embed" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_bf16_units_read_the_cpu_flags(monkeypatch, tmp_path):
    from bert.precision import bf16_units

    cpuinfo = tmp_path / "cpuinfo"
    real = Path.read_text

    def fake(path, *args, **kwargs):
        return real(cpuinfo, *args, **kwargs) if str(path) == "/proc/cpuinfo" else real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", fake)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    assert bf16_units() == []
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n")
    assert bf16_units() == ["amx_bf16"]


def test_the_evals_read_a_bf16_artifact_as_they_read_a_graph(artifact):
    """evals.int8_agreement and evals.batch_invariance open any export with export.bf16.session: for bf16 weights
    it lists inputs and outputs by name and runs them as onnxruntime's session does (it lacked both lists, and
    evals.batch_invariance failed on a bf16 artifact)."""
    from evals.batch_invariance import in_process  # noqa: F401 - what reads these lists
    from export import bf16

    session = bf16.session(artifact)
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    names = [o.name for o in session.get_outputs()]
    assert names == ["logits"]
    ids = np.array([[2, 7, 9, 3, 0]], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64), "token_type_ids": np.zeros_like(ids)}
    (logits,) = session.run(names, feed)
    assert logits.shape == (1, 3) and np.isfinite(logits).all()
