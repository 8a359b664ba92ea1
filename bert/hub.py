"""Hugging Face Hub model ids for --model and --ckpt: `org/name[@revision]` -> a snapshot directory.

A name that is no local directory and no checkpoint store entry, and reads as `org/name` (optionally
`@branch`, `@tag` or `@commit`), is looked up with huggingface_hub, in its cache (HF_HOME / HF_HUB_CACHE)
and, unless HF_HUB_OFFLINE=1, on the Hub (HF_ENDPOINT, HF_TOKEN as huggingface_hub reads them).
Only the files bertserve reads are fetched (ALLOW_PATTERNS): config, tokenizer, safetensors weights and
their index, a sentence-transformers model's pooling files. Never code, pickle or other frameworks'
weights, so nothing downloaded can run. Refused, in one line:
- a config that asks for custom code (`auto_map`) that no family implements (bert/families/): bertserve
  never runs a repository's code;
- a repository whose weights are pickle only (pytorch_model.bin). A pickle file is parsed, even with
  torch's weights_only unpickler, and that parser has had bypasses; safetensors is plain data. A local
  pytorch_model.bin still loads (bert/checkpoint.py), as that file is the user's own.
huggingface_hub is imported inside the functions: without it, local paths work and an id is one line
saying what to install. No torch here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

ALLOW_PATTERNS = [
    "config.json",
    "checkpoint.json",  # checkpoint.json: what a bertserve checkpoint holds (sizes, sha256, step)
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*-of-*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",  # byte-level BPE tokenizers without a tokenizer.json
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "*Pooling/config.json",
]
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"  # the Hub's repository and namespace names
_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9_.][A-Za-z0-9_./-]*))?")


_resolved: dict[str, Path] = {}  # id -> its snapshot, for the several parts of one command that resolve it


class HubError(Exception):
    """A Hub id that cannot be resolved to a usable snapshot."""


def parse_id(name: str) -> tuple[str, str | None] | None:
    """`org/name[@revision]` -> (repo_id, revision or None); None for anything else (a path, a store name)."""
    match = _ID.fullmatch(str(name))
    if match is None or ".." in match["repo"]:
        return None
    return match["repo"], match["revision"]


def is_hub_id(name) -> bool:
    return parse_id(str(name)) is not None


def resolve(name: str, error: type[Exception] = HubError) -> Path:
    """The snapshot directory of Hub id `name`, downloaded if needed and allowed; `error` (one line) otherwise.
    The caller has already looked for a local directory and a store entry of that name."""
    parsed = parse_id(name)
    if parsed is None:
        raise error(f"{name!r} is not a Hugging Face Hub id (org/name[@revision])")
    if name in _resolved:  # one snapshot per run, even if the branch moves on the Hub meanwhile
        return _resolved[name]
    repo_id, revision = parsed
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise error(
            f"{name!r} is neither a local directory nor a checkpoint store entry; as a Hugging Face Hub id it "
            "needs huggingface_hub, which is not installed (pip install huggingface_hub)"
        ) from None
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        with _quiet_http_logs():
            folder = snapshot_download(
                repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=offline
            )
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors, OSError, httpx's: each explained below
        raise error(_explain(name, repo_id, revision, offline, e)) from None
    directory = Path(folder)
    _check_snapshot(name, repo_id, directory, _repo_files(repo_id, directory.name), error)
    log.info("%s: snapshot %s in %s", name, directory.name, directory.parent.parent)
    _resolved[name] = directory
    return directory


@contextlib.contextmanager
def _quiet_http_logs():
    """A CLI that logs at INFO would print one line per HTTP request huggingface_hub's client makes, before
    the one line that matters; quiet them for the download only, and leave the levels as they were."""
    loggers = [logging.getLogger(name) for name in ("httpx2", "httpx", "huggingface_hub")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _explain(name: str, repo_id: str, revision: str | None, offline: bool, e: Exception) -> str:
    from huggingface_hub import constants
    from huggingface_hub.utils import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache, endpoint = constants.HF_HUB_CACHE, constants.ENDPOINT
    head = f"{name!r} is neither a local directory nor a checkpoint store entry; as a Hugging Face Hub id:"
    cause = " ".join(str(e).split())[:300]
    if isinstance(e, RevisionNotFoundError):
        return f"{head} {repo_id} has no revision {revision!r} on {endpoint}; give a branch, tag or commit it has"
    if isinstance(e, RepositoryNotFoundError):
        return f"{head} {endpoint} has no repository {repo_id} (or it is private or gated: set HF_TOKEN); check the id"
    if isinstance(e, LocalEntryNotFoundError):
        what = repo_id + (f" at revision {revision!r}" if revision else "")
        if offline:
            return (
                f"{head} {what} is not in the cache {cache} (complete), and HF_HUB_OFFLINE=1 forbids downloading "
                "it; run once with network access, set HF_HOME to the cache that has it, or pass a local directory"
            )
        return (
            f"{head} {endpoint} could not be reached ({type(e.__cause__ or e).__name__}) and {what} is not in "
            f"the cache {cache}; check the network or HF_ENDPOINT, or pass a local directory"
        )
    if isinstance(e, HfHubHTTPError):
        return f"{head} {endpoint} answered {cause}"
    return f"{head} {type(e).__name__}: {cause}"


def _repo_files(repo_id: str, commit: str) -> list[str] | None:
    """Every file of the repository at `commit`, from the listing huggingface_hub keeps beside its cache
    (written by the download), or None where this huggingface_hub keeps none."""
    try:
        from huggingface_hub import get_cached_repo_tree

        return [f.path for f in get_cached_repo_tree(repo_id, revision=commit)]
    except Exception:  # noqa: BLE001 - ImportError (older huggingface_hub), no listing cached
        return None


def _own_code(config_name: str, config: dict) -> bool:
    """Whether a config's auto_map asks for code bertserve does not implement itself (a family's
    auto_map_classes); a tokenizer's own code, always."""
    from .families import UnsupportedFamily, family_of

    if config_name != "config.json":
        return True
    try:
        return bool(family_of(config.get("model_type", "bert")).unimplemented_classes(config["auto_map"]))
    except UnsupportedFamily:
        return True


