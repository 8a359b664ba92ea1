"""Checkpoint directories: resolve `--ckpt NAME|PATH`, load and save models (safetensors, sharded too).

A checkpoint directory is the unit every part of bertserve exchanges (ARCHITECTURE.md): config.json
with Hugging Face keys, model.safetensors (or shards + model.safetensors.index.json) with Hugging
Face parameter names, and the tokenizer files. Directories written by transformers' save_pretrained
load here, and ours load there. No pickle: a legacy pytorch_model.bin is read with weights_only=True.

torch is imported inside the functions that need it, so resolving a name works without torch.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .config import PRESETS, BertConfig

if TYPE_CHECKING:
    import torch

    from .model import BertPreTrainedModel

log = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_MAX_SHARD_BYTES = 15_000_000  # under 16 MiB: shards travel through size-capped channels whole

# Keys present in some checkpoints that carry no learned state of ours.
HARMLESS_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
# Parameters tied to another one: written by older transformers, never by us.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")


class CheckpointError(Exception):
    """A checkpoint that cannot be found, read or matched to a model."""


# ----------------------------------------------------------------------------- the store


def store_root() -> Path:
    """`$BERTSERVE_HOME/checkpoints`, default `./checkpoints`."""
    return Path(os.environ.get("BERTSERVE_HOME", ".")) / "checkpoints"


def list_checkpoints(root: Path | None = None) -> list[str]:
    root = root or store_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """A directory path as given, else a name in the checkpoint store; otherwise a clear error."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} is a directory but holds no config.json, so it is not a checkpoint")
        return path
    candidate = store_root() / str(name_or_path)
    if (candidate / "config.json").is_file():
        return candidate
    found = list_checkpoints()
    lines = [f"no checkpoint {str(name_or_path)!r}: it is not a directory, and the checkpoint store "
             f"{store_root()} (set BERTSERVE_HOME to move it) has no entry of that name."]
    lines.append(f"Checkpoints found: {', '.join(found)}." if found else "The store holds no checkpoints.")
    if str(name_or_path) in PRESETS:
        lines.append(f"{str(name_or_path)!r} is an architecture preset; pass --random-init to use it with "
                     "randomly initialised weights (for benchmarking only).")
    raise CheckpointError(" ".join(lines))


# ----------------------------------------------------------------------------- reading


def read_state_dict(directory: str | os.PathLike) -> dict[str, "torch.Tensor"]:
    """All tensors of a checkpoint directory, by their names in the file."""
    import torch
    from safetensors.torch import load_file

    directory = Path(directory)
    if (directory / INDEX_NAME).is_file():
        index = json.loads((directory / INDEX_NAME).read_text())
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            if not (directory / shard).is_file():
                raise CheckpointError(f"{directory / INDEX_NAME} names shard {shard}, which is missing")
            state.update(load_file(directory / shard))
        missing = set(index["weight_map"]) - set(state)
        if missing:
            raise CheckpointError(f"shards in {directory} lack tensors the index lists: {sorted(missing)[:10]}")
        return state
    if (directory / WEIGHTS_NAME).is_file():
        return load_file(directory / WEIGHTS_NAME)
    if (directory / LEGACY_WEIGHTS_NAME).is_file():
        return torch.load(directory / LEGACY_WEIGHTS_NAME, map_location="cpu", weights_only=True)
    raise CheckpointError(f"no weights in {directory}: expected {WEIGHTS_NAME}, {INDEX_NAME} or {LEGACY_WEIGHTS_NAME}")


@dataclass
class LoadReport:
    """What loading did beyond copying matching tensors; empty lists for an exact match."""
    initialised: list[str] = field(default_factory=list)  # in the model, not in the file: freshly initialised
    dropped: list[str] = field(default_factory=list)  # in the file, not used by the model
    reinitialised: list[str] = field(default_factory=list)  # shape differed (head with other labels)

    def __bool__(self) -> bool:
        return bool(self.initialised or self.dropped or self.reinitialised)


