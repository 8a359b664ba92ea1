"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder with positions offset past the pad id, a sequence
classifier whose first-token layer sits in the head, and BERT's masked-LM head under other names."""

from .base import ARCHITECTURE_SUFFIXES, BERT_REFUSED_SETTINGS, Family

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
    architecture_suffixes=(*ARCHITECTURE_SUFFIXES, "ForMaskedLM"),
    # the masked-LM head (RobertaLMHead): dense, GELU, LayerNorm, the decoder tied to the word embeddings
    head_prefixes=(
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.decoder.", "cls.predictions.decoder."),
        ("lm_head.bias", "cls.predictions.bias"),
    ),
)
