"""BERT: the layout every other family maps onto (bertserve's own names are BERT's)."""

from .base import BERT_REFUSED_SETTINGS, Family

FAMILY = Family("bert", {"bert": "Bert"}, "bert", order=10, refused_settings=BERT_REFUSED_SETTINGS)
