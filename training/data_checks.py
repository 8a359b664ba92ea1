"""Checks of the examples a task's reader returned, before any model is built or run: data that cannot be trained
or evaluated on is one line naming the file (and the line, where the reader keeps one), raised as ConfigError
(training.config.run: `error: ...`, exit 2), not a traceback after minutes of work.

The checks go by what the examples hold (a `label` as written in a TSV, CoNLL `tags`, SQuAD `answers`, rerank
candidates' `labels`), so the CLIs still never name a task: empty data, labels the head does not know, values a
regression head cannot read, tags that are not IOB, rows a TSV reader split otherwise than the file's first line.
Reading itself goes through `read_examples`, which turns what a reader raises on a file it cannot read (bytes that
are not UTF-8, a JSON file of another structure) into one line naming the file and the place in it.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from collections import Counter
from pathlib import Path

from bert.errors import json_fields, json_type, one_line
from bert.tasks.classify import tsv_line
from training.config import ConfigError

IOB_TAG = re.compile(r"(O|[BI]-\S+)")
OTHER_SCHEME_TAG = re.compile(r"[SELU]-\S+")  # BIOES / BILOU single, end, last and unit tags
CSV_FIELD_LIMIT = 2**31 - 1  # a TSV field may be as long as its line (csv's default stops at 128 KiB)


# ----------------------------------------------------------------------------- reading


def read_examples(task, cfg, *, train: bool = True) -> tuple[list, list]:
    """`task.read_examples(cfg, train=train)`, with what a reader raises on a file it cannot read as one line
    naming the file: bytes that are not UTF-8 (a Latin-1 or UTF-16 export, a Parquet file) with the line they are
    on; a .gz file that is not gzip or is cut short; a JSON file whose structure is not the format's (the reader's
    KeyError or TypeError) with the place in it; a reader's message that names no file, with the file it is
    about. A TSV field may be as long as its line (csv's default cap of 128 KiB would refuse a long document)."""
    from bert.tasks.common import DataError

    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    try:
        return task.read_examples(cfg, train=train)
    except UnicodeDecodeError as e:
        for path in _files(cfg.train_data, cfg.eval_data):
            if problem := undecodable_line(path):
                raise ConfigError(problem) from None
        raise ConfigError(f"{_given(cfg)}: not UTF-8 text ({one_line(e, 200)})") from None
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        path = _failing_file(task, cfg, e)
        for file in _files(path or ""):
            if problem := squad_problem(file):
                raise ConfigError(f"{file}: {problem}") from None
        what = task.train_data_help or "the task's format"
        raise ConfigError(
            f"{path or _given(cfg)}: cannot be read as {what} ({type(e).__name__}: {one_line(e, 200)})"
        ) from None
    except (OSError, EOFError) as e:  # a .gz that is not gzip, or cut short: gzip names no file
        if getattr(e, "filename", None):
            raise
        for path in _files(cfg.train_data, cfg.eval_data):
            if problem := broken_gzip(path):
                raise ConfigError(problem) from None
        raise
    except DataError as e:
        specs = [spec for spec in (cfg.train_data, cfg.eval_data) if spec]
        if any(name in str(e) for name in [*specs, *map(str, _files(*specs))]):
            raise
        raise DataError(f"{_failing_file(task, cfg, e) or _given(cfg)}: {e}") from None


def _given(cfg) -> str:
    return " and ".join(spec for spec in dict.fromkeys((cfg.train_data, cfg.eval_data)) if spec)


def _failing_file(task, cfg, error: Exception) -> str | None:
    """Which of cfg's data files the reader fails on the way it did (the same error, the same message): each read
    alone, as evaluation data; None when neither does alone."""
    for spec in dict.fromkeys((cfg.train_data, cfg.eval_data)):
        if not spec:
            continue
        alone = {"eval_data": spec, "heldout_articles": 0}
        try:
            task.read_examples(
                dataclasses.replace(cfg, **{k: v for k, v in alone.items() if hasattr(cfg, k)}), train=False
            )
        except Exception as e:  # noqa: BLE001 - whatever it raises is compared with the error being explained
            if type(e) is type(error) and str(e) == str(error):
                return spec
    return None


def _files(*specs: str) -> list[Path]:
    """The files data options name: a file, a directory's *.json / *.json.gz, comma-separated parts; a
    `scheme:PATH` spec (rerank's `squad:`) by its path."""
    from bert.tasks.qa import expand_paths

    out: list[Path] = []
    for spec in dict.fromkeys(s for s in specs if s):
        if not Path(spec).exists() and re.match(r"[a-z]+:", spec):
            spec = spec.split(":", 1)[1]
        found = [Path(spec)] if Path(spec).is_file() else expand_paths(spec)
        out += [p for p in found if p.is_file() and p not in out]
    return out


def broken_gzip(path) -> str | None:
    """`path: ...` for a .gz file that does not decompress whole; None for any other file."""
    import gzip
    import zlib

    if not str(path).endswith(".gz"):
        return None
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as e:
        return f"{path}: not a whole gzip file ({one_line(e, 200)})"
    return None


def undecodable_line(path) -> str | None:
    """`path:LINE: ...` where a text file stops being UTF-8 (a UTF-8 byte-order mark is fine), `path: ...` for a
    UTF-16 or Parquet file; None when the whole file is UTF-8 text."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        start = f.read(4)
        if start.startswith((b"\xff\xfe", b"\xfe\xff")):
            return f"{path}: UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8"
        if start == b"PAR1":
            return f"{path}: a Parquet file; this command reads text (TSV, CoNLL, SQuAD JSON): export it as one"
        f.seek(0)
        for n, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return (
                    f"{path}:{n}: not UTF-8 text (byte 0x{line[e.start]:02x} at byte {e.start + 1} of the line); "
                    "save it as UTF-8"
                )
    return None


def squad_problem(path) -> str | None:
    """Where a SQuAD JSON file's structure is not SQuAD's (`data[i].paragraphs[j].qas[k]` and what is wrong
    there); None for a file that is not JSON with a `data` key, or one whose structure is fine."""
    from bert.tasks.common import open_text

    try:
        with open_text(path) as f:
            blob = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(blob, dict) or "data" not in blob:
        return None
    if not isinstance(blob["data"], list):
        return f"'data' is a JSON {json_type(blob['data'])}, not an array of articles"
    for i, article in enumerate(blob["data"]):
        at = f"data[{i}]"
        if problem := json_fields(article, at, {"paragraphs": list}):
            return problem
        for j, paragraph in enumerate(article["paragraphs"]):
            at_paragraph = f"{at}.paragraphs[{j}]"
            if problem := json_fields(paragraph, at_paragraph, {"context": str, "qas": list}):
                return problem
            for k, qa in enumerate(paragraph["qas"]):
                at_qa = f"{at_paragraph}.qas[{k}]"
                if problem := json_fields(qa, at_qa, {"id": (str, int), "question": str}):
                    return problem
                if not isinstance(qa.get("answers", []), list):
                    return (
                        f"{at_qa}.answers is a JSON {json_type(qa['answers'])}, not an array of "
                        "{'text', 'answer_start'} objects"
                    )
    return None


# ----------------------------------------------------------------------------- what was read


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
    come from), or a number for a regression head; CoNLL sentences' tags are O / B-TYPE / I-TYPE, and with
    `labels`, ones the head predicts."""
    if not examples:
        return
    first = examples[0]
    if hasattr(first, "tags"):
        _check_tags(path, examples)
        if labels is not None and labels.values is not None:
            _check_known_tags(path, examples, [str(v) for v in labels.values], whose)
    elif hasattr(first, "label"):
        if labels is not None and labels.problem_type == "regression":
            _check_numbers(path, examples)
        elif labels is not None and labels.values is not None:
            _check_values(path, examples, [str(v) for v in labels.values], whose)


def check_tag_types(train_path: str, train: list, eval_path: str, evaluation: list) -> None:
    """Evaluation tags of an entity type the training sentences never show: the head (O and B-/I- of the training
    data's types) has no label for them. Refused naming the evaluation file's line, before the labels are made."""
    if not train or not hasattr(train[0], "tags"):
        return
    kinds = {tag[2:] for sentence in train for tag in sentence.tags if tag != "O"}
    for i, sentence in enumerate(evaluation):
        for tag in sentence.tags:
            if tag != "O" and tag[2:] not in kinds:
                where = _conll_line(eval_path, kind=tag[2:]) or f"{eval_path}: sentence {i + 1}"
                raise ConfigError(
                    f"{where}: tag {_short(tag)}: no {tag[2:]} entity in the training data {train_path}, so the "
                    "head has no label for it"
                )


def _check_values(path: str, examples: list, values: list[str], whose: str) -> None:
    known = set(values)
    # A number is read as an index into the labels (a checkpoint's id2label names them: 0 for NEGATIVE) only
    # when the labels are not numbers themselves: among labels 1, 2, 3 a 0 is no label, not the first one.
    numbered = all(_is_integer(v) for v in values)
    for i, e in enumerate(examples):
        label = e.label
        if label in known:
            continue
        if label is not None and label.isdigit() and int(label) < len(values) and not numbered:
            continue
        where = tsv_line(path, len(examples), i)
        hint = _one_column_hint(e)
        if label is None or label == "":
            raise ConfigError(f"{where}: no label (the label column is empty){hint}")
        raise ConfigError(f"{where}: label {_short(label)} is not one of {whose} {values}{hint}")


def _check_numbers(path: str, examples: list) -> None:
    for i, e in enumerate(examples):
        try:
            value = float(e.label)
        except (TypeError, ValueError):
            value = None
        if value is None or not math.isfinite(value):
            raise ConfigError(
                f"{tsv_line(path, len(examples), i)}: label {_short(e.label)} is not a finite number (--regression)"
                f"{_one_column_hint(e)}"
            ) from None


def _check_tags(path: str, examples: list) -> None:
    for i, sentence in enumerate(examples):
        for tag in sentence.tags:
            if not IOB_TAG.fullmatch(tag):
                where = _conll_line(path, tag) or f"{path}: sentence {i + 1}"
                hint = (
                    "BIOES / BILOU tags are not read: convert them to IOB2 (S- and U- to B-, E- and L- to I-)"
                    if OTHER_SCHEME_TAG.fullmatch(tag)
                    else "is this a CoNLL file, one 'token ... tag' per line?"
                )
                raise ConfigError(f"{where}: tag {_short(tag)} is not O, B-TYPE or I-TYPE ({hint})")


def _check_known_tags(path: str, examples: list, values: list[str], whose: str) -> None:
    known = set(values)
    for i, sentence in enumerate(examples):
        for tag in sentence.tags:
            if tag not in known:
                where = _conll_line(path, kind=tag[2:]) if tag != "O" else None
                raise ConfigError(
                    f"{where or f'{path}: sentence {i + 1}'}: tag {_short(tag)} is not one of {whose} {values}"
                )


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _is_integer(value) -> bool:
    return isinstance(value, str) and value.lstrip("-").isdigit()


def _is_number(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _one_column_hint(example) -> str:
    """A row of one column: its text is read as its label too (the default label column is the last)."""
    if getattr(example, "pair", None) is None and example.text == example.label:
        return " (the row has one column: is this a TSV of text and label?)"
    return ""


def _tsv_rows(path: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of each non-blank line, split as the TSV reader splits it (at tabs and line ends;
    quotes are text)."""
    from bert.tasks.common import open_text

    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    with open_text(path) as f:
        return [(n, row) for n, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1) if row]


def _conll_line(path: str, tag: str | None = None, *, kind: str | None = None) -> str | None:
    """`path:LINE` of the first line whose last column is `tag` (or a B-/I- tag of entity type `kind`)."""
    try:
        from bert.tasks.common import open_text

        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) < 2 or parts[0] == "-DOCSTART-":
                    continue
                last = parts[-1]
                if last == tag or (kind is not None and last[:2] in ("B-", "I-") and last[2:] == kind):
                    return f"{path}:{n}"
    except (OSError, ValueError):
        pass
    return None


# ----------------------------------------------------------------------------- rows the reader passed on


def check_examples(path: str, examples: list, cfg, role: str) -> None:
    """What a reader passes on that a run cannot use as it means, refused in one line before any encoding: TSV
    rows split otherwise than the file's first line (a tab or a line break inside a text), a file of one column
    (a CSV or JSON Lines file read as TSV: each text its own label), a header named twice or not recognised as one,
    an empty label or one in quotes (read as text); SQuAD answers that are not {'text', 'answer_start'} objects,
    texts that are not strings, a question id twice among evaluation questions (one answer per id is scored);
    rerank labels that are not finite. `role`: training or evaluation."""
    if not examples:
        return
    first = examples[0]
    if hasattr(first, "answers"):
        _check_answers(path, examples, role)
    elif hasattr(first, "texts") and hasattr(first, "labels"):
        if Path(path).is_file():
            _check_tsv_layout(path, cfg, _tsv_rows(path))
        _check_graded(path, examples, cfg)
    elif hasattr(first, "label") and Path(path).is_file():
        _check_text_rows(path, examples, cfg, role)


def _column_index(spec, header: list[str], width: int) -> int | None:
    """A TSV column given by index or header name, as an index in [0, width); None when not given or absent."""
    if spec in (None, ""):
        return None
    text = str(spec)
    if text.lstrip("-").isdigit():
        index = int(text)
        index = index + width if index < 0 else index
        return index if 0 <= index < width else None
    return header.index(text) if text in header else None


def _check_tsv_layout(path: str, cfg, rows: list) -> None:
    """The same number of columns on every line, and a column named once."""
    if not rows:
        return
    first_line, first = rows[0]
    header = [cell.strip() for cell in first]
    for name in ("text_column", "pair_column", "label_column"):
        spec = str(getattr(cfg, name, "") or "")
        if spec and not spec.lstrip("-").isdigit() and header.count(spec) > 1:
            raise ConfigError(
                f"{path}:{first_line}: the header names {header.count(spec)} columns {spec!r}; give "
                f"{_flag(cfg, name)} the index of the one meant (0 is the first)"
            )
    for line, cells in rows[1:]:
        if len(cells) != len(first):
            raise ConfigError(
                f"{path}:{line}: {len(cells)} column{'s' if len(cells) != 1 else ''} where line {first_line} has "
                f"{len(first)} (rows are split at every tab and line end, quotes included: a tab or a line break "
                "inside a text breaks its row)"
            )


def _flag(cfg, name: str) -> str:
    from bert.options import flag

    return flag(cfg, name)


def _check_text_rows(path: str, examples: list, cfg, role: str) -> None:
    rows = _tsv_rows(path)
    _check_tsv_layout(path, cfg, rows)
    if not rows:
        return
    first_line, first = rows[0]
    header = [cell.strip() for cell in first]
    width = len(first)
    text = _column_index(getattr(cfg, "text_column", "0"), header, width)
    label = _column_index(getattr(cfg, "label_column", "-1"), header, width)
    if text is not None and text == label:
        if width > 1:
            raise ConfigError(
                f"{path}: {_flag(cfg, 'text_column')} and {_flag(cfg, 'label_column')} name the same column"
            )
        cell = first[0].lstrip()
        looks = (
            "; it looks like JSON Lines, which is not read"
            if cell.startswith(("{", "["))
            else "; it looks comma-separated, and CSV is not read"
            if "," in cell
            else ""
        )
        raise ConfigError(
            f"{path}: one column on every line (no tab), so each text would be its own label: give a "
            f"tab-separated file of text and label{looks}"
        )
    for i, e in enumerate(examples):
        if e.label is None or e.label == "":
            raise ConfigError(f"{tsv_line(path, len(examples), i)}: no label (the label column is empty)")
        if len(e.label) > 1 and e.label[0] == e.label[-1] == '"':
            raise ConfigError(
                f"{tsv_line(path, len(examples), i)}: label {_short(e.label)} is in quotes, which this reader keeps "
                "as text (GLUE files hold bare quotes): write the file without quoting"
            )
    if role == "training":
        _check_header_guess(path, examples, cfg, rows, text, label)


def _check_header_guess(path, examples, cfg, rows, text, label) -> None:
    """--header auto took the first line for data, yet its label is on no other line of the file while the others'
    labels repeat (or are numbers and it is not): a header the reader did not recognise, which would train as an
    example of a class of its own."""
    named = any(
        str(getattr(cfg, n, "") or "") and not str(getattr(cfg, n)).lstrip("-").isdigit()
        for n in ("text_column", "pair_column", "label_column")
    )
    if getattr(cfg, "header", "auto") != "auto" or named or getattr(cfg, "labels", None) or len(rows) < 3:
        return
    if getattr(cfg, "regression", False) or text is None or label is None:
        return
    first_line, first = rows[0]
    if (examples[0].text, examples[0].label) != (first[text].strip(), first[label].strip()):
        return  # the reader took the first line for a header
    counts = Counter(cells[label].strip() for _, cells in rows[1:])
    name = first[label].strip()
    if name in counts:
        return
    if min(counts.values()) >= 2 or (all(_is_number(v) for v in counts) and not _is_number(name)):
        raise ConfigError(
            f"{path}:{first_line}: label {_short(name)} is on this first line only: is it a header? "
            f"say {_flag(cfg, 'header')} yes (or {_flag(cfg, 'header')} no to train on it as data)"
        )


def _check_graded(path: str, examples: list, cfg) -> None:
    """Rerank candidates' labels: finite numbers (a NaN or an infinity would make every loss NaN)."""
    for query in examples:
        for value in query.labels:
            if not math.isfinite(value):
                where = _nonfinite_line(path, cfg) or f"{path}: query {_short(query.query)}"
                raise ConfigError(f"{where}: label {value} is not a finite number (0/1 or a grade)")


def _nonfinite_line(path: str, cfg) -> str | None:
    if not Path(path).is_file():
        return None
    rows = _tsv_rows(path)
    header = [cell.strip() for cell in rows[0][1]] if rows else []
    for line, cells in rows:
        index = _column_index(getattr(cfg, "label_column", "-1"), header, len(cells))
        if index is None:
            continue
        try:
            if not math.isfinite(float(cells[index])):
                return f"{path}:{line}"
        except ValueError:
            continue
    return None


def _check_answers(path: str, examples: list, role: str) -> None:
    """SQuAD questions as the reader returned them: an id, question and context that are strings; the answers a
    run reads ({'text', 'answer_start'} objects: training reads the first of an answerable question, evaluation
    every gold text); and, for evaluation, each id once (predictions and gold answers are keyed by it)."""
    seen: set = set()
    for e in examples:
        where = f"{path}: question {_short(e.id)}"
        if not isinstance(e.id, (str, int)) or isinstance(e.id, bool):
            raise ConfigError(f"{where}: its id is a JSON {json_type(e.id)}, not a string")
        for name in ("question", "context"):
            if not isinstance(getattr(e, name), str):
                raise ConfigError(f"{where}: its {name} is a JSON {json_type(getattr(e, name))}, not a string")
        used = e.answers if role == "evaluation" else ([] if e.is_impossible else e.answers[:1])
        for k, answer in enumerate(used):
            if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
                raise ConfigError(
                    f"{where}: answer {k + 1} is {_short(answer)}, not a {{'text', 'answer_start'}} object "
                    "(SQuAD's answers: a list of them)"
                )
            start = answer.get("answer_start")
            if role == "training" and (not isinstance(start, (int, float, str)) or isinstance(start, bool)):
                raise ConfigError(f"{where}: answer {k + 1} has answer_start {_short(start)}, not a character offset")
        if role == "evaluation":
            if e.id in seen:
                raise ConfigError(f"{where}: the id is given twice; each evaluation question is scored by its id")
            seen.add(e.id)
