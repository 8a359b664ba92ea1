"""ELECTRA (the discriminator): BERT's encoder, embeddings possibly narrower than the hidden size
(embedding_size), and a GELU first-token layer inside the sequence classifier."""

from .base import BERT_REFUSED_SETTINGS, Family

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
)
