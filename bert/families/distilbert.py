"""DistilBERT: BERT's encoder under its own config keys and parameter names, without token types, with a
ReLU pre_classifier as the first-token layer (and, as a config option, sinusoidal positions)."""

from .base import ARCHITECTURE_SUFFIXES, Family

FAMILY = Family(
    "distilbert",
    {"distilbert": "DistilBert"},
    "distilbert",
    order=30,
    config_keys={
        "dim": "hidden_size",
        "n_layers": "num_hidden_layers",
        "n_heads": "num_attention_heads",
        "hidden_dim": "intermediate_size",
        "activation": "hidden_act",
        "dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob",
        "seq_classif_dropout": "classifier_dropout",
    },
    # transformers' DistilBERT norms every layer with eps 1e-12 (BertConfig's default), whatever the config says
    unread_keys=("layer_norm_eps",),
    parameter_names=(
        ("transformer.layer.", "encoder.layer."),
        # the attention output first: BERT's ".attention.output.dense." also contains ".output.dense."
        (".attention.out_lin.", ".attention.output.dense."),
        (".sa_layer_norm.", ".attention.output.LayerNorm."),
        (".attention.q_lin.", ".attention.self.query."),
        (".attention.k_lin.", ".attention.self.key."),
        (".attention.v_lin.", ".attention.self.value."),
        (".ffn.lin1.", ".intermediate.dense."),
        (".ffn.lin2.", ".output.dense."),
        (".output_layer_norm.", ".output.LayerNorm."),
    ),
    sequence_pooler="pre_classifier",
    architecture_suffixes=(*ARCHITECTURE_SUFFIXES, "ForMaskedLM"),
    # the masked-LM head: vocab_transform, the activation, vocab_layer_norm, vocab_projector tied to the word table
    head_prefixes=(
        ("vocab_transform.", "cls.predictions.transform.dense."),
        ("vocab_layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("vocab_projector.weight", "cls.predictions.decoder.weight"),
        ("vocab_projector.bias", "cls.predictions.bias"),
    ),
    token_types=False,
    pooler_activation="relu",
    bare_pooler=False,
)
