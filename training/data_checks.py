"""Checks of the examples a task's reader returned, before any model is built or run: data that cannot be trained
or evaluated on is one line naming the file (and the line, where the reader keeps one), raised as ConfigError
(training.config.run: `error: ...`, exit 2), not a traceback after minutes of work.

The checks go by what the examples hold (a `label` as written in a TSV, CoNLL `tags`), so the CLIs still never name
a task: empty data, labels the head does not know, values a regression head cannot read, tags that are not IOB.
"""

from __future__ import annotations

import csv
import re

from training.config import ConfigError

IOB_TAG = re.compile(r"(O|[BI]-\S+)")


def check_not_empty(path: str, examples: list, role: str) -> None:
    """`role` examples (training, evaluation) from `path`: at least one."""
    if not examples:
        raise ConfigError(f"{path}: no {role} examples in it (an empty file, or nothing in the task's format)")


def check_full_batch(path: str, examples: int, features: int, batch_size: int, batches: int) -> None:
    """A training set without one full batch of --batch-size cannot take a step (the last partial batch of each
    epoch is dropped)."""
    if batches == 0:
        counted = f"{examples} examples" + (f" ({features} features)" if features != examples else "")
        raise ConfigError(
            f"{path}: {counted}, fewer than --batch-size {batch_size}: no full batch to train on "
            "(lower --batch-size or give more data)"
        )


def check_labels(path: str, examples: list, labels, whose: str) -> None:
    """Every example's label (TSV rows: `.label`) is one the head predicts (`labels.values`, `whose` says where they
    come from), or a number for a regression head; CoNLL sentences' tags are O / B-TYPE / I-TYPE."""
    if not examples:
        return
    first = examples[0]
    if hasattr(first, "tags"):
        _check_tags(path, examples)
    elif hasattr(first, "label"):
        if labels is not None and labels.problem_type == "regression":
            _check_numbers(path, examples)
        elif labels is not None and labels.values is not None:
            _check_values(path, examples, [str(v) for v in labels.values], whose)


def _check_values(path: str, examples: list, values: list[str], whose: str) -> None:
    known = set(values)
    for i, e in enumerate(examples):
        label = e.label
        if label in known:
            continue
        if label is not None and label.isdigit() and int(label) < len(values):  # an index into the labels
            continue
        where = _tsv_line(path, len(examples), i)
        hint = _one_column_hint(e)
        if label is None or label == "":
            raise ConfigError(f"{where}: no label (the label column is empty){hint}")
        raise ConfigError(f"{where}: label {_short(label)} is not one of {whose} {values}{hint}")


def _check_numbers(path: str, examples: list) -> None:
    for i, e in enumerate(examples):
        try:
            float(e.label)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{_tsv_line(path, len(examples), i)}: label {_short(e.label)} is not a number (--regression)"
                f"{_one_column_hint(e)}"
            ) from None


def _check_tags(path: str, examples: list) -> None:
    for i, sentence in enumerate(examples):
        for tag in sentence.tags:
            if not IOB_TAG.fullmatch(tag):
                where = _conll_line(path, tag) or f"{path}: sentence {i + 1}"
                raise ConfigError(
                    f"{where}: tag {_short(tag)} is not O, B-TYPE or I-TYPE "
                    "(is this a CoNLL file, one 'token ... tag' per line?)"
                )


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _one_column_hint(example) -> str:
    """A row of one column: its text is read as its label too (the default label column is the last)."""
    if getattr(example, "pair", None) is None and example.text == example.label:
        return " (the row has one column: is this a TSV of text and label?)"
    return ""


def _tsv_line(path: str, n_examples: int, index: int) -> str:
    """`path:LINE` of the index-th example a TSV reader returned (it skips blank lines and a header row), or
    `path: row N` when the file cannot be re-read that way."""
    try:
        from bert.tasks.common import open_text

        with open_text(path) as f:
            lines = [n for n, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1) if row]
        skipped = len(lines) - n_examples  # 1: a header row
        if 0 <= skipped <= 1 and index + skipped < len(lines):
            return f"{path}:{lines[index + skipped]}"
    except (OSError, ValueError, csv.Error):
        pass
    return f"{path}: row {index + 1}"


def _conll_line(path: str, tag: str) -> str | None:
    """`path:LINE` of the first line whose last column is `tag`."""
    try:
        from bert.tasks.common import open_text

        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) >= 2 and parts[-1] == tag:
                    return f"{path}:{n}"
    except (OSError, ValueError):
        pass
    return None
