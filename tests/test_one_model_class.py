"""Serving and export run every checkpoint as one class, BertForMultiTask, with the checkpoint's own heads.

transformers-made checkpoints (tiny, random, save_pretrained) load into it: a masked LM's head at "cls" with
its decoder tied to the word embeddings, scored as top-K probabilities equal to transformers' softmax.topk; a
one-output sequence classifier's one head serves classify and rerank, from the torch backend and from an
exported ONNX graph alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


DEMO = Path(__file__).resolve().parents[1] / "serving" / "demo_model"


def hf_config(**overrides):
    return transformers.BertConfig(
        **{
            **dict(
                vocab_size=99,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=37,
                max_position_embeddings=64,
                initializer_range=0.2,
            ),
            **overrides,
        }
    )


def save_hf(model_cls, directory: Path, **overrides) -> Path:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_cls(hf_config(**overrides)).eval()
    model.save_pretrained(directory)
    return directory


def batch(vocab=99, lengths=(9, 4, 7), seed=0):
    rng = np.random.default_rng(seed)
    width = max(lengths)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    ids = rng.integers(5, vocab, size=(len(lengths), width)) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def settings(**extra):
    return SimpleNamespace(
        device="cpu",
        effective_precision="fp32",
        threads=None,
        effective_inference_workers=1,
        torch_packed=None,
        torch_cuda_graphs=None,
        torch_gelu_epilogue=None,
        **extra,
    )


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForPreTraining"])
def test_masked_lm_checkpoint_serves_transformers_top_k(tmp_path, architecture):
    from bert.checkpoint import load_for_inference
    from bert.heads import MLM_TOP_K

    directory = save_hf(getattr(transformers, architecture), tmp_path / "mlm")
    hf = getattr(transformers, architecture).from_pretrained(directory).eval()
    model, report = load_for_inference(directory)
    assert model.attributes == {"fill_mask": "cls", "sparse": "cls"}  # one head, read by both tasks
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # tied
    # what a pretraining checkpoint has beyond the masked-LM head is dropped, nothing else
    assert all(k.startswith(("cls.seq_relationship", "bert.pooler")) for k in report.dropped)
    assert bool(report.dropped) == (architecture == "BertForPreTraining")
    inputs = {k: torch.from_numpy(v) for k, v in batch().items()}
    with torch.no_grad():
        logits = hf(**inputs).logits if architecture == "BertForMaskedLM" else hf(**inputs).prediction_logits
        want = logits.softmax(dim=-1).topk(MLM_TOP_K, dim=-1)
        got = model(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]).outputs
    assert got["fill_mask_scores"].shape == (3, 9, MLM_TOP_K) and got["fill_mask_ids"].dtype == torch.int64
    assert torch.allclose(got["fill_mask_scores"], want.values, atol=1e-5, rtol=0)
    assert torch.equal(got["fill_mask_ids"], want.indices)


def test_masked_lm_through_the_torch_backend_padded_and_packed(tmp_path):
    from runtime.backends import torch_backend
    from runtime.model_dir import read_model_spec

    directory = save_hf(transformers.BertForMaskedLM, tmp_path / "mlm")
    spec = read_model_spec(directory)
    assert spec.headed_tasks == ["fill_mask", "sparse"]
    padded = torch_backend.TorchBackend(spec, settings())
    packed = torch_backend.TorchBackend(spec, settings(), packed=True)
    assert packed.fast_path["packed"], packed.fast_path["notes"]
    inputs = batch()
    got, want = packed.run(inputs), padded.run(inputs)
    assert {"fill_mask_scores", "fill_mask_ids", "sparse", "embed"} <= set(want)
    assert want["fill_mask_ids"].dtype == np.int64 and want["fill_mask_scores"].dtype == np.float32
    problem = torch_backend.mismatch(got, want, 1e-5, 0, where=inputs["attention_mask"] != 0)
    assert not problem, problem


def test_one_output_classifier_serves_classify_and_rerank_from_one_head(tmp_path):
    from bert.checkpoint import load_for_inference
    from runtime.backends import torch_backend
    from runtime.model_dir import read_model_spec

    directory = save_hf(transformers.BertForSequenceClassification, tmp_path / "cross", num_labels=1)
    hf = transformers.BertForSequenceClassification.from_pretrained(directory).eval()
    model, report = load_for_inference(directory)
    assert model.attributes == {"classify": "classifier", "rerank": "classifier"} and not report
    spec = read_model_spec(directory)
    assert spec.headed_tasks == ["classify", "rerank"]
    inputs = batch()
    out = torch_backend.TorchBackend(spec, settings()).run(inputs)
    with torch.no_grad():
        want = hf(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    assert out["classify"].shape == (3, 1)
    np.testing.assert_array_equal(out["classify"], out["rerank"])
    np.testing.assert_allclose(out["rerank"], want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_exported_one_output_classifier_serves_classify_and_rerank(tmp_path):
    """The graph of a checkpoint made for one task names its output as transformers does ("logits"); a server
    reads from the checkpoint's architecture that it feeds both tasks."""
    import json

    from export.onnx import cli
    from runtime.backends.onnx_backend import OnnxBackend
    from runtime.backends.torch_backend import TorchBackend
    from runtime.model_dir import read_model_spec

    directory = save_hf(transformers.BertForSequenceClassification, tmp_path / "cross", num_labels=1, vocab_size=30522)
    shutil.copy(DEMO / "vocab.txt", directory / "vocab.txt")
    out = tmp_path / "artifact"
    assert cli(["--ckpt", str(directory), "--out", str(out), "--max-seq", "64"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [o["name"] for o in manifest["outputs"]] == ["logits"] and manifest["outputs"][0]["shape"] == ["batch", 1]
    assert manifest["tasks"] == ["classify", "rerank"] and manifest["parity"]["verified"]
    spec = read_model_spec(out)
    assert spec.headed_tasks == ["classify", "rerank"]
    inputs = batch(vocab=30522)
    served = OnnxBackend(spec, SimpleNamespace(device="cpu", threads=1, effective_inference_workers=1)).run(inputs)
    np.testing.assert_array_equal(served["classify"], served["rerank"])
    reference = TorchBackend(read_model_spec(directory), settings()).run(inputs)
    np.testing.assert_allclose(served["rerank"], reference["rerank"], atol=1e-4, rtol=0)
