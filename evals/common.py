"""What the evaluations share: the held-out SQuAD split."""

from __future__ import annotations

from bench.common import DATA_DIR


def heldout_squad_articles(n: int) -> list[dict]:
    """The last n SQuAD train articles (file order): the held-out split the demo model never trained on
    (the qa task's --heldout-articles)."""
    from training.data.readers import read_squad_articles, split_heldout

    return split_heldout(read_squad_articles(DATA_DIR / "squad-train"), n)[1]
