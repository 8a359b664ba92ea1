"""The tiny-config model tester (after google-research/bert's modeling_test.py): shapes, losses,
determinism, masking, tracing, and state-dict names equal to transformers'."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bert.config import BertConfig, ConfigError
from bert.model import (
    BertForMaskedLM,
    BertForMultiTask,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    additive_padding_mask,
)

B, T = 3, 7


@pytest.fixture
def config() -> BertConfig:
    return BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        id2label={0: "a", 1: "b", 2: "c"},
    )


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 99, (B, T), generator=g)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, 5:] = 0
    attention_mask[2, 3:] = 0
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    token_type_ids[:, 4:] = 1
    return input_ids, attention_mask, token_type_ids


def test_presets_follow_the_paper():
    base, large = BertConfig.preset("base"), BertConfig.preset("large")
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size) == (
        12,
        768,
        12,
        3072,
    )
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (24, 1024, 16)
    assert BertConfig.preset("tiny").hidden_size == 128
    assert BertConfig.preset("mini", vocab_size=1000).vocab_size == 1000
    params = sum(p.numel() for p in BertModel(base).parameters())
    assert 108e6 < params < 111e6  # "110M parameters"


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(hidden_size=30, num_attention_heads=4), "divisible"),
        (dict(hidden_act="tanh"), "hidden_act"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
        (dict(task="summarise"), "task"),
        (dict(id2label={0: "x", 2: "y"}), "id2label"),
    ],
)
def test_invalid_configs_fail_with_a_message(bad, message):
    with pytest.raises(ConfigError, match=message):
        BertConfig(**bad)
    with pytest.raises(ConfigError, match="unknown preset"):
        BertConfig.preset("huge")


def test_config_json_round_trip_keeps_unknown_keys(tmp_path, config):
    config.extra["transformers_version"] = "4.8.2"
    config.save(tmp_path)
    again = BertConfig.from_json_file(tmp_path)
    assert again == config
    assert again.label2id == {"a": 0, "b": 1, "c": 2}


def test_shapes_of_every_head(config, batch):
    ids, mask, types = batch
    out = BertModel(config).eval()(ids, mask, types)
    assert out.last_hidden_state.shape == (B, T, 32) and out.pooler_output.shape == (B, 32)
    assert BertForSequenceClassification(config)(ids, mask, types).logits.shape == (B, 3)
    assert BertForTokenClassification(config)(ids, mask, types).logits.shape == (B, T, 3)
    span = BertForQuestionAnswering(config)(ids, mask, types)
    assert span.start_logits.shape == span.end_logits.shape == (B, T)
    pre = BertForPreTraining(config)(ids, mask, types)
    assert pre.mlm_logits.shape == (B, T, 99) and pre.nsp_logits.shape == (B, 2)


def test_losses(config, batch):
    ids, mask, types = batch
    torch.manual_seed(0)
    mlm_labels = torch.full((B, T), -100)
    mlm_labels[0, 2], mlm_labels[1, 1] = 5, 7
    pre = BertForPreTraining(config)(ids, mask, types, mlm_labels=mlm_labels, nsp_labels=torch.tensor([0, 1, 0]))
    assert pre.mlm_logits.shape == (2, 99)  # only labelled positions are projected onto the vocabulary
    assert torch.allclose(pre.loss, pre.mlm_loss + pre.nsp_loss)
    assert abs(pre.mlm_loss.item() - torch.log(torch.tensor(99.0)).item()) < 1.0  # near uniform at init


def test_task_losses_on_the_one_head_model(config, batch):
    """Fine-tuning and multitask train BertForMultiTask with each task's Task.loss (the single-task classes
    compute none)."""
    from bert.tasks import registry

    ids, mask, types = batch
    torch.manual_seed(0)
    model = BertForMultiTask(config, {"classify": ["score"], "ner": ["a", "b", "c"], "qa": []})
    out = model(ids, mask, types).outputs
    assert registry.get("classify").loss(out, {"labels": torch.tensor([0.5, 1.0, -1.0])}) > 0  # one output: MSE
    labels = torch.full((B, T), -100)
    labels[:, 1] = 2
    assert registry.get("ner").loss(out, {"labels": labels}) > 0
    qa = registry.get("qa").loss(
        out, {"start_positions": torch.tensor([1, 2, 99]), "end_positions": torch.tensor([2, 2, 99])}
    )
    assert torch.isfinite(qa)  # a position past the sequence (answer outside the window) is ignored
    assert not hasattr(BertForSequenceClassification(config)(ids, mask, types), "loss")


def test_decoder_is_tied_to_word_embeddings(config):
    for model in (BertForPreTraining(config), BertForMaskedLM(config)):
        assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
        assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


def test_padding_does_not_change_real_tokens(config, batch):
    """The same sentence alone and padded inside a batch: same states for its real tokens."""
    ids, mask, types = batch
    model = BertModel(config).eval()
    with torch.no_grad():
        padded = model(ids, mask, types).last_hidden_state[1, :5]
        alone = model(ids[1:2, :5], mask[1:2, :5], types[1:2, :5]).last_hidden_state[0]
    assert torch.allclose(padded, alone, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_padding_mask_is_safe_in_half_precision(config, batch, dtype):
    ids, mask, types = batch
    model = BertModel(config).eval().to(dtype)
    assert additive_padding_mask(mask, dtype).dtype == dtype
    with torch.no_grad():
        out = model(ids, mask, types).last_hidden_state
    assert torch.isfinite(out).all()


def test_eager_and_sdpa_attention_agree(config, batch):
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        sdpa = model(*batch).logits
        model.set_attention_implementation("eager")
        eager = model(*batch).logits
    assert torch.allclose(sdpa, eager, atol=1e-5)


def test_deterministic_in_eval_and_dropout_in_train(config, batch):
    model = BertForSequenceClassification(config)
    model.eval()
    assert torch.equal(model(*batch).logits, model(*batch).logits)
    model.train()
    assert not torch.equal(model(*batch).logits, model(*batch).logits)


class SpanWrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask, types):
        out = self.model(ids, mask, types)
        return out.start_logits, out.end_logits


def test_exports_with_dynamic_shapes_and_no_value_dependent_branches(config, batch):
    """torch.export refuses data-dependent control flow and .item(): the graph must hold for any
    batch and sequence length, not only the example's."""
    wrapper = SpanWrapper(BertForQuestionAnswering(config).eval())
    batch_dim, seq_dim = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
    dynamic = {name: {0: batch_dim, 1: seq_dim} for name in ("ids", "mask", "types")}
    exported = torch.export.export(wrapper, batch, dynamic_shapes=dynamic)
    other = tuple(t[:2, :5] for t in batch)  # another batch size and sequence length than exported with
    with torch.no_grad():
        for got, want in zip(exported.module()(*other), wrapper(*other)):
            assert torch.allclose(got, want, atol=1e-5)


