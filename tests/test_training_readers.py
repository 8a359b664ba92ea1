"""Dataset readers: GLUE TSV (header, BOM, pairs), CoNLL (IOB1 -> IOB2, -DOCSTART-), SQuAD (.gz parts)."""

from __future__ import annotations

import gzip
import json

import pytest

from bert.tasks.classify import read_tsv
from bert.tasks.common import DataError
from bert.tasks.ner import detect_scheme, iob1_to_iob2, read_conll
from bert.tasks.qa import read_squad, read_squad_articles, split_heldout


def test_tsv_header_detected_and_bom_stripped(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_bytes('\ufeffsentence\tlabel\r\na fine film \t1\r\nawful "quoted\t0\r\n'.encode("utf-8"))
    rows = read_tsv(path)
    assert [(r.text, r.pair, r.label) for r in rows] == [("a fine film", None, "1"), ('awful "quoted', None, "0")]


def test_tsv_without_header_and_pairs_by_name_and_index(tmp_path):
    path = tmp_path / "plain.tsv"
    path.write_text("first text\t1\nsecond\t0\n")
    assert [r.label for r in read_tsv(path)] == ["1", "0"]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("index\tsentence1\tsentence2\tlabel\n0\tA man .\tA person .\tentailment\n")
    row = read_tsv(pairs, text_column="sentence1", pair_column="sentence2", label_column="label")[0]
    assert (row.text, row.pair, row.label) == ("A man .", "A person .", "entailment")
    row = read_tsv(pairs, text_column=1, pair_column=2, label_column=3, header=True)[0]
    assert row.pair == "A person ."
    with pytest.raises(DataError):
        read_tsv(pairs, text_column="nope")


def test_iob1_to_iob2():
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "O",
        "B-LOC",
        "B-LOC",
        "I-LOC",
        "B-ORG",
    ]
    assert detect_scheme([["B-PER", "I-PER"]]) == "iob2"
    assert detect_scheme([["O", "I-PER"]]) == "iob1"


def test_conll_docstart_and_iob1_conversion(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(
        "-DOCSTART- -X- -X- O\n\n"
        "EU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n\n"
        "-DOCSTART- -X- -X- O\n\n"
        "Paris NNP I-NP I-LOC\nLondon NNP I-NP B-LOC\n"
    )
    sentences = read_conll(path)
    assert len(sentences) == 3
    assert sentences[0].words == ["EU", "rejects", "German"]
    assert sentences[0].tags == ["B-ORG", "O", "B-MISC"]
    assert sentences[1].tags == ["B-PER", "I-PER"]
    assert sentences[2].tags == ["B-LOC", "B-LOC"]
    assert [s.document for s in sentences] == [0, 0, 1]
    assert read_conll(path, scheme="iob2")[0].tags == ["I-ORG", "O", "I-MISC"]  # taken as given


def _squad(titles):
    return {
        "version": "1.1",
        "data": [
            {
                "title": t,
                "paragraphs": [
                    {
                        "context": f"{t} is a place.",
                        "qas": [
                            {
                                "id": f"{t}-q",
                                "question": f"What is {t}?",
                                "answers": [{"text": "a place", "answer_start": len(t) + 4}],
                            }
                        ],
                    }
                ],
            }
            for t in titles
        ],
    }


def test_squad_plain_gz_and_parts(tmp_path):
    (tmp_path / "part-01.json").write_text(json.dumps(_squad(["Alpha", "Beta"])))
    with gzip.open(tmp_path / "part-02.json.gz", "wt", encoding="utf-8") as f:
        json.dump(_squad(["Gamma"]), f)
    with gzip.open(tmp_path / "ids.json.gz", "wt") as f:  # a side file in the directory is skipped
        json.dump(["recon-1"], f)
    examples = read_squad(f"{tmp_path / 'part-01.json'},{tmp_path / 'part-02.json.gz'}")
    assert [e.id for e in examples] == ["Alpha-q", "Beta-q", "Gamma-q"]
    assert examples[2].context[examples[2].answers[0]["answer_start"] :].startswith("a place")
    assert [e.id for e in read_squad(tmp_path)] == ["Alpha-q", "Beta-q", "Gamma-q"]
    with pytest.raises(DataError):
        read_squad(tmp_path / "ids.json.gz")


def test_squad_heldout_split_is_the_last_articles(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_squad(["A", "B", "C", "D"])))
    train, heldout = split_heldout(read_squad_articles(tmp_path / "a.json"), 1)
    assert [a["title"] for a in train] == ["A", "B", "C"] and [a["title"] for a in heldout] == ["D"]


def test_real_conll_and_sst2_counts(data_dir):
    sentences = read_conll(data_dir / "conll2003" / "valid.txt")
    assert len(sentences) == 3250 and sum(len(s.words) for s in sentences) == 51362
    assert len(read_tsv(data_dir / "SST-2" / "dev.tsv")) == 872
