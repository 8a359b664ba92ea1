"""python -m export.triton: an artifact directory -> a Triton Inference Server model repository.

    REPO/NAME/config.pbtxt        backend, max_batch_size, inputs/outputs (names, dtypes, dims without
                                  the batch axis), dynamic batching, label_filename for label scores
    REPO/NAME/1/model.onnx        (onnxruntime backend) or model.plan (tensorrt backend)
    REPO/NAME/labels.txt          one label per line, output index order (ner_labels.txt for multi-task NER)
    REPO/NAME/tokenizer files, config.json, manifest.json   for clients that tokenise (Triton ignores them)

The config is written as text; tests parse it with Triton's own protobuf schema (tritonclient).
REPO/NAME is written aside and replaces what was there by one rename (bert/atomic.py): Triton polling the
repository never loads half a model, and a kill leaves the previous one.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bert import options
from bert.atomic import publish_dir
from bert.checkpoint import TOKENIZER_FILES
from bert.options import option
from bert.tasks import registry

from .cli import UsageError, run
from .manifest import MODEL_FILE, PLAN_FILE, read_manifest

TRITON_DTYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
BACKENDS = {"onnxruntime": ("onnxruntime", MODEL_FILE), "tensorrt": ("tensorrt", PLAN_FILE)}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class TritonOptions:
    """python -m export.triton's options (bert/options.py: each is also an env var BERTSERVE_TRITON_<NAME>)."""

    env_prefix = "BERTSERVE_TRITON_"  # bert/options.py: an env var belongs to one command

    artifact: str = option(metavar="DIR", help="artifact directory from python -m export.onnx")
    repo: str = option(metavar="OUT", help="model repository root (created); the model goes to OUT/NAME")
    name: str | None = option(
        None, metavar="NAME", help="model name in Triton (default: the artifact directory's name)"
    )
    max_batch: int | None = option(
        None,
        metavar="N",
        help=(
            "max_batch_size in config.pbtxt (default: the manifest's max batch; for tensorrt at most the engine "
            "profile's max batch)"
        ),
        minimum=1,
    )
    backend: str = option(
        "onnxruntime",
        choices=tuple(BACKENDS),
        help=(
            "onnxruntime: serve model.onnx; tensorrt: serve model.plan (build it first with python -m export.tensorrt)"
        ),
    )
    queue_delay_us: int = option(
        1000,
        metavar="US",
        help=("dynamic batching: longest time a request waits for others to join its batch"),
        minimum=0,
    )


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser(
        TritonOptions,
        prog="python -m export.triton",
        description="Write a Triton Inference Server model repository entry from an artifact directory.",
        epilog="Exit status: 0 written; 2 bad request (no artifact, no engine for --backend tensorrt, bad name).",
    )


def label_files(manifest: dict) -> dict[str, tuple[str, list[str]]]:
    """output name -> (labels file name, labels) for outputs that score labels."""
    labels = manifest.get("labels")
    labelled = registry.names(labelled=True)
    if manifest["task"] in labelled and labels:
        return {name: ("labels.txt", labels) for name in registry.TASKS[manifest["task"]].single_graph_outputs}
    if manifest["task"] == "multi" and isinstance(labels, dict):
        # the first labelled task's labels in labels.txt (Triton's classification extension reads that name)
        return {
            name: ("labels.txt" if i == 0 else f"{task}_labels.txt", labels[task])
            for i, task in enumerate(t for t in labelled if labels.get(t))
            for name in registry.TASKS[task].graph_outputs
        }
    return {}


def _dims(shape: list) -> str:
    """Manifest shape without the batch axis; named (dynamic) axes become -1."""
    return ", ".join(str(d) if isinstance(d, int) else "-1" for d in shape[1:])


def config_pbtxt(manifest: dict, name: str, backend: str, max_batch: int, queue_delay_us: int) -> str:
    labels = label_files(manifest)
    lines = [f'name: "{name}"', f'backend: "{BACKENDS[backend][0]}"', f"max_batch_size: {max_batch}", "input ["]
    inputs = manifest["inputs"]
    for i, spec in enumerate(inputs):
        lines += [
            "  {",
            f'    name: "{spec["name"]}"',
            f"    data_type: {TRITON_DTYPES[spec['dtype']]}",
            f"    dims: [ {_dims(spec['shape'])} ]",
            "  }" + ("," if i < len(inputs) - 1 else ""),
        ]
    lines += ["]", "output ["]
    outputs = manifest["outputs"]
    for i, spec in enumerate(outputs):
        lines += [
            "  {",
            f'    name: "{spec["name"]}"',
            f"    data_type: {TRITON_DTYPES[spec['dtype']]}",
            f"    dims: [ {_dims(spec['shape'])} ]",
        ]
        if spec["name"] in labels:
            lines.append(f'    label_filename: "{labels[spec["name"]][0]}"')
        lines.append("  }" + ("," if i < len(outputs) - 1 else ""))
    lines += [
        "]",
        "dynamic_batching {",
        f"  max_queue_delay_microseconds: {queue_delay_us}",
        "}",
        "version_policy: { latest: { num_versions: 1 } }",
    ]
    return "\n".join(lines) + "\n"


def write_repository(
    artifact: Path, repo: Path, name: str, backend: str, max_batch: int | None = None, queue_delay_us: int = 1000
) -> Path:
    manifest = read_manifest(artifact)
    if not NAME_PATTERN.match(name):
        raise UsageError(f"model name {name!r} may only use letters, digits, '_', '-' and '.'")
    model_file = BACKENDS[backend][1]
    if not (artifact / model_file).is_file():
        hint = (
            "build it with python -m export.tensorrt --artifact DIR"
            if backend == "tensorrt"
            else "re-export with python -m export.onnx"
        )
        raise UsageError(f"{artifact} has no {model_file} for the {backend} backend; {hint}")
    limit = manifest["shape_range"]["max_batch"]
    if backend == "tensorrt" and "tensorrt" in manifest:
        limit = manifest["tensorrt"]["profile"]["max"][0]
    max_batch = limit if max_batch is None else max_batch  # 0 is refused, not taken as the default
    if max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1, got {max_batch}")
    if backend == "tensorrt" and max_batch > limit:
        raise UsageError(f"--max-batch {max_batch} exceeds the engine's profile (max batch {limit})")

    model_dir = repo / name
    with publish_dir(model_dir) as tmp:
        version_dir = tmp / "1"
        version_dir.mkdir()
        shutil.copyfile(artifact / model_file, version_dir / model_file)
        if (artifact / (model_file + ".data")).is_file():
            shutil.copyfile(artifact / (model_file + ".data"), version_dir / (model_file + ".data"))
        (tmp / "config.pbtxt").write_text(config_pbtxt(manifest, name, backend, max_batch, queue_delay_us))
        for file_name, labels in label_files(manifest).values():
            (tmp / file_name).write_text("".join(f"{label}\n" for label in labels), encoding="utf-8")
        for extra in (*TOKENIZER_FILES, "config.json", "manifest.json"):
            if (artifact / extra).is_file():
                shutil.copyfile(artifact / extra, tmp / extra)
    return model_dir


def main(argv=None) -> None:
    args = TritonOptions(**options.read(TritonOptions, argv, parser=build_parser()))
    artifact = Path(args.artifact)
    model_dir = write_repository(
        artifact,
        Path(args.repo),
        args.name or artifact.resolve().name,
        args.backend,
        args.max_batch,
        args.queue_delay_us,
    )
    print(f"triton model: {model_dir} (start with: tritonserver --model-repository {Path(args.repo)})")


def cli(argv=None) -> int:
    return run(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
