"""Model families: each BERT-style encoder layout we load, one file each (bert/families/<name>.py).

A family declares its names, its config.json mapping and the building blocks where it differs from BERT
(positions, attention, MLP, norm placement, pooler) as one `FAMILY = Family(...)` (bert/families/base.py);
the registry (bert/families/registry.py) finds every such module. Adding a family is one file here, plus, if
it differs from BERT in a way no field of `Family` covers yet, that field and its block in bert/blocks/.

torch-free: serving reads artifact configs without torch.
"""

from .base import ARCHITECTURE_SUFFIXES, Family, UnsupportedFamily
from .bert import FAMILY as BERT  # the layout every other family maps onto, and the default
from .registry import BY_MODEL_TYPE, FAMILIES, family_of

__all__ = [
    "ARCHITECTURE_SUFFIXES",
    "BERT",
    "BY_MODEL_TYPE",
    "FAMILIES",
    "Family",
    "UnsupportedFamily",
    "family_of",
]
