"""Size and sha256 of the files a manifest lists, and the check of a directory against those entries.

Export writes the entries into an artifact's manifest.json; the server recomputes them before it trusts
the directory (docs/serving.md, "Verified artifacts"). No torch, no numpy: both sides import it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHUNK = 1 << 22


def sha256_files(paths: list[Path], chunk: int = CHUNK) -> str:
    """One digest over several files, in the given order, each prefixed by its name."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(chunk):
                digest.update(block)
    return digest.hexdigest()


def with_sidecar(path: Path) -> list[Path]:
    """A file and, for an ONNX graph with external weights, its `.data` file: what one entry covers."""
    data = path.with_name(path.name + ".data")
    return [path, data] if data.is_file() else [path]


def file_entry(path: Path) -> dict[str, Any]:
    """{"path", "bytes", "sha256"} of a file (and its `.data` sidecar), as a manifest records it."""
    files = with_sidecar(path)
    return {"path": path.name, "bytes": sum(p.stat().st_size for p in files), "sha256": sha256_files(files)}


def listed_entries(files: Any) -> dict[str, dict]:
    """A manifest's "files" (role or name -> entry) as file name -> entry; malformed entries are left out."""
    if not isinstance(files, dict):
        return {}
    return {
        e["path"]: e
        for e in files.values()
        if isinstance(e, dict)
        and isinstance(e.get("path"), str)
        and "/" not in e["path"]
        and isinstance(e.get("bytes"), int)
        and isinstance(e.get("sha256"), str)
    }


def mismatches(directory: Path, listed: dict[str, dict], names: Iterable[str]) -> list[str]:
    """What is wrong with the files `names` of `directory` against their entries in `listed`: each name that is
    present must be listed, each listed one present, with the same size and sha256. [] when all match.
    Sizes are compared first, so a truncated or grown file costs no hashing."""
    problems = []
    for name in names:
        path = directory / name
        entry = listed.get(name)
        if entry is None:
            if path.is_file():
                problems.append(f"{name} is not listed in it")
            continue
        if not path.is_file():
            problems.append(f"{name} is listed but missing")
            continue
        files = with_sidecar(path)
        size = sum(p.stat().st_size for p in files)
        if size != entry["bytes"]:
            problems.append(f"{name} has {size} bytes, the manifest says {entry['bytes']}")
        elif sha256_files(files) != entry["sha256"]:
            problems.append(f"{name} has another sha256 than the manifest says")
    return problems
