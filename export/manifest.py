"""The artifact directory's layout and its manifest.json. No torch, no onnx: the server reads these.

Layout (docs/architecture.md, "Artifact directory"):
    model.onnx            the graph to serve with onnxruntime, in the manifest's precision
                          (fp32/fp16: onnxruntime-fused; int8: fused + dynamically quantised)
    model.portable.onnx   fp32, standard ONNX ops only: the input for TensorRT and other runtimes
    model.plan            TensorRT engine (written by `python -m export.tensorrt`), optional
    config.json           Hugging Face BERT config with id2label/label2id (or task_labels)
    vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json   (those present)
    manifest.json         what this module describes, with the size and sha256 of each file above: the
                          server refuses a directory whose files do not match it (bert/digest.py)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bert.checkpoint import TOKENIZER_FILES
from bert.digest import file_entry
from bert.errors import read_json_object

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
PORTABLE_FILE = "model.portable.onnx"
VERIFY_DIR = "verify"  # --verify-graph: the fp32 artifact beside an int8 model.onnx
PLAN_FILE = "model.plan"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FORMAT_VERSION = 1


class ArtifactError(Exception):
    """An artifact directory that is missing files or does not say what it holds."""


def checkpoint_files(directory: Path) -> list[Path]:
    """The files that define a checkpoint's weights and architecture, in a fixed order."""
    names = ["config.json"] + sorted(p.name for p in directory.glob("*.safetensors"))
    names += [n for n in ("model.safetensors.index.json", "pytorch_model.bin") if (directory / n).is_file()]
    return [directory / n for n in names if (directory / n).is_file()]


def artifact_files(directory: Path) -> dict[str, dict[str, Any]]:
    """The manifest's "files": size and sha256 of every file an artifact holds, by role (the graphs, config)
    or by name (tokenizer files). The server checks those it reads against these before serving."""
    roles = {
        "model": MODEL_FILE,
        "weights": WEIGHTS_FILE,  # a bf16 artifact's model, served by the torch backend (export/bf16.py)
        "portable": PORTABLE_FILE,
        "plan": PLAN_FILE,
        "config": CONFIG_FILE,
    }
    files = {role: file_entry(directory / name) for role, name in roles.items() if (directory / name).is_file()}
    files.update({name: file_entry(directory / name) for name in TOKENIZER_FILES if (directory / name).is_file()})
    return files


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = Path(directory) / MANIFEST_FILE
    path.write_text(json.dumps({"format_version": FORMAT_VERSION, **manifest}, indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ArtifactError(
            f"{directory} is not an artifact directory: no {MANIFEST_FILE} "
            "(create one with `python -m export.onnx --ckpt ...`)"
        )
    manifest = read_json_object(path, ArtifactError)
    for key in ("task", "precision", "inputs", "outputs", "shape_range"):
        if key not in manifest:
            raise ArtifactError(f"{path} lacks the key {key!r}")
    return manifest
