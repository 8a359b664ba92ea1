"""An artifact directory is served only as its manifest describes it (checked before anything reads its files)."""

from __future__ import annotations

from pathlib import Path

from bert.digest import listed_entries, mismatches
from runtime.model_dir import ModelError, ModelSpec

# What the server reads from an artifact directory: each must be in its manifest, with the same size and sha256.
ARTIFACT_GRAPHS = ("model.onnx", "model.plan", "model.engine")
ARTIFACT_READS = (
    *ARTIFACT_GRAPHS,
    "model.safetensors",  # an artifact served by the torch backend (bf16 weights)
    "config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
)
UNVERIFIED_HINT = (
    "re-export it (python -m export.onnx), or pass --allow-unverified (BERTSERVE_ALLOW_UNVERIFIED=1) "
    "to serve it as it is"
)


def verify_graph(spec: ModelSpec, check: bool = True) -> Path | None:
    """An int8 artifact's own exact graph (python -m export.onnx --verify-graph): a whole fp32 artifact in a
    directory of its own, whose manifest's size and sha256 the artifact's manifest records; None where it has none. One
    whose manifest is missing or is not the one recorded is refused with one line (`check` False: not checked, as
    --allow-unverified serves a directory as it is); its own files are checked against its manifest when it loads."""
    record = (spec.manifest or {}).get("verify_graph")
    if not isinstance(record, dict):
        return None
    path = spec.path / str(record.get("dir", "verify"))
    if check:
        problems = mismatches(path, listed_entries({"manifest": record.get("manifest")}), ["manifest.json"])
        if problems or not (path / "manifest.json").is_file():
            raise ModelError(
                f"{path} is not the verify graph {spec.path / 'manifest.json'} records "
                f"({'; '.join(problems) or 'it is not listed there'}); {UNVERIFIED_HINT}"
            )
    return path


def verify_artifact(spec: ModelSpec) -> None:
    """An artifact directory is served only as its manifest describes it: a directory whose manifest is missing,
    lists no files, or does not match them (a copy cut short, a file edited or swapped, a graph from another
    export beside this config) is refused with one line. Checkpoint directories are not artifacts."""
    path = spec.path
    if spec.kind == "checkpoint" and (spec.manifest or {}).get("runtime") != "torch":
        return  # a checkpoint, not an exported artifact
    graphs = ", ".join(n for n in (*ARTIFACT_GRAPHS, "model.safetensors") if (path / n).is_file())
    if not (path / "manifest.json").is_file():
        raise ModelError(
            f"{path} holds {graphs} but no manifest.json, so nothing says its files are whole and "
            f"belong together; {UNVERIFIED_HINT}"
        )
    listed = listed_entries(spec.manifest.get("files"))
    if not listed:
        raise ModelError(
            f"{path / 'manifest.json'} lists no size and sha256 of the files (an older or hand-made "
            f"manifest); {UNVERIFIED_HINT}"
        )
    problems = mismatches(path, listed, ARTIFACT_READS)
    if problems:
        raise ModelError(f"{path} does not match its manifest.json: {'; '.join(problems)}; {UNVERIFIED_HINT}")
