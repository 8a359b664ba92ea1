"""Config settings of every family that transformers accepts, against what bertserve makes of them: a setting we run
gives transformers' logits; a setting we do not run is refused in one line naming it, never run as something else.

Tiny random models made with transformers' own classes (hidden 32, initializer_range 0.3, so that inputs are told
apart), saved with save_pretrained, loaded the way serving and export load them (bert.checkpoint).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402
from test_deberta import V3 as DEBERTA_V3  # noqa: E402

from bert.checkpoint import CheckpointError, load_checkpoint, load_for_inference, save_checkpoint  # noqa: E402
from bert.config import BertConfig, ConfigError  # noqa: E402

BASE = dict(vocab_size=99, initializer_range=0.3)
BERTISH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
V3 = {**DEBERTA_V3, "position_buckets": 16}  # DeBERTa-v3's settings, fewer buckets for a tiny model
HEADS = {  # our task -> transformers' Auto class, its outputs, our outputs
    "classify": (transformers.AutoModelForSequenceClassification, ("logits",), ("classify_logits",)),
    "ner": (transformers.AutoModelForTokenClassification, ("logits",), ("ner_logits",)),
    "embed": (transformers.AutoModel, ("last_hidden_state",), None),
    "mlm": (transformers.AutoModelForMaskedLM, ("logits",), None),
}


def hf_config(model_type: str, **overrides):
    """A tiny transformers config of `model_type`, as its own checkpoints are laid out."""
    if model_type == "distilbert":
        return transformers.DistilBertConfig(
            **{**BASE, "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 37, "max_position_embeddings": 64},
            **overrides,
        )
    if model_type == "modernbert":
        ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
        layout = dict(intermediate_size=48, num_hidden_layers=3, local_attention=8, global_attn_every_n_layers=2)
        return transformers.ModernBertConfig(
            **{**BASE, **BERTISH, **layout, **ids, "max_position_embeddings": 128, **overrides}
        )
    if model_type == "deberta-v2":
        return transformers.DebertaV2Config(
            **{**BASE, **BERTISH, "max_position_embeddings": 64, "pad_token_id": 0, **V3, **overrides}
        )
    if model_type == "roberta":
        fairseq = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, layer_norm_eps=1e-5)
        return transformers.RobertaConfig(**{**BASE, **BERTISH, "max_position_embeddings": 66, **fairseq, **overrides})
    if model_type == "electra":
        return transformers.ElectraConfig(
            **{**BASE, **BERTISH, "max_position_embeddings": 64, "embedding_size": 16, **overrides}
        )
    return transformers.BertConfig(**{**BASE, **BERTISH, "max_position_embeddings": 64, **overrides})


def make_hf(directory, model_type: str, head: str, config_json: dict | None = None, **overrides):
    """transformers' model of `head`, saved in `directory` (config.json then given `config_json`'s keys as they
    are) and read back by transformers from there."""
    torch.manual_seed(0)
    model = HEADS[head][0].from_config(hf_config(model_type, num_labels=3, **overrides)).eval()
    model.save_pretrained(directory)
    if config_json:
        path = directory / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config_json}))
    return HEADS[head][0].from_pretrained(directory).eval()


def batch(config, lengths=(20, 13, 5)):
    """Right-padded ids of the given lengths, none of them the pad id among the real tokens."""
    g = torch.Generator().manual_seed(1)
    pad = config.pad_token_id
    ids = torch.randint(3, config.vocab_size, (len(lengths), max(lengths)), generator=g)
    ids[ids == pad] = pad + 1 if pad + 1 >= 3 else 3
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


def worst_difference(directory, theirs, head: str) -> float:
    """Max |ours - theirs| over the real tokens (over the rows, for a sequence head)."""
    ids, mask = batch(theirs.config)
    with torch.no_grad():
        out = theirs(input_ids=ids, attention_mask=mask)
    expected = [getattr(out, name) for name in HEADS[head][1]]
    if head in ("embed", "mlm"):
        model, report = load_checkpoint(directory)
    else:
        model, report = load_for_inference(directory)
    assert not report, report
    with torch.no_grad():
        out = model(ids, mask)
    got = {"mlm": lambda: [out.mlm_logits], "embed": lambda: [out.last_hidden_state]}.get(
        head, lambda: [out.outputs[name] for name in HEADS[head][2]]
    )()
    worst = 0.0
    for a, b in zip(got, expected):
        assert a.shape == b.shape, (a.shape, b.shape)
        if head != "classify":
            a, b = a[mask.bool()], b[mask.bool()]
        worst = max(worst, (a - b).abs().max().item())
    return worst


# ---- settings we run: transformers' logits -------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_type, head, overrides",
    [
        ("bert", "classify", dict(hidden_act="gelu_new", layer_norm_eps=1e-3)),
        ("bert", "mlm", dict(hidden_act="silu")),
        ("bert", "classify", dict(type_vocab_size=1, pad_token_id=5)),
        ("roberta", "ner", dict(pad_token_id=0, max_position_embeddings=65)),
        ("roberta", "classify", dict(pad_token_id=3, max_position_embeddings=68, hidden_act="relu")),
        ("distilbert", "classify", dict(sinusoidal_pos_embds=True, activation="relu")),
        ("electra", "classify", dict(embedding_size=48)),
        ("electra", "ner", dict(embedding_size=32)),
        ("modernbert", "ner", dict(global_attn_every_n_layers=1)),
        ("modernbert", "ner", dict(global_attn_every_n_layers=4, local_attention=7)),
        ("modernbert", "mlm", dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)),
        ("modernbert", "classify", dict(classifier_pooling="mean", classifier_activation="silu", norm_eps=1e-2)),
        ("modernbert", "ner", dict(global_rope_theta=1000.0, local_rope_theta=50.0, hidden_activation="silu")),
        ("deberta-v2", "classify", dict(pos_att_type=["c2p"], share_att_key=False, pooler_hidden_act="tanh")),
        ("deberta-v2", "classify", dict(pos_att_type=["p2c"], position_biased_input=True, type_vocab_size=2)),
        ("deberta-v2", "ner", dict(max_relative_positions=8, position_buckets=-1, norm_rel_ebd="none")),
        ("deberta-v2", "ner", dict(max_relative_positions=40, position_buckets=8, pos_att_type=None)),
        ("deberta-v2", "mlm", dict(hidden_act="gelu_new")),
        ("deberta-v2", "mlm", dict(pooler_hidden_act="tanh")),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}={v}" for k, v in value.items()),
)
def test_settings_we_run_give_transformers_logits(tmp_path, model_type, head, overrides):
    theirs = make_hf(tmp_path, model_type, head, **overrides)
    assert worst_difference(tmp_path, theirs, head) <= 1e-5


def test_a_tanh_classifier_activation_runs_in_a_modernbert_masked_lm(tmp_path):
    """ModernBERT's classifier_activation is also its masked-LM transform's activation: tanh there too."""
    theirs = make_hf(tmp_path, "modernbert", "mlm", classifier_activation="tanh")
    assert worst_difference(tmp_path, theirs, "mlm") <= 1e-5


@pytest.mark.parametrize("model_type", ["bert", "electra"])
def test_packed_path_of_a_tanh_gelu_model_gives_transformers_logits_on_cpu(tmp_path, model_type):
    """A gelu_new model runs its feed-forward GELU as the GEMM's epilogue in the packed path by default, which
    stands for the tanh approximation (cuBLASLt's on CUDA); on the CPU it is that approximation too."""
    from runtime.backends.torch_packed import PackedEncoder, PackedRunner, pack

    theirs = make_hf(tmp_path, model_type, "ner", hidden_act="gelu_new")
    model, _ = load_for_inference(tmp_path)
    encoder = PackedEncoder(model)
    assert encoder.gelu_epilogue
    ids, mask = batch(theirs.config)
    features = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": 0 * ids.numpy()}
    got = torch.as_tensor(PackedRunner(encoder, torch.device("cpu"), graphs=False).run(pack(features))["ner_logits"])
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    assert (got[keep] - expected[keep]).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "model_type, head, config_json, kept",
    [
        ("bert", "classify", {"classifier_activation": "relu", "classifier_bias": False}, True),
        ("bert", "embed", {"rope_theta": 1e4, "layer_types": ["sliding_attention"] * 2, "local_attention": 4}, True),
        ("roberta", "classify", {"position_biased_input": False, "relative_attention": True}, True),
        ("electra", "classify", {"classifier_activation": "tanh", "norm_bias": False}, True),
        ("distilbert", "ner", {"layer_norm_eps": 1e-3, "embedding_size": 16}, False),
        ("modernbert", "ner", {"hidden_act": "relu", "layer_norm_eps": 1e-3}, False),
        ("deberta-v2", "classify", {"classifier_activation": "relu"}, False),
    ],
    ids=[
        "bert-classifier-activation",
        "bert-rotary-window",
        "roberta-relative",
        "electra-head",
        "distilbert-eps",
        "modernbert-our-names",
        "deberta-our-names",
    ],
)
def test_keys_a_familys_transformers_class_never_reads_change_nothing(tmp_path, model_type, head, config_json, kept):
    """A config.json key that transformers' class of the family ignores (another family's building block, a value
    the class hard-codes, our name for a key the family names otherwise) changes nothing here either; another
    family's building blocks are written back as they were."""
    theirs = make_hf(tmp_path / "theirs", model_type, head, config_json)
    assert worst_difference(tmp_path / "theirs", theirs, head) <= 1e-5
    if kept:
        model, _ = (load_checkpoint if head == "embed" else load_for_inference)(tmp_path / "theirs")
        save_checkpoint(model, tmp_path / "ours")
        written = json.loads((tmp_path / "ours" / "config.json").read_text())
        assert all(written[key] == value for key, value in config_json.items()), written


