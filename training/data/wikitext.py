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
    articles = sentences = 0
    with open_text(source) as f, open(target, "w", encoding="utf-8", newline="\n") as out:
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
    return {"articles": articles, "sentences": sentences}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m training.data.wikitext RAW_FILE OUT_CORPUS")
    print(wikitext_to_corpus(Path(sys.argv[1]), Path(sys.argv[2])))
