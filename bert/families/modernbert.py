"""ModernBERT: rotary positions (a global and a local base), alternating full and 128-token windowed attention,
one fused qkv projection without biases, a gated (GeGLU) MLP, pre-norm blocks, no token types, and one "head"
(dense, GELU, LayerNorm) that every task's head reads. Its config nests the attention pattern and rotary bases
(rope_parameters, layer_types), which the converters here map onto BertConfig's flat keys."""

from .base import ARCHITECTURE_SUFFIXES, Family, UnsupportedFamily


def _config_to_ours(data: dict) -> dict:
    """ModernBERT's attention pattern and rotary bases as our layer_types / rope_theta / local_rope_theta: from
    transformers 5's rope_parameters and layer_types, or the older global_attn_every_n_layers and
    global_/local_rope_theta (kept in the config as given)."""
    data = dict(data)
    rope = data.pop("rope_parameters", None) or {}
    for kind, ours, older in (
        ("full_attention", "rope_theta", "global_rope_theta"),
        ("sliding_attention", "local_rope_theta", "local_rope_theta"),
    ):
        params = rope.get(kind) if isinstance(rope, dict) else None
        if isinstance(params, dict):
            if params.get("rope_type", "default") != "default":
                raise UnsupportedFamily(
                    f"rope_type {params['rope_type']!r:.40} of {kind} is not supported (default only)"
                )
            if "rope_theta" in params:
                data[ours] = params["rope_theta"]
        elif older in data:
            data[ours] = data[older]
    data.pop("global_rope_theta", None)
    layers, every = data.get("num_hidden_layers"), data.get("global_attn_every_n_layers", 3)
    if data.get("layer_types") is None and isinstance(layers, int) and isinstance(every, int) and every > 0:
        data["layer_types"] = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    return data


def _config_to_theirs(data: dict) -> dict:
    data = dict(data)
    full, local = data.pop("rope_theta", None), data.pop("local_rope_theta", None)
    if full is not None:
        data["rope_parameters"] = {
            "full_attention": {"rope_theta": full, "rope_type": "default"},
            "sliding_attention": {"rope_theta": local if local is not None else full, "rope_type": "default"},
        }
    return data


FAMILY = Family(
    "modernbert",
    {"modernbert": "ModernBert"},
    "model",
    order=50,
    config_keys={
        "hidden_activation": "hidden_act",
        "norm_eps": "layer_norm_eps",
        "embedding_dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob",
    },
    # ModernBertConfig's defaults where they differ from BertConfig's (ours: the names after config_keys)
    config_defaults={
        "pad_token_id": 50283,
        "max_position_embeddings": 8192,
        "layer_norm_eps": 1e-5,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
        "rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "local_attention": 128,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_bias": False,
        "classifier_pooling": "cls",
        "classifier_activation": "gelu",
        "classifier_bias": False,
    },
    parameter_names=(
        ("embeddings.tok_embeddings.", "embeddings.word_embeddings."),
        ("embeddings.norm.", "embeddings.LayerNorm."),
        ("final_norm.", "encoder.final_norm."),
        ("layers.", "encoder.layer."),
        (".attn_norm.", ".attention_norm."),
        (".attn.Wo.", ".attention.output.dense."),  # before the MLP's: ours ends in ".output.dense." too
        (".mlp.Wi.", ".intermediate.dense."),
        (".mlp.Wo.", ".output.dense."),
    ),
    # One "head" (dense, activation, norm) in every model: a masked LM's transform, else the pooler, which its
    # sequence classifier reads pooled and its token and QA heads read per token. Its QA head is "classifier".
    head_prefixes=(
        ("head.norm.", "cls.predictions.transform.LayerNorm."),
        ("head.", "cls.predictions.transform."),
        ("decoder.bias", "cls.predictions.bias"),
        ("decoder.weight", "cls.predictions.decoder.weight"),
        ("head.norm.", "bert.pooler.LayerNorm."),
        ("head.", "bert.pooler."),
        ("classifier.", "qa_outputs."),
    ),
    # one (3H, H) projection there, BERT's query, key and value here
    weight_layouts=(((".attn.Wqkv.",), (".attention.self.query.", ".attention.self.key.", ".attention.self.value.")),),
    architecture_suffixes=(*ARCHITECTURE_SUFFIXES, "ForMaskedLM"),
    config_converters=(_config_to_ours, _config_to_theirs),
    config_blocks=(
        "rope_theta",
        "local_rope_theta",
        "layer_types",
        "local_attention",
        "attention_bias",
        "mlp_bias",
        "norm_bias",
        "classifier_pooling",
        "classifier_activation",
        "classifier_bias",
        "decoder_bias",
    ),
    token_types=False,
    pooler_activation="gelu",
    bare_pooler=False,
    norm="pre",
    first_attention_norm=False,
    mlp="gated",
    pooler_norm=True,
    token_head_transform=True,
    transform_activation="classifier_activation",
)