def test_each_familys_config_blocks_are_building_block_fields():
    """What a family declares it reads (Family.config_blocks) is a field of BertConfig, which the other families'
    config.json then never set."""
    import dataclasses

    from bert.config import BLOCK_FIELDS
    from bert.families import FAMILIES

    fields = {f.name for f in dataclasses.fields(BertConfig)}
    assert set(BLOCK_FIELDS) <= fields
    for family in FAMILIES:
        assert set(family.config_blocks) <= set(BLOCK_FIELDS), family.name
        assert set(family.unread_keys) <= fields, family.name
        assert getattr(BertConfig(), family.transform_activation, "missing") != "missing", family.name


# ---- settings we do not run: one line naming the key ---------------------------------------------------------


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
@pytest.mark.parametrize(
    "key, value", [("is_decoder", True), ("position_embedding_type", "relative_key_query")], ids=["causal", "relative"]
)
def test_causal_and_relative_position_settings_are_refused_in_one_line(tmp_path, model_type, key, value):
    """transformers runs is_decoder as causal attention (and transformers 4 ran relative_key(_query) as relative
    scores); our encoder has neither, so the checkpoint is refused rather than answered bidirectionally."""
    data = {**hf_config(model_type).to_dict(), key: value}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        BertConfig.from_json_file(tmp_path)
    assert key in _one_line(caught)
    # the values transformers writes by default load as before
    data.update(is_decoder=False, position_embedding_type="absolute")
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert BertConfig.from_json_file(tmp_path).model_type == model_type


