"""Readers for labelled datasets, named in one place for scripts outside the tasks (evals, demos).

Each task reads its own formats (bert/tasks): GLUE-style TSV in bert.tasks.classify, CoNLL in
bert.tasks.ner, SQuAD JSON in bert.tasks.qa; the shared file opening and DataError in bert.tasks.common.
"""

from bert.tasks.classify import TextExample, read_tsv
from bert.tasks.common import DataError, PathLike, open_text
from bert.tasks.ner import TaggedSentence, detect_scheme, iob1_to_iob2, read_conll
from bert.tasks.qa import QAExample, expand_paths, read_squad, read_squad_articles, split_heldout, squad_examples

__all__ = [
    "DataError",
    "PathLike",
    "QAExample",
    "TaggedSentence",
    "TextExample",
    "detect_scheme",
    "expand_paths",
    "iob1_to_iob2",
    "open_text",
    "read_conll",
    "read_squad",
    "read_squad_articles",
    "read_tsv",
    "split_heldout",
    "squad_examples",
]
