"""WikiText raw -> BERT corpus format (one sentence per line, blank line between articles).

    python -m training.data.wikitext wiki.test.raw corpus.txt

Articles start at top-level headings (" = Title = "); sub-headings are dropped; paragraphs are
split into sentences after " . ", " ? " or " ! " (WikiText's tokenised text spaces punctuation).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from bert.tasks.common import open_text

TITLE = re.compile(r"^ ?= [^=].* = ?$")
HEADING = re.compile(r"^ ?=( =)+ .* =( =)+ ?$")
SENTENCE_END = re.compile(r"(?<= [.?!]) (?=[^ ])")


def wikitext_to_corpus(source, target) -> dict:
    """Write `target` from WikiText `source`: aside first, renamed into place once whole (a killed run leaves no
    corpus that looks complete)."""
    import os

    articles = sentences = 0
    target = Path(target)
    partial = target.with_name(target.name + ".partial")
    with open_text(source) as f, open(partial, "w", encoding="utf-8", newline="\n") as out:
        started = False
        for line in f:
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if TITLE.match(line):
                if started:
                    out.write("\n")
                started = True
                articles += 1
                continue
            if HEADING.match(line):
                continue
            started = True
            for sentence in SENTENCE_END.split(line.strip()):
                if sentence.strip():
                    out.write(sentence.strip() + "\n")
                    sentences += 1
    os.replace(partial, target)
    return {"articles": articles, "sentences": sentences}


def main(argv: list[str]) -> int:
    from bert.options import fail
    from training.data_checks import undecodable_line

    if len(argv) != 2:
        fail("usage: python -m training.data.wikitext RAW_FILE OUT_CORPUS")
    if problem := undecodable_line(argv[0]):  # before the corpus is begun: one line, not a traceback halfway
        fail(problem)
    print(wikitext_to_corpus(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    from bert.errors import run_cli

    sys.exit(run_cli(main, sys.argv[1:]))
