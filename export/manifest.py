"""The artifact directory's layout and its manifest.json. No torch, no onnx: the server reads these.

Layout (ARCHITECTURE.md "Artifact directory"):
    model.onnx            the graph to serve with onnxruntime, in the manifest's precision
                          (fp32/fp16: onnxruntime-fused; int8: fused + dynamically quantised)
    model.portable.onnx   fp32, standard ONNX ops only: the input for TensorRT and other runtimes
    model.plan            TensorRT engine (written by `python -m export.tensorrt`), optional
    config.json           Hugging Face BERT config with id2label/label2id (or task_labels)
    vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json   (those present)
    manifest.json         what this file module describes
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bert.errors import read_json_object

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
PORTABLE_FILE = "model.portable.onnx"
PLAN_FILE = "model.plan"
FORMAT_VERSION = 1


class ArtifactError(Exception):
    """An artifact directory that is missing files or does not say what it holds."""


def sha256_files(paths: list[Path], chunk: int = 1 << 22) -> str:
    """One digest over several files, in the given order, each prefixed by its name."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(chunk):
                digest.update(block)
    return digest.hexdigest()


def checkpoint_files(directory: Path) -> list[Path]:
    """The files that define a checkpoint's weights and architecture, in a fixed order."""
    names = ["config.json"] + sorted(p.name for p in directory.glob("*.safetensors"))
    names += [n for n in ("model.safetensors.index.json", "pytorch_model.bin") if (directory / n).is_file()]
    return [directory / n for n in names if (directory / n).is_file()]


def file_entry(path: Path) -> dict[str, Any]:
    files = [path] + ([path.with_name(path.name + ".data")] if path.with_name(path.name + ".data").is_file() else [])
    return {"path": path.name, "bytes": sum(p.stat().st_size for p in files), "sha256": sha256_files(files)}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = Path(directory) / MANIFEST_FILE
    path.write_text(json.dumps({"format_version": FORMAT_VERSION, **manifest}, indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ArtifactError(f"{directory} is not an artifact directory: no {MANIFEST_FILE} "
                            "(create one with `python -m export.onnx --ckpt ...`)")
    manifest = read_json_object(path, ArtifactError)
    for key in ("task", "precision", "inputs", "outputs", "shape_range"):
        if key not in manifest:
            raise ArtifactError(f"{path} lacks the key {key!r}")
    return manifest
