"""Data files an engineer brings to the training commands (docs/training.md, "Validation"): each is either read as
its format's owners read it, or refused in one `error:` line naming the file and the line (or the place in it),
exit 2, before a model is built; never a traceback, never a row turned silently into something else.

Covered: bytes that are not UTF-8 (Latin-1, UTF-16, Parquet) in TSV, CoNLL, SQuAD and corpus files; TSV rows split by
a quoted line break or a tab inside a text, a CSV file, an empty label, a header named twice or not recognised,
labels in quotes, numeric labels that are no index, a column name the header lacks, non-finite regression and rerank
labels, fields longer than csv's default cap, .gz parts cut short; BIOES tags, evaluation tags of an unseen type (finetune) or unknown to the checkpoint (evaluate); SQuAD files of
another structure (a missing key, `data` an object, Hugging Face-style answers, a null question or answer_start),
evaluation answers without text, an id twice; pretraining shards whose build stopped halfway or whose corpus was
rewritten; the real data passes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_training_cli_errors import cli, no_model, one_error_line  # noqa: F401 - no_model: a fixture
from test_training_loop import assets, classify_args, pretrain_args  # noqa: F401 - assets: a fixture

from training import evaluate as evaluate_cli
from training import finetune, multitask, pretrain
from training.config import parse_config

GOOD_ROWS = "".join(f"{'good fun film' if i % 2 else 'bad dull plot'} {i}\t{i % 2}\n" for i in range(40))


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _swap(argv: list[str], flag: str, value) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = str(value)
    return argv


def _refused(main, argv, capsys, out: Path) -> str:
    """The one error line of a command refused with exit 2 before it wrote anything."""
    code, stdout, err = cli(main, argv, capsys)
    line = one_error_line(err)
    assert code == 2 and stdout == "", err
    assert not out.exists()
    return line


# ----------------------------------------------------------------------------- classify TSV (finetune)

CLASSIFY_CASES = {
    # name: (training file, evaluation file (None: the assets' dev.tsv), extra flags, expected part of the line)
    "latin-1": (b"sentence\tlabel\n" + GOOD_ROWS.encode() + b"caf\xe9 film\t1\n", None, [], "train.tsv:42: not UTF-8"),
    "utf-16": (None, "sentence\tlabel\ngood\t1\n".encode("utf-16"), [], "dev.tsv: UTF-16 text"),
    "parquet": (b"PAR1\x15\x04\x15\x80\x01\x15\x82\x01L\x15\x02\x00\x00\xff", None, [], "train.tsv: a Parquet file"),
    "quoted-newline": (
        "sentence\tlabel\n" + GOOD_ROWS + '"the plot\nwas fine"\t1\n',
        None,
        [],
        "train.tsv:42: 1 column where line 1 has 2",
    ),
    "tab-in-text": (None, "sentence\tlabel\ngood\tfun film\t1\nbad film\t0\n", [], "dev.tsv:2: 3 columns where"),
    "csv": ("sentence,label\n" + GOOD_ROWS.replace("\t", ","), None, [], "it looks comma-separated"),
    "empty-label": ("sentence\tlabel\n" + GOOD_ROWS + "good film\t\n", None, [], "train.tsv:42: no label"),
    "quoted-cells": (
        '"sentence"\t"label"\n'
        + "".join(f'"{text}"\t"{y}"\n' for text, y in (r.split("\t") for r in GOOD_ROWS.split("\n")[:-1])),
        None,
        [],
        """train.tsv:1: label '"label"' is in quotes, which this reader keeps as text""",
    ),
    "header-twice": (
        "sentence\tlabel\tlabel\n" + GOOD_ROWS.replace("\n", "\t0\n"),
        None,
        ["--label-column", "label"],
        "train.tsv:1: the header names 2 columns 'label'; give --label-column the index",
    ),
    "header-not-recognised": (
        "review\tpolarity\n" + GOOD_ROWS,
        None,
        [],
        "train.tsv:1: label 'polarity' is on this first line only: is it a header? say --header yes",
    ),
    "numbers-are-no-index": (
        "sentence\tlabel\n" + GOOD_ROWS.replace("\t0\n", "\t2\n"),
        "sentence\tlabel\ngood\t1\nbad\t0\n",
        [],
        "dev.tsv:3: label '0' is not one of the training data's labels ['1', '2']",
    ),
    "column-not-in-header": (
        None,
        "text\tlabel\ngood\t1\n",
        ["--text-column", "sentence"],
        "dev.tsv: no column 'sentence' in header ['text', 'label']",
    ),
    "regression-nan": (
        "sentence\tscore\n" + GOOD_ROWS + "odd film\tnan\n",
        None,
        ["--regression"],
        "train.tsv:42: label 'nan' is not a finite number (--regression)",
    ),
}


@pytest.mark.parametrize("case", list(CLASSIFY_CASES))
def test_classify_files_are_read_or_refused_in_one_line(assets, tmp_path, capsys, no_model, case):  # noqa: F811
    train, evaluation, flags, expected = CLASSIFY_CASES[case]
    out = tmp_path / "out"
    argv = classify_args(assets, out, "--max-steps", "2", *flags)
    if train is not None:
        argv = _swap(argv, "--train-data", _write(tmp_path / "train.tsv", train))
    if evaluation is not None:
        argv = _swap(argv, "--eval-data", _write(tmp_path / "dev.tsv", evaluation))
    assert expected in _refused(finetune.main, argv, capsys, out)


def test_a_tsv_field_longer_than_csvs_default_cap_is_read_whole(assets, tmp_path):  # noqa: F811
    """csv stops at 128 KiB per field (csv.Error, a traceback); pandas, which Hugging Face datasets reads CSV
    with, has no such cap. A long document is read, then truncated to --max-seq-length as any long text."""
    import csv

    csv.field_size_limit(131_072)  # csv's default, whatever an earlier test set
    long = " ".join(["good"] * 40_000)
    train = _write(tmp_path / "train.tsv", f"sentence\tlabel\n{long}\t1\n" + GOOD_ROWS)
    cfg = parse_config(finetune.FinetuneConfig, _swap(classify_args(assets, tmp_path / "out"), "--train-data", train))
    examples, _ = finetune.read_data(cfg)
    assert examples[0].text == long and len(examples) == 41


def test_multitask_refuses_a_csv_file_as_finetune_does(assets, tmp_path, capsys, no_model, monkeypatch):  # noqa: F811
    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the data was checked")

    monkeypatch.setattr(multitask, "build_model", refuse)
    train = _write(tmp_path / "train.csv", "sentence,label\n" + GOOD_ROWS.replace("\t", ","))
    out = tmp_path / "out"
    argv = [
        "--init-preset",
        str(assets / "tiny.json"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--classify-train",
        str(train),
        "--classify-eval",
        str(assets / "dev.tsv"),
        "--classify-max-seq-length",
        "32",
        "--output-dir",
        str(out),
        "--batch-size",
        "8",
        "--max-steps",
        "2",
        "--no-progress",
        "--device",
        "cpu",
    ]
    line = _refused(multitask.main, argv, capsys, out)
    assert f"{train}: one column on every line (no tab), so each text would be its own label" in line


# ----------------------------------------------------------------------------- CoNLL (finetune)


def _ner_args(assets, out, train, evaluation):  # noqa: F811
    argv = classify_args(assets, out, "--max-steps", "1", "--eval-every", "1")
    argv[argv.index("classify")] = "ner"
    return _swap(_swap(argv, "--train-data", train), "--eval-data", evaluation)


CONLL = "-DOCSTART- -X- -X- O\n\n" + "".join(
    f"john NNP B-NP B-PER\nsaw VBD B-VP O\nparis\tNNP\tB-NP\tB-LOC\n.\tO\n\n\n{'' if i % 2 else 'acme B-ORG'}\n\n"
    for i in range(12)
)


CONLL_CASES = {
    "bioes": (CONLL + "john S-PER\n", CONLL, "train.txt:99: tag 'S-PER' is not O, B-TYPE or I-TYPE (BIOES"),
    "unseen-type": (CONLL, "john B-PER\n\nrome B-MISC\n", "valid.txt:3: tag 'B-MISC': no MISC entity in the"),
    "latin-1": (CONLL, b"-DOCSTART- O\n\nJos\xe9 B-PER\n", "valid.txt:3: not UTF-8 text (byte 0xe9"),
}


@pytest.mark.parametrize("case", list(CONLL_CASES))
def test_conll_files_are_read_or_refused_in_one_line(assets, tmp_path, capsys, no_model, case):  # noqa: F811
    train, evaluation, expected = CONLL_CASES[case]
    out = tmp_path / "out"
    argv = _ner_args(assets, out, _write(tmp_path / "train.txt", train), _write(tmp_path / "valid.txt", evaluation))
    assert expected in _refused(finetune.main, argv, capsys, out)


def test_conll_blank_runs_tabs_two_columns_and_a_stray_i_are_read(assets, tmp_path):  # noqa: F811
    """What the checks must let through: runs of blank lines, tab and space separators, 2- and 4-column lines,
    `-DOCSTART-`, and a bare I- after O (read as IOB1: it starts an entity)."""
    train = _write(tmp_path / "train.txt", CONLL + "the O\nacme I-ORG\ncorp I-ORG\n")
    cfg = parse_config(finetune.FinetuneConfig, _ner_args(assets, tmp_path / "out", train, train))
    examples, evaluation = finetune.read_data(cfg)
    finetune.check_data(cfg, examples, evaluation)
    assert len(examples) == 19 and examples[1].words == ["acme"] and examples[-1].tags == ["O", "B-ORG", "I-ORG"]


# ----------------------------------------------------------------------------- SQuAD (finetune)


def _squad(n: int = 12, **changes) -> dict:
    """n answerable questions, one paragraph each, in one article; `changes` replace fields of the first question
    (qa=...), its paragraph (paragraph=...) or the whole file (data=...)."""
    paragraphs = []
    for i in range(n):
        context = f"the film was made in paris by john {i} ."
        qa = {"id": f"q{i}", "question": "who made it ?", "answers": [{"text": "john", "answer_start": 30}]}
        paragraphs.append({"context": context, "qas": [qa]})
    paragraphs[0]["qas"][0].update(changes.get("qa", {}))
    paragraphs[0].update(changes.get("paragraph", {}))
    for key in changes.get("drop", ()):
        paragraphs[0].pop(key)
    return {"version": "1.1", "data": changes.get("data", [{"title": "films", "paragraphs": paragraphs}])}


def _qa_args(assets, out, train, evaluation):  # noqa: F811
    argv = classify_args(assets, out, "--max-steps", "1", "--doc-stride", "8", "--max-query-length", "8")
    argv = _swap(argv, "--batch-size", 8)
    argv[argv.index("classify")] = "qa"
    return _swap(_swap(argv, "--train-data", train), "--eval-data", evaluation)


SQUAD_CASES = {
    "missing-context": (_squad(drop=["context"]), None, "train.json: data[0].paragraphs[0] has no 'context'"),
    "data-an-object": (_squad(data={"title": "films"}), None, "train.json: 'data' is a JSON object, not an array"),
    "hf-style-answers": (
        _squad(qa={"answers": {"text": ["john"], "answer_start": [30]}}),
        None,
        "train.json: question 'q0': answer 1 is 'text', not a {'text', 'answer_start'} object",
    ),
    "null-answer-start": (
        _squad(qa={"answers": [{"text": "john", "answer_start": None}]}),
        None,
        "train.json: question 'q0': answer 1 has answer_start None, not a character offset",
    ),
    "null-question": (_squad(qa={"question": None}), None, "question 'q0': its question is a JSON null"),
    "eval-answer-without-text": (
        _squad(),
        _squad(qa={"answers": [{"answer_start": 30}]}),
        "dev.json: question 'q0': answer 1 is {'answer_start': 30}, not",
    ),
    "eval-id-twice": (_squad(), _squad(qa={"id": "q1"}), "dev.json: question 'q1': the id is given twice"),
}


@pytest.mark.parametrize("case", list(SQUAD_CASES))
def test_squad_files_are_refused_in_one_line_naming_the_place(assets, tmp_path, capsys, no_model, case):  # noqa: F811
    train, evaluation, expected = SQUAD_CASES[case]
    out = tmp_path / "out"
    train_path = _write(tmp_path / "train.json", json.dumps(train))
    eval_path = _write(tmp_path / "dev.json", json.dumps(evaluation or _squad()))
    assert expected in _refused(finetune.main, _qa_args(assets, out, train_path, eval_path), capsys, out)


def test_a_gzipped_squad_part_that_is_not_utf8_names_its_line(assets, tmp_path, capsys, no_model):  # noqa: F811
    parts = tmp_path / "parts"
    parts.mkdir()
    with gzip.open(parts / "a.json.gz", "wt", encoding="utf-8") as f:
        json.dump(_squad(), f)
    with gzip.open(parts / "b.json.gz", "wb") as f:
        f.write(json.dumps(_squad(2)).encode().replace(b"paris", b"par\xeds"))  # Latin-1's i acute
    out = tmp_path / "out"
    argv = _qa_args(assets, out, parts, _write(tmp_path / "dev.json", json.dumps(_squad())))
    assert f"{parts / 'b.json.gz'}:1: not UTF-8 text (byte 0xed" in _refused(finetune.main, argv, capsys, out)


def test_a_gzipped_part_cut_short_is_named(assets, tmp_path, capsys, no_model):  # noqa: F811
    """gzip says "Compressed file ended before the end-of-stream marker was reached" (EOFError) and names no file."""
    parts = tmp_path / "parts"
    parts.mkdir()
    whole = gzip.compress(json.dumps(_squad()).encode())
    (parts / "a.json.gz").write_bytes(whole)
    (parts / "b.json.gz").write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out"
    argv = _qa_args(assets, out, parts, _write(tmp_path / "dev.json", json.dumps(_squad())))
    assert f"{parts / 'b.json.gz'}: not a whole gzip file" in _refused(finetune.main, argv, capsys, out)
    corpus = _write(tmp_path / "corpus.txt.gz", gzip.compress((assets / "corpus.txt").read_bytes())[:200])
    argv = _swap(pretrain_args(assets, out, "--max-steps", "2"), "--corpus", corpus)
    assert f"corpus file {corpus} cannot be read: Compressed file ended" in _refused(pretrain.main, argv, capsys, out)


# ----------------------------------------------------------------------------- rerank TSV (finetune)


def test_a_rerank_label_that_is_not_finite_names_its_line(assets, tmp_path, capsys, no_model):  # noqa: F811
    rows = "".join(f"query {i // 4}\ttext {i}\t{int(i % 4 == 0)}\n" for i in range(40))
    train = _write(tmp_path / "train.tsv", "query\ttext\tlabel\n" + rows + "query 0\tmore text\tinf\n")
    out = tmp_path / "out"
    argv = _swap(classify_args(assets, out, "--max-steps", "1"), "--train-data", train)
    argv[argv.index("classify")] = "rerank"
    argv = _swap(argv, "--eval-data", _write(tmp_path / "dev.tsv", "query\ttext\tlabel\n" + rows))
    assert "train.tsv:42: label inf is not a finite number" in _refused(finetune.main, argv, capsys, out)


# ----------------------------------------------------------------------------- evaluate


@pytest.fixture(scope="module")
def checkpoints(assets, tmp_path_factory):  # noqa: F811
    """best/ of a one-step classify run and of a one-step ner run (labels O, B-/I- LOC, ORG, PER)."""
    root = tmp_path_factory.mktemp("hostile-checkpoints")
    assert finetune.main(classify_args(assets, root / "classify", "--max-steps", "1", "--eval-every", "1")) == 0
    ner = _ner_args(assets, root / "ner", assets / "ner.txt", assets / "ner.txt")
    assert finetune.main(ner) == 0
    return {"classify": root / "classify" / "best", "ner": root / "ner" / "best"}


@pytest.mark.parametrize(
    "task, data, expected",
    [
        pytest.param(
            "classify",
            b"sentence\tlabel\ngood\t1\nna\xefve\t0\n",
            "data.txt:3: not UTF-8 text (byte 0xef",
            id="latin-1",
        ),
        pytest.param(
            "classify",
            "sentence\tlabel\ngood\t1\nbad\tdull film\t0\n",
            "data.txt:3: 3 columns where line 1 has 2",
            id="tab-in-text",
        ),
        pytest.param(
            "ner", "john B-PER\n\nrome B-MISC\n", "data.txt:3: tag 'B-MISC' is not one of the labels of", id="ner-type"
        ),
    ],
)
def test_evaluate_refuses_in_one_line_before_the_model(
    checkpoints, tmp_path, capsys, monkeypatch, task, data, expected
):
    import bert.checkpoint
    import bert.running

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded or run before the data was checked")

    monkeypatch.setattr(bert.checkpoint, "load_checkpoint", refuse)
    monkeypatch.setattr(bert.running, "run_model", refuse)
    path = _write(tmp_path / "data.txt", data)
    code, out, err = cli(
        evaluate_cli.main, ["--task", task, "--ckpt", str(checkpoints[task]), "--data", str(path)], capsys
    )
    assert code == 2 and out == "" and expected in one_error_line(err), err


# ----------------------------------------------------------------------------- pretraining


@pytest.mark.parametrize("second", [False, True])
def test_pretrain_refuses_a_corpus_that_stops_being_utf8_before_writing(assets, tmp_path, capsys, second):  # noqa: F811
    """The first line of text used to be all that was read before the run: a bad byte further on stopped the
    shard build with a traceback, after the vocabulary and part of the shards were written."""
    good = (assets / "corpus.txt").read_bytes()
    bad = _write(tmp_path / "bad.txt", b"A sentence of text .\n" * 2000 + b"Le caf\xe9 .\n")  # past the first read
    out = tmp_path / "out"
    argv = pretrain_args(assets, out, "--max-steps", "2")
    argv = _swap(argv, "--corpus", f"{_write(tmp_path / 'good.txt', good)},{bad}" if second else bad)
    assert f"corpus file {bad}:2001: not UTF-8 text (byte 0xe9" in _refused(pretrain.main, argv, capsys, out)


def test_a_shard_build_that_stops_halfway_leaves_no_index(tmp_path):
    """index.json says which settings made the shards, and a later run with those settings reuses them: a rebuild
    that stopped halfway (killed, a file gone) must not leave the earlier index beside half-rewritten shards."""
    from test_training_data import tiny_tokenizer

    from training.data.pretraining import INDEX_NAME, create_pretraining_data

    tokenizer = tiny_tokenizer(tmp_path)
    corpus = _write(tmp_path / "corpus.txt", "".join(f"w{i % 9} w{(i + 1) % 9} w3 .\n" for i in range(60)))
    data = tmp_path / "data"
    settings = dict(max_seq_length=16, dupe_factor=1, instances_per_shard=4)
    create_pretraining_data([corpus], tokenizer, data, seed=1, **settings)
    assert (data / INDEX_NAME).is_file()
    with pytest.raises(FileNotFoundError):
        create_pretraining_data([corpus, tmp_path / "gone.txt"], tokenizer, data, seed=2, **settings)
    assert not (data / INDEX_NAME).exists()
    assert not [p.name for p in data.iterdir() if p.name.startswith(".")]  # no temporary index left either


def test_shards_of_a_corpus_rewritten_at_the_same_path_are_built_again(assets, tmp_path, capsys):  # noqa: F811
    """index.json matched by settings and corpus paths alone: a corpus edited in place was trained on as it was."""
    corpus = _write(tmp_path / "corpus.txt", (assets / "corpus.txt").read_bytes())
    data = tmp_path / "data"

    def built(out: str) -> bool:
        argv = _swap(
            pretrain_args(assets, tmp_path / out, "--max-steps", "1", "--data-dir", str(data)), "--corpus", corpus
        )
        code, _, err = cli(pretrain.main, argv, capsys)
        assert code == 0, err
        return "building pretraining instances" in err

    assert built("a") and not built("b")  # the same corpus: its shards are reused
    _write(corpus, (assets / "corpus.txt").read_text().replace(" good ", " bad "))
    assert built("c")


def test_wikitext_conversion_refuses_a_file_that_is_not_utf8(tmp_path, capsys):
    from bert.errors import run_cli
    from training.data import wikitext

    raw = _write(tmp_path / "wiki.raw", b" = Rivers = \n The Nile flows north .\n The R\xf4ne too .\n")
    out = tmp_path / "corpus.txt"
    assert run_cli(wikitext.main, [str(raw), str(out)]) == 2
    assert f"{raw}:3: not UTF-8 text (byte 0xf4" in one_error_line(capsys.readouterr().err)
    assert not list(tmp_path.glob("corpus*"))


# ----------------------------------------------------------------------------- the real data passes


def test_the_real_files_pass_every_check(data_dir):
    """SST-2, CoNLL-2003 and a SQuAD part, read and checked as finetune reads and checks them: no refusal."""
    from bert.tasks import registry
    from training import data_checks

    cfg = finetune.FinetuneConfig(
        task="classify", train_data=str(data_dir / "SST-2" / "train.tsv"), eval_data=str(data_dir / "SST-2" / "dev.tsv")
    )
    train, evaluation = finetune.read_data(cfg)
    labels = registry.get("classify").train_labels(cfg, train, evaluation)
    finetune.check_data(cfg, train, evaluation)
    data_checks.check_labels(cfg.eval_data, evaluation, labels, "")
    data_checks.check_examples(cfg.train_data, train, cfg, "training")
    data_checks.check_examples(cfg.eval_data, evaluation, cfg, "evaluation")
    conll = data_dir / "conll2003"
    cfg = finetune.FinetuneConfig(task="ner", train_data=str(conll / "train.txt"), eval_data=str(conll / "valid.txt"))
    train, evaluation = finetune.read_data(cfg)
    finetune.check_data(cfg, train, evaluation)
    part = data_dir / "squad-train" / "train-v1.1.part-04.json.gz"
    cfg = finetune.FinetuneConfig(task="qa", train_data=str(part), heldout_articles=10)
    train, evaluation = finetune.read_data(cfg)
    data_checks.check_examples(cfg.train_data, train, cfg, "training")
    data_checks.check_examples(cfg.train_data, evaluation, cfg, "evaluation")
