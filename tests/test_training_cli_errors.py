"""The training CLIs' contract for what cannot be done as given (README, "Training"): one `error:` line on stderr and
exit 2, before any work; and Ctrl-C: the resume note on stderr and exit 130, so `finetune && export` stops.

Covered: --resume with options that change the run, Ctrl-C in finetune and pretrain, data files that are empty,
too small for one batch, of another task's format or with labels the head does not know (finetune and evaluate,
refused before the model is built or run), an empty pretraining corpus, and evaluate's --max-eval-examples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_training_loop import assets, classify_args, losses, pretrain_args  # noqa: F401 - assets: a fixture

from training import evaluate as evaluate_cli
from training import finetune, pretrain
from training.config import run


def cli(main, argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m training.X argv`, as training.config.run gives them."""
    capsys.readouterr()
    try:
        code = run(main, argv)
    except SystemExit as e:  # options refused while parsing (bert.options.fail)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def stopped_run(assets, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """A classify run planned for 6 steps, stopped after 2 (last/ resumable), with best/ from 2 evaluations."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    assert (
        finetune.main(classify_args(assets, out, "--max-steps", "6", "--eval-every", "1", "--stop-at-step", "2")) == 0
    )
    return out


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if a model is built, loaded or run."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built or run before the data was checked")

    import bert.checkpoint
    import bert.running

    monkeypatch.setattr(finetune, "build_model", refuse)
    monkeypatch.setattr(bert.checkpoint, "load_checkpoint", refuse)
    monkeypatch.setattr(bert.running, "run_model", refuse)


# ----------------------------------------------------------------------------- --resume


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--max-steps", "8"], "--max-steps 8 (that run: 6)"),
        (["--max-steps", "6", "--learning-rate", "1e-3"], "--learning-rate 0.001 (that run: 0.003)"),
        (["--max-steps", "6", "--seed", "4"], "--seed 4 (that run: 3)"),
        (["--max-steps", "6", "--max-seq-length", "24"], "--max-seq-length 24 (that run: 32)"),
        # an option no list names is held too: only the reporting, saving and device options may change
        (["--max-steps", "6", "--train-data", "dev.tsv"], "dev.tsv' (that run: "),
    ],
)
def test_resume_with_other_options_is_one_line_exit_2(assets, stopped_run, tmp_path, capsys, flags, named):  # noqa: F811
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    before = (run_dir / "log.jsonl").read_text()
    code, out, err = cli(
        finetune.main,
        classify_args(
            assets,
            run_dir,
            *[str(assets / f) if f.endswith(".tsv") else f for f in flags],
            "--resume",
            str(run_dir / "last"),
        ),
        capsys,
    )
    line = one_error_line(err)
    assert code == 2 and out == "" and named in line and "resume with the same options" in line
    assert (run_dir / "log.jsonl").read_text() == before  # no step taken


def test_resume_with_another_planned_length_from_the_data_is_one_line_exit_2(assets, tmp_path, capsys):  # noqa: F811
    """Same options, but the epochs now span fewer steps (the training file, at the same path, now smaller): refused
    in one line."""
    data = tmp_path / "train.tsv"
    lines = (assets / "train.tsv").read_text().splitlines(keepends=True)
    data.write_text("".join(lines))
    out = tmp_path / "run"

    def args(*extra):
        argv = classify_args(assets, out, "--num-epochs", "1", *extra)
        argv[argv.index("--train-data") + 1] = str(data)
        return argv

    finetune.main(args("--stop-at-step", "1", "--eval-every", "100"))
    data.write_text("".join(lines[:129]))
    code, stdout, err = cli(finetune.main, args("--resume", str(out / "last")), capsys)
    line = one_error_line(err)
    assert code == 2 and stdout == "" and "that run planned 16 steps, this config plans 8" in line


