"""DeBERTa-v2 and v3: BERT's post-norm encoder with disentangled attention (content->position and
position->content scores over a shared table of log-bucketed relative-position embeddings), no absolute positions
where position_biased_input is false, no token types where type_vocab_size is 0, a GELU first-token layer
("pooler") before a sequence classifier, and the legacy masked-LM layout (BERT's). The building blocks live in
bert/model.py; this file wires them and refuses the switches it does not run, one line naming the key."""

from .base import ARCHITECTURE_SUFFIXES, Family, UnsupportedFamily


def _config_to_ours(data: dict) -> dict:
    data = dict(data)
    hidden, heads = data.get("hidden_size", 1536), data.get("num_attention_heads", 24)
    if isinstance(data.get("conv_kernel_size"), int) and data["conv_kernel_size"] > 0:
        raise UnsupportedFamily(f"conv_kernel_size {data['conv_kernel_size']} is not supported (a convolution layer)")
    size = data.get("attention_head_size")
    if size is not None and not (
        isinstance(hidden, int) and isinstance(heads, int) and heads and size * heads == hidden
    ):
        raise UnsupportedFamily(f"attention_head_size {size!r:.20} is not supported (only hidden_size / heads)")
    for key in ("pooler_hidden_size", "embedding_size"):
        if data.get(key, hidden) != hidden:
            raise UnsupportedFamily(f"{key} {data[key]!r:.20} is not supported (only hidden_size)")
    architectures = data.get("architectures") or []
    masked_lm = any(isinstance(a, str) and a.endswith("ForMaskedLM") for a in architectures)
    if masked_lm and data.get("legacy", True) is False:
        raise UnsupportedFamily("legacy false is not supported (the masked-LM head in lm_predictions)")
    terms = data.get("pos_att_type")
    if isinstance(terms, str):  # "p2c|c2p", as older configs write it
        data["pos_att_type"] = [t.strip() for t in terms.lower().split("|") if t.strip()]
    norm = data.get("norm_rel_ebd")
    if isinstance(norm, str):
        data["norm_rel_ebd"] = "layer_norm" if "layer_norm" in norm.lower().split("|") else "none"
    data.pop("embedding_size", None)
    return data


FAMILY = Family(
    "deberta_v2",
    {"deberta-v2": "DebertaV2"},
    "deberta",
    order=60,
    config_keys={"pooler_hidden_act": "classifier_activation", "cls_dropout": "classifier_dropout"},
    # DebertaV2Config's defaults where they differ from BertConfig's (ours: the names after config_keys)
    config_defaults={
        "vocab_size": 128100,
        "hidden_size": 1536,
        "num_hidden_layers": 24,
        "num_attention_heads": 24,
        "intermediate_size": 6144,
        "type_vocab_size": 0,
        "layer_norm_eps": 1e-7,
        "relative_attention": False,
        "position_biased_input": True,
        "classifier_activation": "gelu",
    },
    config_converters=(_config_to_ours, lambda data: data),
    config_blocks=(
        "classifier_activation",
        "position_biased_input",
        "relative_attention",
        "pos_att_type",
        "position_buckets",
        "max_relative_positions",
        "share_att_key",
        "norm_rel_ebd",
    ),
    parameter_names=(
        (".attention.self.query_proj.", ".attention.self.query."),
        (".attention.self.key_proj.", ".attention.self.key."),
        (".attention.self.value_proj.", ".attention.self.value."),
        ("encoder.LayerNorm.", "encoder.rel_embeddings_norm."),
    ),
    # DeBERTa-v3's released checkpoints keep an absolute table that position_biased_input false never reads
    unused_parameters=("embeddings.position_embeddings.weight",),
    sequence_pooler="pooler.dense",
    architecture_suffixes=(*ARCHITECTURE_SUFFIXES, "ForMaskedLM"),
    attention="disentangled",
    pooler_activation="gelu",
    bare_pooler=False,
)
