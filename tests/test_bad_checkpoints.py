"""Bad checkpoints and artifacts (issue 11, bar 4): export, serving and training each answer with exactly
one line on stderr, naming the file and the problem, and exit 2; never a traceback, never a server that
stays up unable to answer.

Every bad directory is made from one tiny valid checkpoint (hidden 32, 2 layers, MiniLM's tokenizer) or
one tiny valid ONNX artifact. Each case runs through export's and serving's real entry points in this
process (the bulk: a subprocess costs 2-3 s of imports), and a few through `python -m ...` subprocesses
to prove the whole stderr end to end.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from test_serving_support import build_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
INDEX = "model.safetensors.index.json"
SHARD = "model-00001-of-00001.safetensors"


# ----------------------------------------------------------------------------- the bad cases


@dataclass
class Case:
    id: str
    spoil: Callable[[Path], None]  # turns a copy of the valid directory into the bad one
    file: str | None  # the file the message must name (None: the directory itself)
    problem: str  # regex the message must match


def write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def spoil(d: Path) -> None:
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())

    return spoil


def edit_config(**changes) -> Callable[[Path], None]:
    def spoil(d: Path) -> None:
        config = json.loads((d / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key)
            else:
                config[key] = value
        (d / "config.json").write_text(json.dumps(config))

    return spoil


def garbage(n: int = 5000) -> bytes:
    return random.Random(n).randbytes(n)


def drop_tensor(name: str) -> Callable[[Path], None]:
    def spoil(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(d / "model.safetensors")
        del state[name]
        save_file(state, d / "model.safetensors", metadata={"format": "pt"})

    return spoil


def truncate_weights(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def sharded(weight_map: Callable[[list[str]], dict] | None = None, text: str | None = None):
    """The weights moved to one shard named by an index; `weight_map` rewrites the index's map, `text`
    replaces the whole index file."""

    def spoil(d: Path) -> None:
        from safetensors import safe_open

        with safe_open(d / "model.safetensors", framework="pt") as f:
            names = list(f.keys())
        (d / "model.safetensors").rename(d / SHARD)
        mapping = dict.fromkeys(names, SHARD)
        if weight_map is not None:
            mapping = weight_map(names)
        (d / INDEX).write_text(text if text is not None else json.dumps({"metadata": {}, "weight_map": mapping}))

    return spoil


def shard_symlink_out_of_the_directory(d: Path) -> None:
    sharded()(d)
    outside = d.parent / f"{d.name}-outside.bin"
    outside.write_bytes(garbage())
    (d / SHARD).unlink()
    (d / SHARD).symlink_to(outside)


def only_pickle(payload) -> Callable[[Path], None]:
    def spoil(d: Path) -> None:
        (d / "model.safetensors").unlink()
        if isinstance(payload, bytes):
            (d / "pytorch_model.bin").write_bytes(payload)
        else:
            torch.save(payload, d / "pytorch_model.bin")

    return spoil


class RunsCode:
    """A pickle that calls a function when loaded: weights_only=True must refuse it."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def no_tokenizer_json(then: Callable[[Path], None]) -> Callable[[Path], None]:
    def spoil(d: Path) -> None:
        (d / "tokenizer.json").unlink()
        then(d)

    return spoil


