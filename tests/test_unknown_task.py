"""A task name nobody declared (or one that cannot be trained) given to a command line is one `error:` line and
exit 2, before any work: training.finetune, training.multitask (--task-weights), training.evaluate, export.onnx.
And the training side loops over the registry: each trainable task declares its training hooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bert.tasks import registry
from bert.tasks.base import Task

REPO = Path(__file__).resolve().parents[1]


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def run_module(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


CASES = {
    "finetune": (
        "training.finetune",
        [
            "--task",
            "nosuch",
            "--init-preset",
            "tiny",
            "--tokenizer",
            "tok",
            "--train-data",
            "t.tsv",
            "--eval-data",
            "e.tsv",
            "--output-dir",
            "run",
        ],
    ),
    "finetune-untrainable": (
        "training.finetune",
        [
            "--task",
            "embed",
            "--init-preset",
            "tiny",
            "--tokenizer",
            "tok",
            "--train-data",
            "t.tsv",
            "--eval-data",
            "e.tsv",
            "--output-dir",
            "run",
        ],
    ),
    "multitask": (
        "training.multitask",
        [
            "--init-preset",
            "tiny",
            "--tokenizer",
            "tok",
            "--classify-train",
            "t.tsv",
            "--classify-eval",
            "e.tsv",
            "--task-weights",
            "classify=1,nosuch=2",
            "--output-dir",
            "run",
        ],
    ),
    "evaluate": ("training.evaluate", ["--task", "nosuch", "--ckpt", "no-such-checkpoint", "--data", "e.tsv"]),
    "export": ("export.onnx", ["--task", "nosuch", "--ckpt", "no-such-checkpoint", "--out", "run"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unknown_task_is_one_line_and_exit_2(case, tmp_path):
    module, args = CASES[case]
    result = run_module(module, *args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    line = one_error_line(result.stderr)
    name = "embed" if case == "finetune-untrainable" else "nosuch"
    assert repr(name) in line and "classify" in line  # names the bad task and what it could have been
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # refused before any work


def test_in_process_the_unknown_task_is_the_registrys_error():
    from training import evaluate, finetune

    with pytest.raises(registry.UnknownTask, match="must be one of"):
        finetune.FinetuneConfig(
            task="summarise", init_preset="tiny", tokenizer="tok", train_data="t", eval_data="e"
        ).validate()
    with pytest.raises(registry.UnknownTask):
        evaluate.EvaluateConfig(task="summarise", ckpt="c", data="d").validate()


HOOKS = ("read_examples", "encode_train", "collate_targets", "loss", "evaluate")


@pytest.mark.parametrize("name", registry.names(trainable=True))
def test_every_trainable_task_implements_its_training_hooks(name):
    from training.finetune import FinetuneConfig

    task = registry.get(name)
    missing = [hook for hook in HOOKS if getattr(type(task), hook) is getattr(Task, hook)]
    assert not missing, f"{name} is trainable but does not implement {missing}"
    assert task.main_metric and task.train_data_help
    options = {f for f in FinetuneConfig.__dataclass_fields__}
    names = {o.name for o in task.train_options}
    assert names <= options and set(task.multitask_options) <= names


def test_multitask_has_each_trainable_tasks_flags_from_its_declaration():
    from training.multitask import MultiTaskConfig

    fields = set(MultiTaskConfig.__dataclass_fields__)
    for name in registry.names(trainable=True):
        task = registry.get(name)
        assert {f"{name}_train", f"{name}_eval", f"{name}_max_seq_length"} <= fields
        assert {f"{name}_{option}" for option in task.multitask_options} <= fields
        assert MultiTaskConfig.__dataclass_fields__[f"{name}_max_seq_length"].default == task.train_max_seq_length


def test_an_option_of_another_task_is_refused_by_its_flag():
    from training.config import ConfigError
    from training.finetune import FinetuneConfig

    with pytest.raises(ConfigError, match="--doc-stride applies to --task qa only"):
        FinetuneConfig(
            task="classify", init_preset="tiny", tokenizer="tok", train_data="t", eval_data="e", doc_stride=64
        ).validate()
    with pytest.raises(ConfigError, match="--scheme applies to --task ner only"):
        FinetuneConfig(
            task="qa",
            init_preset="tiny",
            tokenizer="tok",
            train_data="t",
            heldout_articles=1,
            max_seq_length=64,
            max_query_length=16,
            doc_stride=16,
            scheme="iob1",
        ).validate()
