"""ELECTRA: BERT's encoder, embeddings possibly narrower than the hidden size (embedding_size), a GELU
first-token layer inside the sequence classifier (the discriminator's heads), and the generator's masked-LM head."""

from .base import ARCHITECTURE_SUFFIXES, BERT_REFUSED_SETTINGS, Family

FAMILY = Family(
    "electra",
    {"electra": "Electra"},
    "electra",
    order=40,
    refused_settings=BERT_REFUSED_SETTINGS,
    config_blocks=("embedding_size",),
    sequence_pooler="{head}.dense",
    sequence_output="{head}.out_proj",
    pooler_activation="gelu",
    bare_pooler=False,
    # ElectraForMaskedLM, the generator: its head maps the hidden size down to embedding_size (dense, GELU,
    # LayerNorm), then the decoder tied to the word embeddings
    architecture_suffixes=(*ARCHITECTURE_SUFFIXES, "ForMaskedLM"),
    head_prefixes=(
        ("generator_predictions.", "cls.predictions.transform."),
        ("generator_lm_head.weight", "cls.predictions.decoder.weight"),
        ("generator_lm_head.bias", "cls.predictions.bias"),
    ),
)