CHECKPOINT_CASES = [
    Case("weights-zero-bytes", write("model.safetensors", b""), "model.safetensors", r"is empty \(0 bytes\)"),
    Case(
        "weights-truncated",
        truncate_weights,
        "model.safetensors",
        r"\(\d+ bytes\) is not a valid safetensors file \(truncated or corrupt\?\)",
    ),
    Case(
        "weights-garbage",
        write("model.safetensors", garbage()),
        "model.safetensors",
        r"is not a valid safetensors file",
    ),
    Case(
        "no-weights",
        lambda d: (d / "model.safetensors").unlink(),
        None,
        r"no weights in|holds no model\.onnx, model\.plan or model\.safetensors",
    ),
    Case("index-not-json", sharded(text="{not json"), INDEX, r"is not a readable JSON file"),
    Case("index-without-weight-map", sharded(text='{"metadata": {}}'), INDEX, r'has no "weight_map" object'),
    Case(
        "index-names-parent-dir",
        sharded(lambda names: {**dict.fromkeys(names, SHARD), names[0]: "../x.safetensors"}),
        INDEX,
        r"names shard '\.\./x\.safetensors', outside the checkpoint directory",
    ),
    Case(
        "index-names-absolute-path",
        sharded(lambda names: dict.fromkeys(names, "/etc/hostname")),
        INDEX,
        r"names shard '/etc/hostname', outside the checkpoint directory",
    ),
    Case(
        "index-names-missing-shard",
        sharded(lambda names: {**dict.fromkeys(names, SHARD), names[0]: "model-00002-of-00002.safetensors"}),
        INDEX,
        r"names shard model-00002-of-00002\.safetensors, which is missing",
    ),
    Case(
        "index-lists-absent-tensor",
        sharded(lambda names: {**dict.fromkeys(names, SHARD), "extra.weight": SHARD}),
        INDEX,
        r"lack tensors it lists: \[extra\.weight\]",
    ),
    Case(
        "shard-symlink-out-of-dir-to-garbage",
        shard_symlink_out_of_the_directory,
        SHARD,
        r"is not a valid safetensors file",
    ),
    Case("pickle-garbage", only_pickle(garbage()), "pytorch_model.bin", r"is not a readable PyTorch weights file"),
    Case(
        "pickle-that-runs-code",
        only_pickle({"x": RunsCode()}),
        "pytorch_model.bin",
        r"holds objects other than tensors, which are not loaded \(unpickling them could run code\)",
    ),
    Case("pickle-not-a-state-dict", only_pickle([torch.zeros(2)]), "pytorch_model.bin", r"does not hold a state dict"),
    Case(
        "config-json-list",
        write("config.json", "[1, 2]"),
        "config.json",
        r"a BERT config is a JSON object of settings, not a JSON array",
    ),
    Case("config-not-json", write("config.json", '{"vocab_size": 3'), "config.json", r"is not valid JSON"),
    Case("config-not-utf8", write("config.json", b'{"vocab_size": "\xff"}'), "config.json", r"is not UTF-8 text"),
    Case(
        "config-missing-keys",
        edit_config(hidden_size=None, num_attention_heads=None),
        "config.json",
        r"it lacks hidden_size, num_attention_heads",
    ),
    Case(
        "config-absurd-vocab",
        edit_config(vocab_size=10**12),
        "config.json",
        r"about 3\.2e\+13 parameters \(vocab_size 1000000000000.*no BERT has more than 2e\+10",
    ),
    Case(
        "config-heads-do-not-divide-hidden",
        edit_config(num_attention_heads=3),
        "config.json",
        r"hidden_size \(32\) must be divisible by num_attention_heads \(3\)",
    ),
    Case(
        "config-negative-layers",
        edit_config(num_hidden_layers=-2),
        "config.json",
        r"num_hidden_layers must be a positive integer, got -2",
    ),
    Case(
        "config-wrong-types",
        edit_config(hidden_dropout_prob="high", id2label=["negative", "positive"]),
        "config.json",
        r"id2label must map label ids to names",
    ),
    Case(
        "config-labels-absurd",
        edit_config(id2label=None, num_labels=10**12),
        "config.json",
        r"num_labels must be an integer in 1\.\.1000000",
    ),
    Case(
        "config-does-not-fit-weights",
        edit_config(intermediate_size=48),
        "model.safetensors",
        r"config\.json does not fit .*model\.safetensors: intermediate_size 48 and hidden_size 32 in config\.json, "
        r"but encoder\.layer\.0\.intermediate\.dense\.weight is \(64, 32\)",
    ),
    Case(
        "config-vocab-does-not-fit-weights",
        edit_config(vocab_size=10**8),
        "model.safetensors",
        r"vocab_size 100000000 and hidden_size 32 in config\.json, but embeddings\.word_embeddings\.weight is "
        r"\(30522, 32\)",
    ),
    Case(
        "config-layers-do-not-fit-weights",
        edit_config(num_hidden_layers=12),
        "model.safetensors",
        r"config\.json does not fit .*model\.safetensors: num_hidden_layers 12 in config\.json, but the weights "
        r"have 2 layers",
    ),
    Case(
        "weights-lack-a-tensor",
        drop_tensor("bert.encoder.layer.1.output.dense.bias"),
        "model.safetensors",
        r"does not match Bert\w+ as its config\.json describes it: missing keys \[(bert\.)?encoder\.layer\.1\.output"
        r"\.dense\.bias\]",
    ),
    Case(
        "tokenizer-json-garbage",
        write("tokenizer.json", "garbage{"),
        "tokenizer.json",
        r"is not a usable BERT tokenizer: expected value at line 1 column 1",
    ),
    Case(
        "vocab-without-specials",
        no_tokenizer_json(write("vocab.txt", "hello\nworld\n")),
        "vocab.txt",
        r"is not a BERT vocabulary: vocabulary lacks \[CLS\] or \[SEP\]",
    ),
    Case(
        "vocab-not-utf8",
        no_tokenizer_json(write("vocab.txt", b"[PAD]\n\xff\xfe\n")),
        "vocab.txt",
        r"is not UTF-8 text \(byte 6\)",
    ),
    Case(
        "tokenizer-config-list",
        write("tokenizer_config.json", "[]"),
        "tokenizer_config.json",
        r"must hold a JSON object, not a JSON array",
    ),
]