def test_multitask_heads(config, batch):
    config.task_labels = {"classify": ["neg", "pos"], "ner": ["O", "B-PER", "I-PER"], "qa": []}
    out = BertForMultiTask(config).eval()(*batch)
    assert out.classify_logits.shape == (B, 2)
    assert out.ner_logits.shape == (B, T, 3)
    assert out.qa_start_logits.shape == (B, T)


def test_every_head_kind_a_task_may_declare_is_one_object():
    """bert.tasks.base.head_kinds() (what a task may declare, checked without torch) and bert.heads (what builds
    and runs them) name the same kinds; an unknown kind is refused by name."""
    from bert import heads
    from bert.tasks import TASKS
    from bert.tasks.base import head_kinds

    assert sorted(heads.KINDS) == sorted(head_kinds())
    assert all(heads.get(kind).name == kind for kind in head_kinds())
    assert {t.head.kind for t in TASKS.values() if t.head is not None} <= set(heads.KINDS)
    with pytest.raises(ValueError, match="unknown head kind 'bogus'"):
        heads.get("bogus")


def test_every_head_kind_is_known_once_bert_heads_is_imported():
    """The masked-LM kind is declared in bert/heads.py with the others: an exporter that imports only bert.heads
    finds it without bert.model having been imported first (that was an import-order dependency)."""
    code = "import sys; from bert import heads; heads.get('mlm'); print('bert.model' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


HF_CLASSES = [
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
]


@pytest.mark.parametrize("name", HF_CLASSES)
def test_state_dict_names_equal_transformers(name, config):
    transformers = pytest.importorskip("transformers")
    import bert.model as ours

    hf_config = transformers.BertConfig(**config.to_dict())
    hf_keys = {
        k
        for k in getattr(transformers, name)(hf_config).state_dict()
        if not k.endswith(("position_ids", "embeddings.token_type_ids"))
    }
    assert set(getattr(ours, name)(config).state_dict()) == hf_keys