def _check_snapshot(name: str, repo_id: str, directory: Path, files: list[str] | None, error: type[Exception]) -> None:
    for config_name in ("config.json", "tokenizer_config.json"):
        path = directory / config_name
        try:
            config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError):
            continue  # the checkpoint reader reports a bad file, naming it
        if isinstance(config, dict) and config.get("auto_map") and _own_code(config_name, config):
            raise error(
                f"{name!r}: {config_name} of {repo_id} asks for the repository's own code (auto_map "
                f"{sorted(config['auto_map'])}); bertserve never runs downloaded code"
            )
    if any((directory / f).is_file() for f in SAFETENSORS):
        if not (directory / "config.json").is_file():
            raise error(f"{name!r}: {repo_id} has no config.json, so it is not a model checkpoint bertserve can load")
        return
    listed = files or []
    pickles = [f for f in listed if f.endswith(PICKLE_SUFFIXES) and "/" not in f]
    code = [f for f in listed if f.endswith(".py")]
    if pickles:
        raise error(
            f"{name!r}: {repo_id} has only pickle weights ({', '.join(pickles[:3])}), which bertserve does "
            "not download; convert them to safetensors (transformers' save_pretrained writes "
            "model.safetensors) and use that repository or directory"
        )
    if code:
        raise error(
            f"{name!r}: {repo_id} has no safetensors weights, only its own model code "
            f"({', '.join(code[:3])}); bertserve never runs downloaded code"
        )
    raise error(
        f"{name!r}: {repo_id} has no model.safetensors (nor a sharded index)"
        + ("" if files is not None else " in the cache")
        + "; bertserve loads safetensors weights only"
    )