def test_resume_with_only_cadence_changed_still_works(assets, stopped_run, tmp_path, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    argv = classify_args(assets, run_dir, "--max-steps", "6", "--eval-every", "3", "--log-every", "2")
    code, out, err = cli(finetune.main, [*argv, "--resume", str(run_dir / "last")], capsys)
    assert code == 0 and json.loads(out)["steps"] == 6


# ----------------------------------------------------------------------------- Ctrl-C


@pytest.mark.parametrize("command", ["finetune", "pretrain"])
def test_ctrl_c_exits_130_with_the_note_on_stderr(command, assets, tmp_path, capsys, monkeypatch):  # noqa: F811
    from training import task_data

    data, main, make_args = {
        "finetune": (task_data.FeatureData, finetune.main, classify_args),
        "pretrain": (pretrain.PretrainData, pretrain.main, pretrain_args),
    }[command]
    original, calls = data.collate, {"n": 0}

    def interrupting(self, *args, **kwargs):  # Ctrl-C while the third batch is being made
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(data, "collate", interrupting)
    out = tmp_path / "run"
    code, stdout, err = cli(main, make_args(assets, out, "--max-steps", "6", "--eval-every", "100"), capsys)
    assert code == 130 and stdout == ""
    assert f"interrupted after step 2; continue with --resume {out / 'last'}" in err
    assert json.loads((out / "last" / "trainer_state.json").read_text())["step"] == 2
    if command == "pretrain":
        assert max(losses(out)) == 2


# ----------------------------------------------------------------------------- bad data: finetune


def _tsv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "case, expected",
    [
        ("empty-train", "empty.tsv: no training examples"),
        ("header-only-train", "header.tsv: no training examples"),
        ("fewer-than-batch", "few.tsv: 5 examples, fewer than --batch-size 16: no full batch"),
        ("bad-eval-label", "bad.tsv:3: label '7' is not one of the training data's labels ['0', '1']"),
        ("ner-on-tsv", "train.tsv:1: tag 'label' is not O, B-TYPE or I-TYPE"),
        ("empty-eval", "empty.tsv: no evaluation examples"),
    ],
)
def test_finetune_refuses_bad_data_in_one_line_before_the_model(assets, tmp_path, capsys, no_model, case, expected):  # noqa: F811
    argv = classify_args(assets, tmp_path / "out", "--max-steps", "2")
    train, evaluation = argv.index("--train-data") + 1, argv.index("--eval-data") + 1
    empty = _tsv(tmp_path / "empty.tsv", "")
    if case == "empty-train":
        argv[train] = str(empty)
    elif case == "header-only-train":
        argv[train] = str(_tsv(tmp_path / "header.tsv", "sentence\tlabel\n"))
    elif case == "fewer-than-batch":
        argv[train] = str(_tsv(tmp_path / "few.tsv", "".join(f"good film {i}\t{i % 2}\n" for i in range(5))))
    elif case == "bad-eval-label":
        argv[evaluation] = str(_tsv(tmp_path / "bad.tsv", "sentence\tlabel\ngood movie\t1\nbad movie\t7\n"))
    elif case == "ner-on-tsv":
        argv[argv.index("classify")] = "ner"
        argv[evaluation] = str(assets / "ner.txt")
    elif case == "empty-eval":
        argv[evaluation] = str(empty)
    code, out, err = cli(finetune.main, argv, capsys)
    line = one_error_line(err)
    assert code == 2 and out == "" and expected in line, line
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- bad data: evaluate


@pytest.mark.parametrize(
    "case, expected",
    [
        ("empty", "empty.tsv: no evaluation examples"),
        ("header-only", "header.tsv: no evaluation examples"),
        ("unknown-label", "bad.tsv:3: label '7' is not one of the labels of"),
        ("one-column", "onecol.tsv:2: label 'good movie' is not one of the labels of"),
        ("conll-file", "ner.txt:1: label '-DOCSTART- -X- -X- O' is not one of the labels of"),
        ("empty-label", "nolabel.tsv:3: no label"),
    ],
)
def test_evaluate_refuses_bad_data_in_one_line_before_the_model(stopped_run, assets, tmp_path, capsys, case, expected):  # noqa: F811
    import bert.checkpoint
    import bert.running

    files = {
        "empty": ("empty.tsv", ""),
        "header-only": ("header.tsv", "sentence\tlabel\n"),
        "unknown-label": ("bad.tsv", "sentence\tlabel\ngood movie\t1\nbad movie\t7\n"),
        "one-column": ("onecol.tsv", "sentence\tlabel\ngood movie\n"),
        "empty-label": ("nolabel.tsv", "sentence\tlabel\ngood movie\t1\nbad movie\t\n"),
    }
    data = assets / "ner.txt" if case == "conll-file" else _tsv(tmp_path / files[case][0], files[case][1])

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded or run before the data was checked")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(bert.checkpoint, "load_checkpoint", refuse)
        m.setattr(bert.running, "run_model", refuse)
        code, out, err = cli(
            evaluate_cli.main, ["--task", "classify", "--ckpt", str(stopped_run / "best"), "--data", str(data)], capsys
        )
    line = one_error_line(err)
    assert code == 2 and out == "" and expected in line, line
    if case in ("one-column", "conll-file"):
        assert "the row has one column" in line


