"""Checkpoint directories: real safetensors files both ways with transformers, shards, clear errors,
and real-weight parity on all-MiniLM-L6-v2."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bert.checkpoint import CheckpointError, load_checkpoint, read_state_dict, resolve_checkpoint, save_checkpoint
from bert.config import BertConfig
from bert.model import BertForSequenceClassification, BertModel

transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


def outputs(model, name):
    """The comparable tensors of one head class, ours or transformers'."""
    ids, mask, types = inputs()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, token_type_ids=types)
    if name == "BertModel":
        return [out.last_hidden_state * mask[..., None], out.pooler_output]
    if name == "BertForPreTraining":
        return [
            getattr(out, "mlm_logits", None) if hasattr(out, "mlm_logits") else out.prediction_logits,
            getattr(out, "nsp_logits", None) if hasattr(out, "nsp_logits") else out.seq_relationship_logits,
        ]
    if name == "BertForMaskedLM":
        return [out.mlm_logits if hasattr(out, "mlm_logits") else out.logits]
    if name == "BertForQuestionAnswering":
        return [out.start_logits, out.end_logits]
    return [out.logits]


@pytest.mark.parametrize(
    "name",
    [
        "BertModel",
        "BertForPreTraining",
        "BertForMaskedLM",
        "BertForSequenceClassification",
        "BertForTokenClassification",
        "BertForQuestionAnswering",
    ],
)
def test_transformers_to_ours_to_transformers(tmp_path, name):
    hf_cls = getattr(transformers, name)
    torch.manual_seed(0)
    num_labels = 2 if name == "BertForQuestionAnswering" else 3  # transformers sizes qa_outputs by num_labels
    hf = hf_cls(transformers.BertConfig(**TINY, num_labels=num_labels)).eval()
    hf.save_pretrained(tmp_path / "hf")

    ours, report = load_checkpoint(tmp_path / "hf")
    assert type(ours).__name__ == name and not report
    for a, b in zip(outputs(ours, name), outputs(hf, name)):
        assert torch.allclose(a, b, atol=1e-5), name

    save_checkpoint(ours, tmp_path / "ours")
    back = hf_cls.from_pretrained(tmp_path / "ours").eval()
    for a, b in zip(outputs(back, name), outputs(hf, name)):
        assert torch.allclose(a, b, atol=1e-5), name


def test_sharded_save_round_trip_and_shard_size(tmp_path):
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**TINY, id2label={0: "n", 1: "p"})).eval()
    save_checkpoint(model, tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and not (tmp_path / "model.safetensors").exists()
    for shard in shards:  # one tensor larger than the limit gets a shard of its own
        tensors = load_file(tmp_path / shard)
        assert len(tensors) == 1 or sum(t.numel() * t.element_size() for t in tensors.values()) <= 20_000
    again, _ = load_checkpoint(tmp_path)
    assert torch.equal(again(*inputs()).logits, model(*inputs()).logits)
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert torch.allclose(
        hf(*inputs()[:1], attention_mask=inputs()[1], token_type_ids=inputs()[2]).logits,
        model(*inputs()).logits,
        atol=1e-5,
    )
    save_checkpoint(model, tmp_path)  # a later unsharded save replaces the shards
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]


def test_fp16_storage_loads_into_fp32(tmp_path):
    model = BertModel(BertConfig(**TINY))
    save_checkpoint(model, tmp_path, dtype=torch.float16)
    assert read_state_dict(tmp_path)["embeddings.word_embeddings.weight"].dtype == torch.float16
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float16"
    again, _ = load_checkpoint(tmp_path)
    assert again.dtype == torch.float32


