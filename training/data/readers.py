"""Readers for labelled datasets: GLUE-style TSV, CoNLL (IOB1/IOB2), SQuAD v1.1/v2.0 JSON.

Each returns plain Python records; tokenisation happens elsewhere (training.task_data).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PathLike = str | os.PathLike


class DataError(ValueError):
    """A data file that cannot be read as the format it claims to be."""


def open_text(path: PathLike):
    """Open a text file, gzip or not, decoding UTF-8 with or without a BOM; newlines normalised."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=None)
    return open(path, encoding="utf-8-sig", newline=None)


# ----------------------------------------------------------------------------- TSV (GLUE style)


@dataclass
class TextExample:
    text: str
    pair: str | None
    label: str | None  # as written in the file (class name, integer, or a float for regression)


def _column(header: list[str] | None, spec: str | int | None) -> int | None:
    """A column given by index (int or digit string) or by header name."""
    if spec is None:
        return None
    if isinstance(spec, int) or str(spec).lstrip("-").isdigit():
        return int(spec)
    if header is None:
        raise DataError(f"column {spec!r} is named but the file has no header row")
    if spec not in header:
        raise DataError(f"no column {spec!r} in header {header}")
    return header.index(spec)


def _looks_like_header(row: list[str], label_index: int | None) -> bool:
    """GLUE headers name their columns; data rows have a label that is a number or a short class name.
    A row whose label cell is a known header word (label, gold_label, score, ...) is a header."""
    if label_index is None or label_index >= len(row) or label_index < -len(row):
        return False
    cell = row[label_index].strip().lower()
    return cell in {"label", "labels", "gold_label", "score", "class", "target", "sentiment", "quality"}


def read_tsv(
    path: PathLike,
    *,
    text_column: str | int = 0,
    pair_column: str | int | None = None,
    label_column: str | int | None = -1,
    header: bool | None = None,
    delimiter: str = "\t",
) -> list[TextExample]:
    """Rows of a GLUE-style TSV. Columns by index or header name; `header=None` detects it.

    BOM and CRLF are tolerated; quoting is off (GLUE files contain bare quotes).
    """
    with open_text(path) as f:
        rows = [row for row in csv.reader(f, delimiter=delimiter, quoting=csv.QUOTE_NONE) if row]
    if not rows:
        return []
    first = rows[0]
    names = [c.strip() for c in first]
    named = any(
        isinstance(c, str) and not str(c).lstrip("-").isdigit()
        for c in (text_column, pair_column, label_column)
        if c is not None
    )
    if header is None:
        label_guess = (
            names.index(label_column)
            if isinstance(label_column, str) and label_column in names
            else (int(label_column) if label_column is not None and str(label_column).lstrip("-").isdigit() else None)
        )
        header = named or _looks_like_header(first, label_guess)
    head = names if header else None
    body = rows[1:] if header else rows
    t, p, lab = _column(head, text_column), _column(head, pair_column), _column(head, label_column)
    examples = []
    for line_no, row in enumerate(body, 2 if header else 1):
        try:
            examples.append(
                TextExample(
                    text=row[t].strip(),
                    pair=row[p].strip() if p is not None else None,
                    label=row[lab].strip() if lab is not None else None,
                )
            )
        except IndexError:
            raise DataError(f"{path}:{line_no}: row has {len(row)} columns, fewer than the columns asked for") from None
    return examples


# ----------------------------------------------------------------------------- CoNLL


@dataclass
class TaggedSentence:
    words: list[str]
    tags: list[str]  # IOB2
    document: int = 0  # index of the -DOCSTART- document it came from


