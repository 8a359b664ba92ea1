"""Every command declares its options one way (bert/options.py): each option has help in its declaration and shows
it in --help with its env var, an unknown flag is one `error:` line and exit 2, and BERTSERVE_<NAME> sets an option
of every command (flag > env > default)."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest

from bert import options
from bert.options import option


def _training(module: str):
    def entry(argv):
        from training.config import run

        return run(importlib.import_module(module).main, argv)

    return entry


def _batch(argv):
    from batch.__main__ import main

    return main(argv)


def _export(module: str):
    return lambda argv: importlib.import_module(module).cli(argv)


def _serving(argv):
    from serving.__main__ import main

    return main(argv)


def _declaration(name: str):
    return {
        "serving": ("serving.settings", "Settings"),
        "training.finetune": ("training.finetune", "FinetuneConfig"),
        "training.multitask": ("training.multitask", "MultiTaskConfig"),
        "training.evaluate": ("training.evaluate", "EvaluateConfig"),
        "training.pretrain": ("training.pretrain", "PretrainConfig"),
        "export.onnx": ("export.onnx", "OnnxOptions"),
        "export.tensorrt": ("export.tensorrt", "TensorRTOptions"),
        "export.triton": ("export.triton", "TritonOptions"),
        "batch": ("batch.options", "BatchOptions"),
        "training.mine_rerank": ("training.mine_rerank", "MineOptions"),
    }[name]


# command -> (entry point, argv, env var set to a value only that command's checks refuse, what its error then says)
COMMANDS = {
    "serving": (
        _serving,
        ["--model", "no-such-model", "--port", "0"],
        {"BERTSERVE_MAX_BATCH_TOKENS": "0"},
        "BERTSERVE_MAX_BATCH_TOKENS: must be at least 1, got 0",
    ),
    "training.mine_rerank": (
        _training("training.mine_rerank"),
        ["--squad", "no-such-squad", "--out", "mined.json"],
        {"BERTSERVE_MINE_RERANK_DEPTH": "0"},
        "BERTSERVE_MINE_RERANK_DEPTH: must be at least 1, got 0",
    ),
    "training.finetune": (
        _training("training.finetune"),
        ["--init-preset", "tiny", "--tokenizer", "tok", "--train-data", "t.tsv", "--eval-data", "e.tsv"],
        {"BERTSERVE_FINETUNE_TASK": "summarise"},
        "'summarise'",
    ),
    "training.multitask": (
        _training("training.multitask"),
        ["--init-preset", "tiny", "--tokenizer", "tok", "--classify-train", "t.tsv", "--classify-eval", "e.tsv"],
        {"BERTSERVE_MULTITASK_TASK_WEIGHTS": "classify=1,summarise=2"},
        "--task-weights names 'summarise'",
    ),
    "training.evaluate": (
        _training("training.evaluate"),
        ["--ckpt", "no-such-checkpoint", "--data", "e.tsv"],
        {"BERTSERVE_EVALUATE_TASK": "summarise"},
        "'summarise'",
    ),
    "training.pretrain": (
        _training("training.pretrain"),
        ["--corpus", __file__],
        {"BERTSERVE_PRETRAIN_VOCAB_SIZE": "50"},
        "vocab_size must be in [100, 65535], got 50",
    ),
    "export.onnx": (
        _export("export.onnx"),
        ["--ckpt", "no-such-checkpoint"],
        {"BERTSERVE_ONNX_OPSET": "9"},
        "BERTSERVE_ONNX_OPSET: must be at least 14, got 9",
    ),
    "export.tensorrt": (
        _export("export.tensorrt"),
        ["--artifact", "no-such-artifact"],
        {"BERTSERVE_TENSORRT_WORKSPACE_GB": "-2"},
        "BERTSERVE_TENSORRT_WORKSPACE_GB: must be more than 0, got -2",
    ),
    "batch": (
        _batch,
        ["--model", "no-such-model", "--input", __file__, "--output", "out"],
        {"BERTSERVE_BATCH_TASK": "summarise"},
        "'summarise' is not one of",
    ),
    "export.triton": (
        _export("export.triton"),
        ["--repo", "no-such-repo"],
        {"BERTSERVE_TRITON_ARTIFACT": "no-such-artifact-dir"},
        "no-such-artifact-dir",
    ),
}


def _options(name: str) -> list[options.Option]:
    module_name, cls = _declaration(name)
    return options.options_of(getattr(importlib.import_module(module_name), cls))


def _parser(name: str):
    module = importlib.import_module("serving.__main__" if name == "serving" else name)
    if hasattr(module, "build_parser"):
        return module.build_parser()
    module_name, cls = _declaration(name)
    return options.build_parser(getattr(importlib.import_module(module_name), cls))


def _exit(entry, argv, capsys) -> tuple[int, list[str]]:
    try:
        code = entry(argv)
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch):
    import os

    for key in [k for k in os.environ if k.startswith(options.ENV_PREFIX)]:
        monkeypatch.delenv(key)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_has_help_and_shows_it_with_its_env_var(name):
    declared = _options(name)
    assert len(declared) >= 6
    undocumented = [o.name for o in declared if len(o.help.split()) < 2]
    assert not undocumented, undocumented
    text = " ".join(_parser(name).format_help().split())
    for o in declared:
        assert o.flag in text and f"[env {o.env}]" in text, o.name
        assert " ".join(o.help.split()[:3]) in text, o.name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_unknown_flag_is_one_line_and_exit_2(name, capsys):
    entry = COMMANDS[name][0]
    code, lines = _exit(entry, ["--no-such-flag", "1"], capsys)
    assert code == 2 and lines == ["error: unrecognized arguments: --no-such-flag 1"], lines


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_env_var_sets_an_option_and_a_flag_wins(name, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    entry, argv, env, message = COMMANDS[name]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, lines = _exit(entry, argv, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    ((key, _),) = env.items()
    declared = next(o for o in _options(name) if o.env == key)
    flag, default = declared.flag, declared.default
    if default in (None, "", []):
        return  # no value of the flag's own that passes (a required path): the env var alone is shown read
    given = ",".join(default) if isinstance(default, list) else str(default)
    code, lines = _exit(entry, [*argv, flag, given], capsys)
    assert not any(message in line for line in lines), lines  # the flag's value was used, not the env var's


def test_no_env_var_means_two_things():
    """Every command's options, walked: an env var read by two commands must mean the same to both (kind,
    choices, help). Once BERTSERVE_PRECISION was fp32|bf16|fp16 to training, fp32|fp16|int8 to export and
    fp32|fp16|bf16 to the server, so an int8 left for an export stopped the server from starting."""
    meanings: dict[str, dict[tuple, list[str]]] = {}
    for name in COMMANDS:
        for o in _options(name):
            meanings.setdefault(o.env, {}).setdefault((o.kind, o.choices, o.help), []).append(name)
    assert len(meanings) > 200  # every command's options were walked
    shared = {env: list(by_meaning.values()) for env, by_meaning in meanings.items() if len(by_meaning) > 1}
    assert not shared, shared


def test_an_export_setting_in_the_environment_leaves_the_server_alone(monkeypatch, capsys):
    from export.onnx import OnnxOptions
    from serving.settings import Settings

    monkeypatch.setenv("BERTSERVE_ONNX_PRECISION", "int8")
    monkeypatch.setenv("BERTSERVE_FINETUNE_PRECISION", "bf16")
    assert options.read(OnnxOptions, ["--ckpt", "c"])["precision"] == "int8"
    values = options.read(Settings, [])
    settings = Settings(**{k: v for k, v in values.items() if values.sources[k] != "default"})
    assert settings.precision is None and settings.effective_precision == "fp32"
    # The server's own variable still means the server's precision, and auto (an export's) is not one of them.
    monkeypatch.setenv("BERTSERVE_PRECISION", "auto")
    code, lines = _exit(_serving, ["--model", "no-such-model"], capsys)
    assert code == 2 and len(lines) == 1 and "BERTSERVE_PRECISION" in lines[0] and "auto" in lines[0], lines


# ----------------------------------------------------------------------------- the mechanism itself


@dataclasses.dataclass
class Example:
    name: str = option("x", "a name")
    count: int = option(3, "how many")
    ratio: float | None = option(None, "a ratio", minimum=0, maximum=1)
    fast: bool = option(True, "go fast")
    no_check: bool = option(False, "skip the check")
    tags: list[str] = option([], "tags")
    mode: str = option("a", "a mode", choices=("a", "b"))
    left: str | None = option(None, "one side", one_of="side")
    right: str | None = option(None, "other side", one_of="side")


def test_flag_then_env_then_default():
    env = {"BERTSERVE_COUNT": "7", "BERTSERVE_NAME": "from-env", "BERTSERVE_FAST": "off", "BERTSERVE_TAGS": "p,q"}
    values = options.read(Example, ["--name", "from-flag"], environ=env)
    assert values == {
        "name": "from-flag",
        "count": 7,
        "ratio": None,
        "fast": False,
        "no_check": False,
        "tags": ["p", "q"],
        "mode": "a",
        "left": None,
        "right": None,
    }
    assert values.sources["name"] == "--name" and values.sources["count"] == "BERTSERVE_COUNT"
    assert values.sources["mode"] == "default"
    assert Example(**values).count == 7


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--fast"], True),
        (["--fast", "false"], False),
        (["--no-fast"], False),
        (["--fast", "yes"], True),
    ],
)
def test_yes_no_options(argv, expected):
    assert options.read(Example, argv, environ={})["fast"] is expected


def test_a_no_option_has_no_double_negative():
    assert options.read(Example, ["--no-check"], environ={})["no_check"] is True
    text = options.build_parser(Example).format_help()
    assert "--no-no-check" not in text and "--no-fast: false" in text


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--count", "many"], {}, "error: argument --count: expected an integer, got 'many'"),
        ([], {"BERTSERVE_COUNT": "many"}, "error: BERTSERVE_COUNT: expected an integer, got 'many'"),
        ([], {"BERTSERVE_FAST": "maybe"}, "error: BERTSERVE_FAST: expected true or false, got 'maybe'"),
        (["--mode", "c"], {}, "error: argument --mode: invalid choice 'c' (choose from a, b)"),
        (["--left", "l", "--right", "r"], {}, "error: argument --right: not allowed with argument --left"),
        (["--left", "l"], {"BERTSERVE_RIGHT": "r"}, None),  # the flag wins: the other side's env var is not read
        (
            [],
            {"BERTSERVE_LEFT": "l", "BERTSERVE_RIGHT": "r"},
            "error: BERTSERVE_LEFT and BERTSERVE_RIGHT exclude each other",
        ),
        (["--name"], {}, "error: argument --name: expected one argument"),
        (["--ratio", "-0.5"], {}, "error: argument --ratio: must be at least 0, got -0.5"),
        ([], {"BERTSERVE_RATIO": "1.5"}, "error: BERTSERVE_RATIO: must be at most 1, got 1.5"),
    ],
)
def test_bad_values_are_one_line_naming_their_source(argv, env, message, capsys):
    if message is None:
        assert options.read(Example, argv, environ=env)["right"] is None
        return
    with pytest.raises(SystemExit) as e:
        options.read(Example, argv, environ=env)
    lines = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith(message), lines


def test_bounds_are_declared_once_and_hold_for_flags_env_and_code():
    assert options.read(Example, ["--ratio", "0"], environ={"BERTSERVE_RATIO": "0.5"})["ratio"] == 0
    assert options.read(Example, [], environ={"BERTSERVE_RATIO": "1"})["ratio"] == 1
    assert "a ratio (0 to 1) [env BERTSERVE_RATIO]" in " ".join(options.build_parser(Example).format_help().split())
    options.check_bounds(Example, {"ratio": None, "count": -3})  # None is the default's, count has no bounds
    with pytest.raises(ValueError, match="^--ratio must be at most 1, got 2$"):
        options.check_bounds(Example, {"ratio": 2})
    # a config built in code is held to the same declaration, every problem at once
    from training.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="--eval-every must be at least 0, got -1; --log-every must be at least 0"):
        TrainConfig(eval_every=-1, log_every=-2, max_steps=1).validate()
    # a pydantic model's Field(ge=..., le=...) are the server's bounds, read the same way
    from serving.settings import Settings

    port = next(o for o in options.options_of(Settings) if o.name == "port")
    assert (port.minimum, port.maximum) == (0, 65535)
    with pytest.raises(SystemExit):
        options.read(Settings, ["--port", "70000"], environ={})


def test_values_given_in_code_are_taken_as_declared_or_refused():
    import numpy as np

    assert options.take_values(Example, {"count": np.int64(4), "ratio": None, "fast": np.bool_(False)}) == {
        "count": 4,
        "ratio": None,
        "fast": False,
    }
    assert type(options.take_values(Example, {"ratio": np.float32(0.5)})["ratio"]) is float
    for given, message in (
        ({"fast": "false"}, "fast must be True or False, got 'false'"),  # a true string: not coerced
        ({"count": "3"}, "count must be an integer, got '3'"),
        ({"count": 2.5}, "count must be an integer, got 2.5"),
        ({"mode": "c"}, "mode must be one of a, b, got 'c'"),
        ({"ratio": 2}, "ratio must be at most 1, got 2"),
        ({"count": None}, "count must be an integer, got None"),  # not Optional
        ({"tags": [1]}, "tags must be a name or a list of names"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            options.take_values(Example, given)


def test_help_is_read_from_the_declaration_not_the_source():
    # A class made at run time has no source to read: its help still comes through.
    made = dataclasses.make_dataclass("Made", [("size", int, option(5, "the size of it"))])
    assert "the size of it (default: 5) [env BERTSERVE_SIZE]" in " ".join(
        options.build_parser(made).format_help().split()
    )


# ----------------------------------------------------------------------------- every option read is declared

PRODUCT = ("bert", "training", "export", "serving", "batch", "evals", "bench", "clients", "docker", "examples")


def _product_files():
    from pathlib import Path

    from test_import_cycles import python_sources

    repo = Path(__file__).resolve().parents[1]
    return [p for top in PRODUCT if (repo / top).is_dir() for p in python_sources(repo / top)]


def test_every_bertserve_variable_the_product_names_is_declared():
    """Each BERTSERVE_ name in the product's source (a read, a message, a docstring) is some command's option or
    one of options.ENVIRONMENT; and none of those is also an option."""
    import re

    declared, prefixes = set(), set()
    for name in COMMANDS:
        declared |= {o.env for o in _options(name)}
        module_name, cls = _declaration(name)
        prefixes.add(options.env_prefix(getattr(importlib.import_module(module_name), cls)).rstrip("_"))
    assert not set(options.ENVIRONMENT) & declared
    named = {}
    for path in _product_files():
        for found in re.findall(r"BERTSERVE_[A-Z0-9_]*[A-Z0-9]", path.read_text()):
            named.setdefault(found, path.name)
    assert len(named) >= 15  # the walk found the product's names
    undeclared = {n: where for n, where in named.items() if n not in declared | prefixes | set(options.ENVIRONMENT)}
    assert not undeclared, undeclared


def _settings_reads(tree):
    """(attribute, line) for each `settings.X`, `self.settings.X` and `getattr(settings, "X" or f"..X")` in tree;
    an f-string name is given as '*' + its constant tail."""
    import ast

    def is_settings(node):
        return (isinstance(node, ast.Name) and node.id == "settings") or (
            isinstance(node, ast.Attribute) and node.attr == "settings"
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_settings(node.value):
            yield node.attr, node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and is_settings(node.args[0])
        ):
            name = node.args[1]
            if isinstance(name, ast.Constant):
                yield name.value, node.lineno
            elif isinstance(name, ast.JoinedStr) and isinstance(name.values[-1], ast.Constant):
                yield "*" + name.values[-1].value, node.lineno
            else:
                yield "?", node.lineno


def test_every_server_setting_the_code_reads_is_declared():
    """serving/ (and what builds its backends) reads only what Settings declares: once the torch backend read
    `torch_packed`, `torch_cuda_graphs` and `torch_gelu_epilogue` by getattr with a default, and nothing
    declared them."""
    import ast

    from serving.settings import Settings

    known = set(Settings.model_fields) | set(dir(Settings))
    reads, unknown = 0, []
    for path in _product_files():
        if path.parent.name == "tasks" or path.name == "tokenizer.py":
            continue  # bert's own `settings` are a tokenizer's and a model directory's, not the server's
        for attr, line in _settings_reads(ast.parse(path.read_text())):
            reads += 1
            ok = any(f.endswith(attr[1:]) for f in Settings.model_fields) if attr.startswith("*") else attr in known
            if not ok:
                unknown.append(f"{path.name}:{line}: settings.{attr}")
    assert reads > 40  # the walk found the server's reads
    assert not unknown, unknown


def test_training_options_are_generated_from_each_tasks_declaration():
    """A task's `train_options` (bert/tasks/<name>.py) are training.finetune's options with their help and default,
    and evaluate's (unset: the run's value); multitask has each once (or per task, --classify-labels) unless the task says it does not."""
    from bert.tasks import registry
    from training.multitask import MultiTaskConfig, shared_task_options

    commands = {name: {o.name: o for o in _options(name)} for name in COMMANDS}
    declared = 0
    for task in registry.TASKS.values():
        for o in task.train_options:
            finetune = commands["training.finetune"][o.name]
            assert (finetune.help, finetune.default) == (o.help, o.default), o.name
            if o.evaluate:  # the fine-tuning run's value unless given
                evaluate = commands["training.evaluate"][o.name]
                assert evaluate.default is None and evaluate.help.startswith(o.help), o.name
            in_multitask = o.name in commands["training.multitask"]
            own = f"{task.name}_{o.name}" in commands["training.multitask"]
            assert (in_multitask or own) == o.multitask and not (in_multitask and own), o.name
            declared += 1
    assert declared >= 15 and "doc_stride" in shared_task_options()
    assert "text_column" not in {f.name for f in dataclasses.fields(MultiTaskConfig)}


# ----------------------------------------------------------------------------- options a task declares


def test_the_server_generates_each_tasks_declared_options():
    """A task's serve_options (bert/tasks/<name>.py) become the server's --<task>-<name> with their help, default
    and bounds; the task's own check of them runs at startup; only a task with margins gets --<task>-verify-*."""
    from pydantic import ValidationError

    from bert.tasks import registry
    from bert.tasks.base import Task
    from serving.settings import Settings

    declared = 0
    for task in registry.TASKS.values():
        for o in task.serve_options:
            field = Settings.model_fields[f"{task.name}_{o.name}"]
            assert (field.description, field.default) == (o.help, o.default)
            declared += 1
        with_margins = type(task).margins is not Task.margins
        assert (f"{task.name}_verify_model" in Settings.model_fields) == with_margins, task.name
        if with_margins:
            field = Settings.model_fields[f"{task.name}_verify_margin"]
            assert field.default == task.verify_margin.default and task.verify_margin.help in field.description
    assert declared >= 2
    # 77 context tokens per window ([CLS] 20 [SEP] 77 [SEP]), neighbours sharing at most half of them
    assert Settings(qa_max_length=100, qa_max_question_length=20).max_doc_stride == 38
    assert registry.get("qa").max_doc_stride({"max_length": 100, "max_question_length": 20}) == 38
    with pytest.raises(ValidationError, match="qa_max_length .60. must leave room"):
        Settings(qa_max_length=60, qa_max_question_length=64)
    with pytest.raises(ValidationError, match="greater than or equal to 16"):
        Settings(qa_max_length=8)


