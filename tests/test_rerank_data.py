"""The rerank task's data readers (docs/training.md, "Validation"): a TSV label that is not a number names its file
and line; SQuAD questions that cannot be queries, and mined questions with too few negatives, are left out with
their count on stderr, never silently; a --rerank-mined file that is not training.mine_rerank's is one line naming
it and the entry, exit 2, before a model is built (not the --train-data file, not a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_training_cli_errors import cli, no_model, one_error_line  # noqa: F401 - no_model: a fixture
from test_training_loop import assets, classify_args  # noqa: F401 - assets: a fixture

from bert.config import ConfigError
from bert.tasks import rerank
from training import finetune

TSV = SimpleNamespace(text_column="0", pair_column="", label_column="-1", header="auto")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- TSV labels


@pytest.mark.parametrize(
    "text, header, named",
    [
        ("query\ttext\tlabel\nq\ta\t1\n\nq\tb\t0\nq\tc\tyes\n", "auto", ":5: rerank label 'yes' is not a number"),
        ("q\ta\t1\nq\tb\tyes\n", "no", ":2: rerank label 'yes' is not a number"),
        ("q\ta\t1\n\n\nq\tb\t-1\n", "auto", ":4: rerank label '-1' is negative"),
    ],
    ids=["header-and-blank-line", "no-header", "negative"],
)
def test_a_rerank_label_that_is_not_a_number_names_its_file_and_line(tmp_path, text, header, named):
    path = _write(tmp_path / "train.tsv", text)
    with pytest.raises(ConfigError) as refused:
        rerank.read_rerank_tsv(str(path), SimpleNamespace(**{**vars(TSV), "header": header}))
    assert str(refused.value).startswith(f"{path}{named}"), refused.value


def test_finetune_refuses_a_label_that_is_not_a_number_in_one_line(assets, tmp_path, capsys, no_model):  # noqa: F811
    rows = "".join(f"query {i // 4}\ttext {i}\t{int(i % 4 == 0)}\n" for i in range(40))
    train = _write(tmp_path / "train.tsv", "query\ttext\tlabel\n" + rows + "query 0\tmore text\tyes\n")
    argv = classify_args(assets, tmp_path / "out", "--max-steps", "1")
    argv[argv.index("classify")] = "rerank"
    argv[argv.index("--train-data") + 1] = str(train)
    argv[argv.index("--eval-data") + 1] = str(_write(tmp_path / "dev.tsv", "query\ttext\tlabel\n" + rows))
    code, stdout, err = cli(finetune.main, argv, capsys)
    assert code == 2 and stdout == "", err
    assert f"error: {train}:42: rerank label 'yes' is not a number" in one_error_line(err)


# ----------------------------------------------------------------------------- SQuAD questions left out


def _qa(question: str, start: int | None) -> dict:
    answers = [] if start is None else [{"text": "x", "answer_start": start}]
    return {
        "id": question,
        "question": question,
        "answers": answers,
        **({"is_impossible": True} if not answers else {}),
    }


def test_squad_questions_that_cannot_be_queries_are_left_out_with_their_count(capsys):
    context = "The cat eats fish.  Dogs bark at night. Birds sing."
    articles = [
        {
            "title": "animals",
            "paragraphs": [
                {
                    "context": context,
                    "qas": [
                        _qa("What does the cat eat?", context.index("fish")),
                        _qa("What is between?", context.index("  ") + 1),  # white space between two sentences
                        _qa("What is past the end?", len(context) + 5),
                        _qa("What has no answer?", None),
                    ],
                }
            ],
        },
        {"title": "alone", "paragraphs": [{"context": "One sentence only.", "qas": [_qa("Which one?", 0)]}]},
    ]
    capsys.readouterr()
    queries = rerank.squad_queries(articles, role="training")
    assert [q.query for q in queries] == ["What does the cat eat?"]
    assert capsys.readouterr().err.splitlines() == [
        "rerank: left out 4 of 5 training SQuAD questions: 2 whose answer starts in no sentence (between two, or "
        "outside the context), 1 with no answer, 1 with one candidate sentence only (nothing to rank it against)"
    ]
    kept = [{"title": "animals", "paragraphs": [{"context": context, "qas": articles[0]["paragraphs"][0]["qas"][:1]}]}]
    assert len(rerank.squad_queries(kept, role="training")) == 1
    assert capsys.readouterr().err == ""  # nothing left out: nothing said


def test_mined_questions_with_too_few_negatives_are_left_out_with_their_count(capsys):
    mined = {
        "articles": [{"title": "t", "sentences": ["a", "b", "c"]}],
        "questions": [
            {"question": "q1", "article": 0, "gold": 0, "negatives": [1, 2]},
            {"question": "q2", "article": 0, "gold": 1, "negatives": [0]},
        ],
    }
    capsys.readouterr()
    assert [q.query for q in rerank.mined_queries(mined, 2)] == ["q1"]
    assert capsys.readouterr().err.splitlines() == [
        "rerank: left out 1 of 2 mined questions with fewer than 2 negatives mined (--rerank-negatives)"
    ]
    assert len(rerank.mined_queries(mined, 1)) == 2
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- --rerank-mined files

GOOD_MINED = {
    "settings": {"heldout_articles": 1},
    "articles": [{"title": "t", "sentences": ["a", "b", "c"]}],
    "questions": [{"id": "1", "question": "q", "article": 0, "gold": 0, "negatives": [1, 2]}],
}


def _mined(**changes) -> dict:
    mined = json.loads(json.dumps(GOOD_MINED))
    for place, value in changes.items():
        *path, last = place.split("__")
        holder = mined
        for key in path:
            holder = holder[int(key) if key.isdigit() else key]
        if value is None:
            del holder[int(last) if last.isdigit() else last]
        else:
            holder[int(last) if last.isdigit() else last] = value
    return mined


MINED_CASES = {
    # name: (the file's text, what the line says after the file's name)
    "not-json": ("{'articles': []}", "not JSON (Expecting property name enclosed in double quotes: line 1 column 2"),
    "a-list": ("[1, 2]", "a JSON array, not the object of settings, articles and questions"),
    "settings-a-list": (_mined(settings=[1]), "'settings' is a JSON array, not an object"),
    "no-questions": (_mined(questions=None), "no 'questions' array (not training.mine_rerank's file)"),
    "articles-an-object": (_mined(articles={}), "'articles' is a JSON object, not an array"),
    "article-no-title": (_mined(articles__0__title=None), "articles[0] has no 'title'"),
    "sentence-a-number": (
        _mined(articles__0__sentences__2=3),
        "articles[0].sentences[2] is a JSON number, not a string",
    ),
    "question-a-string": (_mined(questions__0="q"), "questions[0] is a JSON string, not an object"),
    "no-negatives": (_mined(questions__0__negatives=None), "questions[0] has no 'negatives'"),
    "article-a-string": (_mined(questions__0__article="0"), "questions[0].article is a JSON string, not an integer"),
    "article-out-of-range": (
        _mined(questions__0__article=3),
        "questions[0].article is 3, not an index of the file's 1",
    ),
    "gold-out-of-range": (_mined(questions__0__gold=5), "questions[0].gold is 5, not a sentence index of articles[0]"),
    "negative-out-of-range": (
        _mined(questions__0__negatives=[1, 9]),
        "questions[0].negatives[1] is 9, not a sentence index of articles[0] (0 to 2)",
    ),
    "negative-a-string": (_mined(questions__0__negatives=["1"]), 'questions[0].negatives[0] is "1", not a sentence'),
}


@pytest.mark.parametrize("case", MINED_CASES, ids=list(MINED_CASES))
def test_a_mined_file_of_another_structure_is_one_line_naming_it_and_the_entry(tmp_path, case):
    content, named = MINED_CASES[case]
    path = _write(tmp_path / "mined.json", content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError) as refused:
        rerank.read_mined(str(path), 1, set())
    assert str(refused.value).startswith(f"{path}: {named}"), refused.value
    assert "\n" not in str(refused.value)


def test_a_good_mined_file_is_read():
    assert rerank.mined_problem(GOOD_MINED) is None


SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": title,
            "paragraphs": [
                {
                    "context": "The cat eats fish. Dogs bark at night.",
                    "qas": [
                        {
                            "id": title,
                            "question": "What does the cat eat?",
                            "answers": [{"text": "fish", "answer_start": 13}],
                        }
                    ],
                }
            ],
        }
        for title in ("kept", "held")
    ],
}


@pytest.mark.parametrize("case", ["no-negatives", "settings-a-list", "not-json"])
def test_finetune_names_the_mined_file_not_the_training_data(assets, tmp_path, capsys, no_model, case):  # noqa: F811
    content, named = MINED_CASES[case]
    squad = _write(tmp_path / "squad.json", json.dumps(SQUAD))
    mined = _write(tmp_path / "mined.json", content if isinstance(content, str) else json.dumps(content))
    out = tmp_path / "out"
    argv = classify_args(assets, out, "--max-steps", "1", "--heldout-articles", "1", "--rerank-negatives", "1")
    argv[argv.index("classify")] = "rerank"
    argv[argv.index("--train-data") + 1] = f"squad:{squad}"
    del argv[argv.index("--eval-data") : argv.index("--eval-data") + 2]
    argv += ["--rerank-mined", str(mined)]
    code, stdout, err = cli(finetune.main, argv, capsys)
    assert code == 2 and stdout == "", err
    assert one_error_line(err).startswith(f"error: {mined}: {named}"), err
    assert not out.exists()
