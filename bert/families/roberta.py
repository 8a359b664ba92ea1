"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder with positions offset past the pad id, and a sequence
classifier whose first-token layer sits in the head."""

from .base import BERT_REFUSED_SETTINGS, Family

FAMILY = Family(
    "roberta",
    {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"},
    "roberta",
    order=20,
    config_defaults={"pad_token_id": 1},
    refused_settings=BERT_REFUSED_SETTINGS,
    sequence_pooler="{head}.dense",
    sequence_output="{head}.out_proj",
    position_offset=True,
)