# ----------------------------------------------------------------------------- an artifact, built without torch.onnx

INT64, FLOAT = onnx.TensorProto.INT64, onnx.TensorProto.FLOAT
BERT_INPUTS = [(n, INT64, ["batch", "sequence"]) for n in ("input_ids", "attention_mask", "token_type_ids")]


def write_graph(path: Path, inputs=BERT_INPUTS, outputs=(("logits", ["batch", 2]),)) -> None:
    """A small valid graph: the mean of the first input's ids times a weight row gives each output
    (rank 2 (batch, n), rank 3 (batch, sequence, n), or (batch, sequence) when the last dim is a name)."""
    from onnx import helper

    first, first_type, first_shape = inputs[0]
    nodes = [helper.make_node("Cast", [first], ["x"], to=FLOAT)]
    initializers, graph_outputs = [], []
    for name, shape in outputs:
        if len(shape) == 2 and isinstance(shape[1], int):  # (batch, n): the mean of each row, then a weight row
            axes = list(range(1, len(first_shape)))
            initializers.append(helper.make_tensor(f"{name}_axes", INT64, [1], [1]))
            nodes.append(helper.make_node("ReduceMean", ["x"], [f"{name}_r"], axes=axes, keepdims=0))
            nodes.append(helper.make_node("Unsqueeze", [f"{name}_r", f"{name}_axes"], [f"{name}_m"]))
            source = f"{name}_m"
        elif len(shape) == 3:  # (batch, sequence, n)
            initializers.append(helper.make_tensor(f"{name}_axes", INT64, [1], [2]))
            nodes.append(helper.make_node("Unsqueeze", ["x", f"{name}_axes"], [f"{name}_m"]))
            source = f"{name}_m"
        else:  # (batch, sequence)
            nodes.append(helper.make_node("Identity", ["x"], [name]))
            graph_outputs.append(helper.make_tensor_value_info(name, FLOAT, shape))
            continue
        initializers.append(helper.make_tensor(f"{name}_w", FLOAT, [1, shape[-1]], [0.5] * shape[-1]))
        nodes.append(helper.make_node("MatMul", [source, f"{name}_w"], [name]))
        graph_outputs.append(helper.make_tensor_value_info(name, FLOAT, shape))
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs], graph_outputs, initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def graph(**kwargs) -> Callable[[Path], None]:
    return lambda d: write_graph(d / "model.onnx", **kwargs)