def _split_tag(tag: str) -> tuple[str, str | None]:
    if tag == "O" or "-" not in tag:
        return "O", None
    prefix, kind = tag.split("-", 1)
    return prefix, kind


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between two adjacent entities of one type) -> IOB2 (B- starts every entity)."""
    out = []
    previous_kind = None
    for tag in tags:
        prefix, kind = _split_tag(tag)
        if prefix == "I" and previous_kind != kind:
            tag = f"B-{kind}"
        out.append(tag)
        previous_kind = kind
    return out


def detect_scheme(sentences: Iterable[Sequence[str]]) -> str:
    """'iob1' if some entity starts with I- (no B-/I- of its type before it), else 'iob2'."""
    for tags in sentences:
        previous_kind = None
        for tag in tags:
            prefix, kind = _split_tag(tag)
            if prefix == "I" and previous_kind != kind:
                return "iob1"
            previous_kind = kind
    return "iob2"


def read_conll(path: PathLike, *, tag_column: int = -1, scheme: str = "auto") -> list[TaggedSentence]:
    """Sentences of a CoNLL file (token ... tag per line, blank line between sentences, -DOCSTART- between
    documents). Tags come back in IOB2; `scheme` is 'iob1', 'iob2' or 'auto' (detected over the file)."""
    if scheme not in ("auto", "iob1", "iob2"):
        raise DataError(f"scheme must be auto, iob1 or iob2, got {scheme!r}")
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    document = 0

    def flush():
        nonlocal words, tags
        if words:
            sentences.append(TaggedSentence(words, tags, document))
        words, tags = [], []

    with open_text(path) as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                flush()
                continue
            parts = line.split()
            if parts[0] == "-DOCSTART-":
                flush()
                document += 1 if sentences or document else 0
                continue
            if len(parts) < 2:
                raise DataError(f"{path}:{line_no}: expected 'token ... tag', got {line!r}")
            words.append(parts[0])
            tags.append(parts[tag_column])
        flush()
    if scheme == "auto":
        scheme = detect_scheme(s.tags for s in sentences)
    if scheme == "iob1":
        for s in sentences:
            s.tags = iob1_to_iob2(s.tags)
    return sentences


# ----------------------------------------------------------------------------- SQuAD


@dataclass
class QAExample:
    id: str
    title: str
    question: str
    context: str
    answers: list[dict] = field(default_factory=list)  # [{"text", "answer_start"}]; empty = no answer (v2.0)
    is_impossible: bool = False


def expand_paths(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """A path, a comma-separated list, a list, or a directory (all *.json / *.json.gz in it, sorted)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [p for p in str(paths).split(",") if p]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(list(p.glob("*.json")) + list(p.glob("*.json.gz"))))
        else:
            out.append(p)
    return out


def read_squad_articles(paths: PathLike | Sequence[PathLike]) -> list[dict]:
    """The `data` articles of one or several SQuAD files (plain or .gz), in file order."""
    articles = []
    given = {str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)}
    for path in expand_paths(paths):
        with open_text(path) as f:
            try:
                blob = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} is not SQuAD JSON: {e}") from None
        if not isinstance(blob, dict) or "data" not in blob:
            if str(path) not in given and not any(str(path) in g.split(",") for g in given):
                continue  # found by listing a directory (e.g. a side file of ids): not a SQuAD file, skip
            raise DataError(f"{path} has no 'data' list; not a SQuAD file")
        articles.extend(blob["data"])
    return articles


def squad_examples(articles: Iterable[dict]) -> list[QAExample]:
    examples = []
    for article in articles:
        title = article.get("title", "")
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                examples.append(
                    QAExample(
                        id=qa["id"],
                        title=title,
                        question=qa["question"],
                        context=context,
                        answers=list(qa.get("answers", [])),
                        is_impossible=bool(qa.get("is_impossible", False)),
                    )
                )
    return examples


def read_squad(paths: PathLike | Sequence[PathLike]) -> list[QAExample]:
    return squad_examples(read_squad_articles(paths))


def split_heldout(articles: list[dict], heldout_articles: int) -> tuple[list[dict], list[dict]]:
    """Deterministic train/held-out split of SQuAD train articles: the last N articles (in file order,
    i.e. the end of part-04) are held out. Never train on them; `--heldout-articles` picks N."""
    if heldout_articles <= 0:
        return articles, []
    if heldout_articles >= len(articles):
        raise DataError(f"cannot hold out {heldout_articles} of {len(articles)} articles")
    return articles[:-heldout_articles], articles[-heldout_articles:]