def test_a_task_with_margins_must_declare_its_verify_margin_and_only_such_a_task():
    from dataclasses import dataclass

    from bert.tasks import registry
    from bert.tasks.base import Task, TaskOption

    @dataclass
    class Unsure(Task):
        name = "unsure-without-margin"

        def margins(self, items, features, outputs, facts, **options):
            return [0.0] * len(items)

    @dataclass
    class Sure(Task):
        name = "sure-with-margin"
        verify_margin = TaskOption("verify_margin", 0.1, "never read")

    for task in (Unsure(), Sure()):
        with pytest.raises(ValueError, match="verify_margin if and only if it has margins"):
            registry.register(task)
        assert task.name not in registry.TASKS


def test_an_offline_command_names_a_variable_it_no_longer_reads(capsys):
    from training.finetune import FinetuneConfig

    env = {"BERTSERVE_LEARNING_RATE": "1e-3", "BERTSERVE_FINETUNE_SEED": "7"}
    values = options.read(FinetuneConfig, [], environ=env, prog="python -m training.finetune")
    assert values["learning_rate"] == 5e-5 and values["seed"] == 7
    assert capsys.readouterr().err.splitlines() == [
        "warning: BERTSERVE_LEARNING_RATE is not read by python -m training.finetune: its variable is "
        "BERTSERVE_FINETUNE_LEARNING_RATE"
    ]