ARTIFACT_CASES = [
    Case("onnx-zero-bytes", write("model.onnx", b""), "model.onnx", r"is empty \(0 bytes\), not an ONNX model"),
    Case(
        "onnx-truncated",
        lambda d: write("model.onnx", (d / "model.onnx").read_bytes()[:300])(d),
        "model.onnx",
        r"onnxruntime cannot load .*Protobuf parsing failed",
    ),
    Case("onnx-garbage", write("model.onnx", garbage()), "model.onnx", r"onnxruntime cannot load"),
    Case(
        "onnx-inputs-not-berts",
        graph(inputs=[("ids", INT64, ["b", "s"]), ("mask", INT64, ["b", "s"])]),
        "model.onnx",
        r"takes inputs ids, mask; a BERT graph takes input_ids",
    ),
    Case(
        "onnx-input-rank",
        graph(inputs=[("input_ids", INT64, ["b", "s", 4])]),
        "model.onnx",
        r"input input_ids has shape \['b', 's', 4\]; it must be \(batch, sequence\)",
    ),
    Case(
        "onnx-float-input",
        graph(inputs=[("input_ids", FLOAT, ["b", "s"])]),
        "model.onnx",
        r"input input_ids is not an integer tensor",
    ),
    Case(
        "onnx-outputs-for-another-task",
        graph(outputs=[("start_logits", ["batch", "sequence"]), ("end_logits", ["batch", "sequence"])]),
        "model.onnx",
        r"gives outputs start_logits, end_logits, none for task\(s\) classify that its directory's config\.json",
    ),
    Case(
        "onnx-output-rank",
        graph(outputs=[("logits", ["batch", "sequence", 2])]),
        "model.onnx",
        r"output logits has 3 dimensions; classify needs 2",
    ),
    Case(
        "onnx-output-label-count",
        graph(outputs=[("logits", ["batch", 5])]),
        "model.onnx",
        r"output logits gives 5 scores per classify prediction; .*config\.json has 2 classify labels",
    ),
    Case("manifest-list", write("manifest.json", "[]"), "manifest.json", r"must hold a JSON object, not a JSON array"),
    Case("manifest-not-json", write("manifest.json", "{"), "manifest.json", r"is not a readable JSON file"),
    Case("artifact-config-list", write("config.json", "[]"), "config.json", r"not a JSON array"),
    Case("artifact-config-absurd", edit_config(vocab_size=10**12), "config.json", r"parameters"),
    Case(
        "artifact-tokenizer-garbage",
        write("tokenizer.json", "garbage{"),
        "tokenizer.json",
        r"is not a usable BERT tokenizer",
    ),
]


# ----------------------------------------------------------------------------- fixtures and checks


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_dir) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("good") / "checkpoint", "classify")


@pytest.fixture(scope="module")
def artifact(checkpoint, tmp_path_factory) -> Path:
    from export.manifest import artifact_files

    directory = tmp_path_factory.mktemp("good") / "artifact"
    directory.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(checkpoint / name, directory / name)
    write_graph(directory / "model.onnx")
    (directory / "manifest.json").write_text(
        json.dumps({"task": "classify", "precision": "fp32", "files": artifact_files(directory)})
    )
    return directory


def spoiled(good: Path, case: Case, tmp_path: Path) -> Path:
    directory = tmp_path / case.id
    shutil.copytree(good, directory)
    case.spoil(directory)
    return directory


def assert_one_line(stderr: str, directory: Path, case: Case) -> None:
    """Exactly one line, `error: ...`, naming the file (as given or resolved) and matching the problem."""
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in line, line
    named = [directory / case.file, directory.resolve() / case.file] if case.file else [directory, directory.resolve()]
    assert any(str(path) in line for path in named), f"{case.file or directory} not named in: {line}"
    assert re.search(case.problem, line), f"{case.problem!r} not in: {line}"