def test_evaluate_takes_max_eval_examples_as_finetune_does(assets, stopped_run, capsys):  # noqa: F811
    """A run's best/metrics.json from --max-eval-examples 20 is what evaluate --max-eval-examples 20 gives."""
    directory = stopped_run.parent / "limited"
    if not directory.exists():
        finetune.main(
            classify_args(assets, directory, "--max-steps", "2", "--eval-every", "2", "--max-eval-examples", "20")
        )
    saved = json.loads((directory / "best" / "metrics.json").read_text())
    argv = ["--ckpt", str(directory / "best"), "--data", str(assets / "dev.tsv")]
    code, out, err = cli(evaluate_cli.main, [*argv, "--max-eval-examples", "20"], capsys)
    assert code == 0, err
    printed = json.loads(out)
    assert printed["examples"] == 20 and printed["accuracy"] == saved["accuracy"]
    code, out, _ = cli(evaluate_cli.main, [*argv, "--max-examples", "20"], capsys)
    assert code == 0 and json.loads(out) == printed
    code, out, err = cli(evaluate_cli.main, [*argv, "--max-examples", "10", "--max-eval-examples", "20"], capsys)
    assert code == 2 and out == "" and "give one" in one_error_line(err)


# ----------------------------------------------------------------------------- pretrain


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_pretrain_refuses_an_empty_corpus_before_writing_anything(assets, tmp_path, capsys, text):  # noqa: F811
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    argv = pretrain_args(assets, tmp_path / "out", "--max-steps", "2")
    argv[argv.index("--corpus") + 1] = str(corpus)
    code, out, err = cli(pretrain.main, argv, capsys)
    line = one_error_line(err)
    assert code == 2 and out == "" and f"--corpus {corpus}: no text in it" in line
    assert not (tmp_path / "out").exists()


def test_pretrain_without_held_out_documents_is_one_line_exit_2(assets, tmp_path, capsys):  # noqa: F811
    """Was `SystemExit(message)`: exit 1 and no `error:` prefix."""
    argv = pretrain_args(assets, tmp_path / "out", "--max-steps", "2")
    argv[argv.index("--heldout-percent") + 1] = "0.001"
    code, out, err = cli(pretrain.main, argv, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()  # the notes of the shards built, then the one error line
    assert lines[-1].startswith("error: no held-out instances: raise --heldout-percent")
    assert sum(line.startswith("error: ") for line in lines) == 1 and "Traceback" not in err


def test_wikitext_conversion_refuses_in_one_line_and_publishes_only_a_whole_corpus(tmp_path, capsys):
    from bert.errors import run_cli
    from training.data import wikitext

    out = tmp_path / "corpus.txt"
    assert run_cli(wikitext.main, [str(tmp_path / "missing.raw"), str(out)]) == 2
    assert "missing.raw" in one_error_line(capsys.readouterr().err) and not out.exists()
    with pytest.raises(SystemExit) as e:
        wikitext.main([str(out)])
    assert e.value.code == 2 and "usage:" in one_error_line(capsys.readouterr().err)
    raw = tmp_path / "wiki.raw"
    raw.write_text(" = Rivers = \n The Nile flows north . It is long .\n", encoding="utf-8")
    assert run_cli(wikitext.main, [str(raw), str(out)]) == 0
    assert out.read_text(encoding="utf-8") == "The Nile flows north .\nIt is long .\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("corpus")] == ["corpus.txt"]  # no .partial left


def test_max_seq_length_is_bounded_by_the_models_positions_not_by_512(assets, tmp_path, capsys):  # noqa: F811
    """A model of 1024 positions (ModernBERT has 8192) fine-tunes and pretrains on 1024-token inputs; more than
    the model's positions is one line naming them, for --init-preset, --preset and --ckpt alike."""
    from test_training_loop import TINY

    long = tmp_path / "long.json"
    long.write_text(json.dumps({**TINY, "max_position_embeddings": 1024}))
    accepted = classify_args(assets, tmp_path / "a", "--max-seq-length", "1024")
    accepted[accepted.index(str(assets / "tiny.json"))] = str(long)
    from training.config import parse_config

    assert parse_config(finetune.FinetuneConfig, accepted).max_seq_length == 1024  # validated: no exit 2
    code, _, err = cli(finetune.main, [*accepted, "--max-seq-length", "2048"], capsys)
    assert code == 2 and "--max-seq-length 2048 exceeds the model's max_position_embeddings 1024" in one_error_line(err)
    short = [*pretrain_args(assets, tmp_path / "p"), "--max-seq-length", str(TINY["max_position_embeddings"] + 1)]
    code, _, err = cli(pretrain.main, short, capsys)
    assert code == 2 and "exceeds the model's max_position_embeddings" in one_error_line(err), err
