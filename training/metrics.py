"""Evaluation metrics, named in one place for scripts outside the tasks (evals, demos).

Each task owns its metric (bert/tasks): classification and regression metrics in bert.tasks.classify,
conlleval's entity F1 in bert.tasks.ner, the official SQuAD EM/F1 in bert.tasks.qa, ranking in bert.tasks.rerank.
"""

from bert.tasks.classify import (
    accuracy,
    classification_metrics,
    f1_binary,
    f1_macro,
    matthews_corrcoef,
    pearson,
    regression_metrics,
    spearman,
)
from bert.tasks.ner import chunks, conlleval
from bert.tasks.qa import normalize_answer, squad_exact, squad_f1, squad_metrics

__all__ = [
    "accuracy",
    "chunks",
    "classification_metrics",
    "conlleval",
    "f1_binary",
    "f1_macro",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson",
    "regression_metrics",
    "spearman",
    "squad_exact",
    "squad_f1",
    "squad_metrics",
]