@pytest.fixture
def no_server(monkeypatch):
    """In-process serving runs must stop at loading: reaching the app factory means a bad model got through."""

    def refuse(*args, **kwargs):
        raise AssertionError("the bad model was accepted: the server would start")

    monkeypatch.setattr("serving.app.create_app", refuse)


def serve(directory: Path, *extra: str) -> int:
    from serving.__main__ import main

    return main(["--model", str(directory), "--port", "0", "--log-level", "warning", "--threads", "1", *extra])


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=lambda c: c.id)
def test_export_bad_checkpoint(case, checkpoint, tmp_path, capsys):
    from export.onnx import cli

    directory = spoiled(checkpoint, case, tmp_path)
    out = tmp_path / "out"
    assert cli(["--ckpt", str(directory), "--out", str(out)]) == 2
    assert_one_line(capsys.readouterr().err, directory, case)
    assert not out.exists()  # refused before any work


# ----------------------------------------------------------------------------- serving


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=lambda c: c.id)
def test_serving_bad_checkpoint(case, checkpoint, tmp_path, capsys, no_server):
    directory = spoiled(checkpoint, case, tmp_path)
    assert serve(directory) == 2
    assert_one_line(capsys.readouterr().err, directory, case)


@pytest.mark.parametrize("case", ARTIFACT_CASES, ids=lambda c: c.id)
def test_serving_bad_artifact(case, artifact, tmp_path, capsys, no_server):
    """Past the manifest check (which refuses every one of these: tests/test_artifact_integrity.py), each file is
    still checked for what it holds."""
    directory = spoiled(artifact, case, tmp_path)
    assert serve(directory, "--allow-unverified") == 2
    assert_one_line(capsys.readouterr().err, directory, case)


def test_the_valid_artifact_and_checkpoint_pass_the_same_checks(artifact, checkpoint):
    """The control: the directories every bad case starts from load, and the tiny graph runs."""
    import numpy as np

    from bert.checkpoint import load_checkpoint
    from runtime.backends.onnx_backend import OnnxBackend
    from runtime.model_dir import read_model_spec
    from serving.settings import Settings

    backend = OnnxBackend(read_model_spec(artifact), Settings(threads=1))
    ids = np.ones((2, 5), dtype=np.int64)
    assert backend.run({"input_ids": ids, "attention_mask": ids, "token_type_ids": ids})["classify"].shape == (2, 2)
    model, report = load_checkpoint(checkpoint)
    assert type(model).__name__ == "BertForSequenceClassification" and not report


def test_a_legacy_pickle_of_tensors_still_loads(checkpoint, tmp_path):
    """The control for the pickle cases: pytorch_model.bin is refused for what it holds, not for being a pickle."""
    from safetensors.torch import load_file

    from bert.checkpoint import load_checkpoint

    directory = spoiled(
        checkpoint, Case("legacy", only_pickle(load_file(checkpoint / "model.safetensors")), None, ""), tmp_path
    )
    model, report = load_checkpoint(directory)
    reference, _ = load_checkpoint(checkpoint)
    assert not report and torch.equal(model.classifier.weight, reference.classifier.weight)


# ----------------------------------------------------------------------------- training


def training_argv(cli: str, directory: Path, tmp_path: Path) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence.\nAnother one.\n\nA second document.\n")
    out = ["--output-dir", str(tmp_path / "run")]
    return {
        "finetune": [
            "--task",
            "classify",
            "--ckpt",
            str(directory),
            "--train-data",
            "x.tsv",
            "--eval-data",
            "y.tsv",
            *out,
        ],
        "multitask": ["--ckpt", str(directory), "--classify-train", "x.tsv", "--classify-eval", "y.tsv", *out],
        "pretrain": ["--ckpt", str(directory), "--corpus", str(corpus), *out],
        "evaluate": ["--task", "classify", "--ckpt", str(directory), "--data", "x.tsv"],
    }[cli]