def test_missing_unexpected_and_misshaped_keys_are_named(tmp_path):
    model = BertModel(BertConfig(**TINY))
    save_checkpoint(model, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("encoder.layer.1.output.dense.bias")
    state["encoder.layer.7.extra.weight"] = torch.zeros(2)
    state["pooler.dense.weight"] = torch.zeros(5, 5)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    message = str(e.value)
    assert "encoder.layer.1.output.dense.bias" in message
    assert "encoder.layer.7.extra.weight" in message
    assert "pooler.dense.weight (file (5, 5), model (32, 32))" in message


def test_harmless_legacy_keys_are_tolerated(tmp_path):
    model = BertModel(BertConfig(**TINY))
    save_checkpoint(model, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["embeddings.position_ids"] = torch.arange(64)[None]
    state["embeddings.LayerNorm.gamma"] = state.pop("embeddings.LayerNorm.weight")  # TF-era names
    state["embeddings.LayerNorm.beta"] = state.pop("embeddings.LayerNorm.bias")
    save_file(state, tmp_path / "model.safetensors")
    again, report = load_checkpoint(tmp_path)
    assert not report
    assert torch.equal(again.embeddings.LayerNorm.weight, model.embeddings.LayerNorm.weight)


def test_backbone_loading_initialises_and_reports_heads(tmp_path):
    transformers.BertForPreTraining(transformers.BertConfig(**TINY)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="backbone"):
        load_checkpoint(tmp_path, task="ner", labels=["O", "B-PER", "I-PER"])
    model, report = load_checkpoint(tmp_path, task="ner", labels=["O", "B-PER", "I-PER"], from_backbone=True)
    assert type(model).__name__ == "BertForTokenClassification"
    assert report.initialised == ["classifier.bias", "classifier.weight"]
    assert "cls.seq_relationship.weight" in report.dropped and "bert.pooler.dense.weight" in report.dropped


def test_resolve_names_through_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTSERVE_HOME", str(tmp_path))
    save_checkpoint(BertModel(BertConfig(**TINY)), tmp_path / "checkpoints" / "mine")
    assert resolve_checkpoint("mine") == tmp_path / "checkpoints" / "mine"
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint("large")
    assert "Checkpoints found: mine" in str(e.value) and "--random-init" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_checkpoint(tmp_path / "empty")


def test_no_pickle_is_ever_unpickled(tmp_path):
    """A legacy pytorch_model.bin holding arbitrary objects is refused (weights_only=True)."""
    BertConfig(**TINY).save(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights.only|unsupported|global"):
        read_state_dict(tmp_path)


@pytest.mark.minilm
def test_minilm_hidden_states_equal_transformers_on_sst2_dev(minilm_dir, sst2_dev):
    """Bar: all-MiniLM-L6-v2 through bert/checkpoint.py vs transformers' BertModel, padded SST-2
    dev batches, max abs difference <= 1e-5 in fp32."""
    ours, report = load_checkpoint(minilm_dir)
    assert not report
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    sentences = sorted((s for s, _ in sst2_dev), key=len)  # batches of like lengths: little padding to compute
    worst = 0.0
    with torch.no_grad():
        for i in range(0, len(sentences), 128):
            batch = tokenizer(sentences[i : i + 128], padding=True, return_tensors="pt")
            a = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            b = hf(**batch)
            real = batch["attention_mask"].bool()
            worst = max(
                worst,
                (a.last_hidden_state - b.last_hidden_state)[real].abs().max().item(),
                (a.pooler_output - b.pooler_output).abs().max().item(),
            )
    assert worst <= 1e-5, worst


def test_a_model_loaded_for_inference_holds_the_files_tensors_without_drawing_random_ones(tmp_path, monkeypatch):
    """load_for_inference builds the model without its random draws (every parameter then comes from the file):
    not one draw made, and every tensor the file's."""
    import bert.model
    from bert.checkpoint import load_for_inference

    torch.manual_seed(3)
    saved = BertForSequenceClassification(BertConfig(**TINY, id2label={0: "n", 1: "o", 2: "p"}))
    save_checkpoint(saved, tmp_path / "ckpt")
    draws = []
    original = bert.model.BertPreTrainedModel._init_module
    monkeypatch.setattr(
        bert.model.BertPreTrainedModel, "_init_module", lambda self, m: draws.append(m) or original(self, m)
    )
    loaded, _ = load_for_inference(tmp_path / "ckpt")
    assert draws == []
    BertForSequenceClassification(BertConfig(**TINY))
    assert draws  # a model built the usual way draws its weights
    slow = loaded.state_dict()
    with bert.model.without_random_init():
        assert not bert.model._RANDOM_INIT.get()
    assert bert.model._RANDOM_INIT.get()  # back on after the block
    for name, tensor in saved.state_dict().items():
        key = name if name in slow else next(k for k in slow if k.endswith(name.split(".", 1)[1]))
        assert torch.equal(slow[key], tensor), name
