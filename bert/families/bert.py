"""BERT: the layout every other family maps onto (bertserve's own names are BERT's)."""

from .base import Family

FAMILY = Family("bert", {"bert": "Bert"}, "bert", order=10)