TRAINING_CASES = [
    ("finetune", "weights-truncated"),
    ("finetune", "config-absurd-vocab"),
    ("finetune", "index-names-parent-dir"),
    ("finetune", "tokenizer-json-garbage"),
    ("multitask", "config-does-not-fit-weights"),
    ("multitask", "config-json-list"),
    ("pretrain", "weights-garbage"),
    ("pretrain", "pickle-that-runs-code"),
    ("evaluate", "config-missing-keys"),
    ("evaluate", "weights-zero-bytes"),
]
CASES_BY_ID = {c.id: c for c in CHECKPOINT_CASES + ARTIFACT_CASES}


def exit_code(main, argv) -> int:
    """What `python -m training.X` exits with: training.config.run's return, or the SystemExit a contradiction
    found while parsing raises (both print one error line)."""
    from training.config import run

    try:
        return run(main, argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("cli, flag", [("finetune", "--init-preset"), ("pretrain", "--preset")])
def test_training_bad_preset_config(cli, flag, checkpoint, tmp_path, capsys):
    """A config.json given as the architecture of a randomly initialised run is checked as a checkpoint's is."""
    import importlib

    case = CASES_BY_ID["config-absurd-vocab"]
    directory = spoiled(checkpoint, case, tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence.\n")
    argv = {
        "finetune": [
            "--task",
            "classify",
            "--init-preset",
            str(directory / "config.json"),
            "--tokenizer",
            str(checkpoint),
            "--train-data",
            "x.tsv",
            "--eval-data",
            "y.tsv",
        ],
        "pretrain": [
            "--preset",
            str(directory / "config.json"),
            "--tokenizer",
            str(checkpoint),
            "--corpus",
            str(corpus),
        ],
    }[cli]
    main = importlib.import_module(f"training.{cli}").main
    assert exit_code(main, [*argv, "--output-dir", str(tmp_path / "run")]) == 2
    assert_one_line(capsys.readouterr().err, directory, case)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cli, case_id", TRAINING_CASES, ids=[f"{a}-{b}" for a, b in TRAINING_CASES])
def test_training_bad_checkpoint(cli, case_id, checkpoint, tmp_path, capsys):
    import importlib

    case = CASES_BY_ID[case_id]
    directory = spoiled(checkpoint, case, tmp_path)
    main = importlib.import_module(f"training.{cli}").main
    assert exit_code(main, training_argv(cli, directory, tmp_path)) == 2
    assert_one_line(capsys.readouterr().err, directory, case)
    assert not (tmp_path / "run").exists()  # refused before any work


# ----------------------------------------------------------------------------- end to end, as a user runs them


SUBPROCESS_CASES = [
    ("export.onnx", "weights-truncated"),
    ("export.onnx", "config-absurd-vocab"),
    ("serving", "pickle-that-runs-code"),
    ("serving", "onnx-inputs-not-berts"),
    ("training.finetune", "index-names-parent-dir"),
]


@pytest.mark.parametrize("module, case_id", SUBPROCESS_CASES, ids=[f"{a}-{b}" for a, b in SUBPROCESS_CASES])
def test_command_line_prints_one_line_and_exits_2(module, case_id, checkpoint, artifact, tmp_path):
    case = CASES_BY_ID[case_id]
    directory = spoiled(artifact if case in ARTIFACT_CASES else checkpoint, case, tmp_path)
    args = {
        "export.onnx": ["--ckpt", str(directory), "--out", str(tmp_path / "out")],
        "serving": ["--model", str(directory), "--port", "0", "--threads", "1"]
        + (["--allow-unverified"] if case in ARTIFACT_CASES else []),
        "training.finetune": training_argv("finetune", directory, tmp_path),
    }[module]
    run = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert_one_line(run.stderr, directory, case)
    assert "pwned" not in run.stdout