def _normalise_names(state: dict[str, "torch.Tensor"], model_keys: set[str]) -> dict[str, "torch.Tensor"]:
    """Map a file's names onto the model's: legacy gamma/beta, and the `bert.` prefix that
    BertModel checkpoints lack and head models have."""
    wants_prefix = any(k.startswith("bert.") for k in model_keys)
    out = {}
    for key, tensor in state.items():
        if key.endswith(".gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith(".beta"):
            key = key[: -len("beta")] + "bias"
        if wants_prefix and key.startswith(ENCODER_PREFIXES):
            key = "bert." + key
        elif not wants_prefix and key.startswith("bert."):
            key = key[len("bert."):]
        out[key] = tensor
    return out


def _is_head(key: str) -> bool:
    """Parameters a fine-tuning run may create fresh: anything outside the encoder, and the pooler
    (token-level checkpoints have none)."""
    body = key[len("bert."):] if key.startswith("bert.") else key
    return not body.startswith(("embeddings.", "encoder.")) or body.startswith("pooler.")


def match_state_dict(model: "BertPreTrainedModel", state: dict[str, "torch.Tensor"], *,
                     from_backbone: bool = False) -> tuple[dict[str, "torch.Tensor"], LoadReport]:
    """Check a file's tensors against a model, naming every missing, unexpected or mis-shaped key.

    from_backbone: take the encoder and keep fresh heads where the file has none or other shapes
    (fine-tuning a task head on a pretrained encoder). Without it any difference is an error.
    """
    expected = model.state_dict()
    for tied in TIED_KEYS:
        expected.pop(tied, None)
    state = _normalise_names(state, set(expected))
    state = {k: v for k, v in state.items() if not k.endswith(HARMLESS_SUFFIXES) and k not in TIED_KEYS}

    report = LoadReport()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(k for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if from_backbone:
        report.initialised = [k for k in missing if _is_head(k)]
        report.dropped = [k for k in unexpected if _is_head(k)]
        report.reinitialised = [k for k in mismatched if _is_head(k)]
        missing = [k for k in missing if k not in report.initialised]
        unexpected = [k for k in unexpected if k not in report.dropped]
        mismatched = [k for k in mismatched if k not in report.reinitialised]
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if mismatched:
        problems.append("mis-shaped keys " + ", ".join(
            f"{k} (file {tuple(state[k].shape)}, model {tuple(expected[k].shape)})" for k in mismatched))
    if problems:
        hint = "" if from_backbone else " (to fine-tune fresh task heads on this encoder, load it as a backbone)"
        raise CheckpointError(f"checkpoint does not match {type(model).__name__}: " + "; ".join(problems) + hint)
    usable = {k: v for k, v in state.items() if k in expected and k not in report.reinitialised}
    return usable, report


# ----------------------------------------------------------------------------- loading


def model_class_for(config: BertConfig, task: str | None = None):
    from .model import ARCHITECTURES, TASK_ARCHITECTURES, BertForMultiTask

    if config.task_labels:
        return BertForMultiTask
    task = task or config.task
    if task:
        return TASK_ARCHITECTURES[task]
    for name in config.architectures or ["BertModel"]:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise CheckpointError(f"config names architectures {config.architectures}; known: {sorted(ARCHITECTURES)}")


def load_checkpoint(ckpt: str | os.PathLike, model_cls=None, *, task: str | None = None,
                    labels: list[str] | None = None, from_backbone: bool = False,
                    dtype: "torch.dtype | None" = None, device: "str | torch.device" = "cpu",
                    config_overrides: dict | None = None):
    """Load `ckpt` (a path or a store name) into a model; returns (model, report).

    The model class comes from `model_cls`, else `task`, else the config's `architectures`.
    `labels` sets a task head's labels (fine-tuning); `from_backbone` lets heads start fresh.
    """
    import dataclasses

    directory = resolve_checkpoint(ckpt)
    config = BertConfig.from_json_file(directory / "config.json")
    if labels is not None:
        config = config.with_labels(list(labels))
    if config_overrides:
        config = dataclasses.replace(config, **config_overrides)
    if task is not None and not config.task_labels:
        config = dataclasses.replace(config, task=task)
    cls = model_cls or model_class_for(config, task)
    model = cls(config)
    state, report = match_state_dict(model, read_state_dict(directory), from_backbone=from_backbone)
    model.load_state_dict(state, strict=False)  # match_state_dict has already checked every key
    model.tie_weights()
    if report:
        log.info("loaded %s into %s: initialised %s; dropped %s; re-initialised %s", directory,
                 cls.__name__, report.initialised, report.dropped, report.reinitialised)
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, report


def init_model(preset_or_config: str | BertConfig, task: str | None = None, *, seed: int = 0, **config_overrides):
    """A randomly initialised model: only for benchmarking and pretraining from scratch, never implied."""
    import torch

    config = (BertConfig.preset(preset_or_config, **config_overrides) if isinstance(preset_or_config, str)
              else preset_or_config)
    torch.manual_seed(seed)
    return model_class_for(config, task)(config)


# ----------------------------------------------------------------------------- saving


def _shards(state: dict[str, "torch.Tensor"], max_bytes: int) -> list[dict[str, "torch.Tensor"]]:
    shards: list[dict] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    return shards


def save_checkpoint(model: "BertPreTrainedModel", directory: str | os.PathLike, *, tokenizer=None,
                    dtype: "torch.dtype | None" = None, max_shard_bytes: int | None = None,
                    extra_files: dict[str, str] | None = None) -> Path:
    """Write config.json, weights (one file, or shards of at most max_shard_bytes + an index) and the
    tokenizer (an object with .save(dir), or a directory to copy its tokenizer files from)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in list(directory.glob("model*.safetensors")) + [directory / INDEX_NAME]:
        old.unlink(missing_ok=True)  # never leave shards of an earlier save next to this one

    state = {k: v for k, v in model.state_dict().items() if k not in TIED_KEYS}
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu().contiguous()
             for k, v in state.items()}

    config = model.config
    config.architectures = [type(model).__name__]
    config_dict = config.to_dict()
    stored_dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    config_dict["torch_dtype"] = str(stored_dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")

    metadata = {"format": "pt"}
    shards = _shards(state, max_shard_bytes) if max_shard_bytes else [state]
    if len(shards) == 1:
        save_file(state, directory / WEIGHTS_NAME, metadata=metadata)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, directory / name, metadata=metadata)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(v.numel() * v.element_size() for v in state.values())
        (directory / INDEX_NAME).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")

    if tokenizer is not None:
        save_tokenizer_files(tokenizer, directory)
    for name, text in (extra_files or {}).items():
        (directory / name).write_text(text)
    return directory


def save_tokenizer_files(tokenizer, directory: Path) -> None:
    if hasattr(tokenizer, "save"):
        tokenizer.save(directory)
        return
    source = Path(tokenizer)
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not copied:
        raise CheckpointError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {source}")
    for name in copied:
        if (source / name).resolve() != (directory / name).resolve():
            shutil.copyfile(source / name, directory / name)