def test_a_task_named_as_its_route_is_its_registry_name(tmp_path, capsys):
    """`--task fill-mask` (the route's and transformers' pipeline's spelling) is fill_mask to the commands that take
    a task; a name that is neither is refused as before."""
    from batch.predict import check_task_options, default_options
    from bert.tasks.registry import canonical
    from export.cli import UsageError
    from export.onnx import main as export_main

    assert (canonical("fill-mask"), canonical("zero-shot"), canonical("fill_mask")) == (
        "fill_mask",
        "zero_shot",
        "fill_mask",
    )
    assert canonical("summar-ise") == "summar-ise" and canonical(None) is None
    given = default_options(task="zero-shot", model="m", candidate_labels="sports,food")
    assert check_task_options(given) == ["text"] and given["task"] == "zero_shot"
    # the batch command: past the task check, to the model (which does not exist)
    argv = ["--model", str(tmp_path / "no-such-model"), "--input", __file__, "--output", str(tmp_path / "out")]
    assert _batch(["--task", "fill-mask", *argv]) == 2
    error = capsys.readouterr().err
    assert "no-such-model" in error and "is not one of" not in error
    assert _batch(["--task", "fill--mask", *argv]) == 2
    assert "--task 'fill--mask' is not one of" in capsys.readouterr().err
    # the exporter: past the task check, to the next refusal (the calibration file)
    missing = str(tmp_path / "no-such-calibration.txt")
    with pytest.raises(UsageError, match="no-such-calibration"):
        export_main(["--ckpt", "tiny", "--random-init", "--task", "fill-mask", "--calibration", missing])
    with pytest.raises(UsageError, match="unknown task 'fill--mask'"):
        export_main(["--ckpt", "tiny", "--random-init", "--task", "fill--mask", "--calibration", missing])