def test_is_decoder_is_causal_in_transformers(tmp_path):
    """What the refusal above protects from: the same weights answer otherwise as a decoder."""
    theirs = make_hf(tmp_path, "bert", "classify")
    ids, mask = batch(theirs.config)
    decoder = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, is_decoder=True).eval()
    with torch.no_grad():
        difference = (
            decoder(input_ids=ids, attention_mask=mask).logits - theirs(input_ids=ids, attention_mask=mask).logits
        )
    assert difference.abs().max().item() > 1e-2


@pytest.mark.parametrize("model_type", ["bert", "modernbert", "deberta-v2"])
def test_an_untied_masked_lm_decoder_is_refused_naming_tie_word_embeddings(tmp_path, model_type):
    theirs = make_hf(tmp_path, model_type, "mlm", tie_word_embeddings=False)
    table = theirs.get_input_embeddings().weight
    assert not torch.equal(theirs.get_output_embeddings().weight, table)  # transformers computes with its own decoder
    for load in (load_checkpoint, load_for_inference):
        with pytest.raises(CheckpointError) as caught:
            load(tmp_path)
        assert "tie_word_embeddings" in _one_line(caught)


def test_a_decoder_that_differs_from_the_tied_table_is_refused(tmp_path):
    """transformers keeps a file's decoder apart from the word embeddings where the two differ, though config.json
    ties them: refused here; a copy equal to the table (older transformers wrote one) loads as before."""
    make_hf(tmp_path, "bert", "mlm")
    path = tmp_path / "model.safetensors"
    state = load_file(path)
    table = state["bert.embeddings.word_embeddings.weight"]
    save_file({**state, "cls.predictions.decoder.weight": table.clone()}, path, metadata={"format": "pt"})
    load_checkpoint(tmp_path)
    save_file({**state, "cls.predictions.decoder.weight": table + 1.0}, path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path)
    assert "tie_word_embeddings" in _one_line(caught)


# ---- exported ------------------------------------------------------------------------------------------------


def _bert_vocab(directory) -> None:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(c) for c in range(97, 123)]
    tokens += ["##" + chr(c) for c in range(97, 123)]
    tokens += [f"w{i}" for i in range(BASE["vocab_size"] - len(tokens))]
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("bert", dict(hidden_act="gelu_new", layer_norm_eps=1e-3, type_vocab_size=1)),
        ("modernbert", dict(attention_bias=True, mlp_bias=True, norm_bias=True, local_attention=7)),
    ],
    ids=["bert-gelu-new-eps-one-type", "modernbert-biases-odd-window"],
)
def test_fp32_export_gives_transformers_logits(tmp_path, model_type, overrides):
    import onnxruntime as ort

    from export.onnx import cli as export_cli

    checkpoint = tmp_path / "checkpoint"
    if model_type == "modernbert":
        from test_modernbert import VOCAB, write_tokenizer

        overrides = {**overrides, "vocab_size": VOCAB}
    theirs = make_hf(checkpoint, model_type, "ner", **overrides)
    if model_type == "modernbert":
        write_tokenizer(checkpoint)
    else:
        _bert_vocab(checkpoint)
    assert export_cli(["--ckpt", str(checkpoint), "--out", str(tmp_path / "artifact"), "--precision", "fp32"]) == 0
    ids, mask = batch(theirs.config, (30, 17, 4))
    session = ort.InferenceSession(str(tmp_path / "artifact" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    (got,) = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    assert (torch.from_numpy(got)[keep] - expected[keep]).abs().max().item() <= 1e-4
