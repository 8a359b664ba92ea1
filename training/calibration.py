"""The text a trained checkpoint holds for its export: calibration.jsonl (bert.checkpoint.CALIBRATION_FILE), up to
256 of the run's evaluation inputs (text only, never a label), which `python -m export.onnx` measures int8 on beside
its built-in samples when no --calibration is given (docs/export.md, "A checkpoint's own calibration text").

The built-in samples are general English; a fine-tuned model is sure of its own domain's text and unsure of the rest,
so on them int8's changes look larger against the model's margins than they are on the inputs it will serve, and the
default export keeps groups fp32 that its users' text did not need. The evaluation inputs are that domain's text, and
training does not learn from them (`--eval-data`, or the part a task holds out). Inputs are written as the model saw
them (decoded from the encoded features; pre-split words joined by spaces): one text a line, a pair as [text,
text_pair], and a text paired with several others (a rerank query with its candidates) also as {"query", "texts"}.
"""

from __future__ import annotations

import json

LIMIT = 256  # inputs written: export measures every int8 trial graph on each (at most 512 of a kind are read)
GROUP_MAX = 64  # texts of one query (export/sensitivity.py RANKED_GROUP_MAX)


def _spread(items: list, limit: int) -> list:
    """At most `limit` items taken evenly over the list (an evaluation file is often sorted by something)."""
    if len(items) <= limit:
        return list(items)
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def segments(tokenizer, ids: list[int]) -> list[str]:
    """A feature's texts: its ids split at the separator, special tokens dropped, each part decoded."""
    special = {tokenizer.cls_token_id, tokenizer.pad_token_id}
    parts: list[list[int]] = [[]]
    for i in ids:
        if i == tokenizer.sep_token_id:
            parts.append([])
        elif i not in special:
            parts[-1].append(i)
    texts = (tokenizer.backend.decode(part).strip() for part in parts if part)
    return [t for t in texts if t]


def calibration_lines(tokenizer, features: list, limit: int = LIMIT) -> list[str]:
    """JSON lines (export/samples.py read_calibration's format) of the features' inputs, each at most once: at most
    `limit` texts and pairs, spread over them, and ranked groups of at most `limit` texts in all."""
    lines: dict[str, None] = {}
    pairs: dict[str, list[str]] = {}
    for feature in features:
        texts = segments(tokenizer, list(feature.input_ids))
        if len(texts) == 1:
            lines[json.dumps(texts[0], ensure_ascii=False)] = None
        elif len(texts) == 2:
            lines[json.dumps(texts, ensure_ascii=False)] = None
            pairs.setdefault(texts[0], [])
            if texts[1] not in pairs[texts[0]]:
                pairs[texts[0]].append(texts[1])
    singles_and_pairs = _spread(list(lines), limit)
    ranked = [(q, t[:GROUP_MAX]) for q, t in pairs.items() if len(t) > 1]
    fit = max(1, limit * len(ranked) // max(1, sum(len(t) for _, t in ranked)))  # groups of the mean size in `limit`
    groups, texts_in_groups = [], 0  # a group costs export one sequence a text: `limit` texts in all
    for query, texts in _spread(ranked, fit):
        if groups and texts_in_groups + len(texts) > limit:
            break
        groups.append(json.dumps({"query": query, "texts": texts}, ensure_ascii=False))
        texts_in_groups += len(texts)
    return singles_and_pairs + groups


def calibration_file(tokenizer, task, examples: list, labels, cfg, limit: int = LIMIT) -> str | None:
    """calibration.jsonl's text for one task's evaluation examples (None when there are none): the examples
    encoded as training encodes them, then decoded back to text."""
    if not examples:
        return None
    picked = _spread(examples, limit)
    if all(isinstance(getattr(e, "words", None), list) for e in picked):
        # pre-split words (token tagging): the text itself; a byte-level BPE decodes words encoded one by one
        # without the spaces between them
        lines = list(dict.fromkeys(json.dumps(" ".join(e.words), ensure_ascii=False) for e in picked))
    else:
        features, _ = task.encode_train(tokenizer, picked, labels, cfg)
        lines = calibration_lines(tokenizer, features, limit)
    return "".join(line + "\n" for line in lines) or None


def merged(files: list[str | None], limit: int = LIMIT) -> str | None:
    """Several tasks' calibration text as one file (a multi-task run): each task's share of the limit."""
    parts = [f.splitlines() for f in files if f]
    if not parts:
        return None
    share = max(1, limit // len(parts))
    return "".join(line + "\n" for lines in parts for line in _spread(lines, share))
