"""Checkpoint directories: resolve `--ckpt NAME|PATH`, load and save models (safetensors, sharded too).

A checkpoint directory is the unit every part exchanges (docs/architecture.md, "Checkpoint directory"): config.json
with Hugging Face keys, model.safetensors (or shards + model.safetensors.index.json) with Hugging
Face parameter names, and the tokenizer files. Directories written by transformers' save_pretrained
load here, and ours load there. No pickle: a legacy pytorch_model.bin is read with weights_only=True.
A checkpoint that cannot be loaded is a CheckpointError (or the config's ConfigError) naming the file and
the problem, raised before a model is allocated where it can be (check_checkpoint).

torch is imported inside the functions that need it, so resolving a name works without torch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .config import PRESETS, BertConfig
from .errors import BadInput, one_line
from .families import BERT, Family

if TYPE_CHECKING:
    import torch

    from .model import BertPreTrainedModel

log = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Unlabelled inputs of the checkpoint's own domain, which export measures int8 on (training/calibration.py)
CALIBRATION_FILE = "calibration.jsonl"

# Keys present in some checkpoints that carry no learned state of ours.
HARMLESS_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
# Parameters tied to another one: written by older transformers, never by us.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
ENCODER_PREFIXES = ("embeddings.", "embeddings_project.", "encoder.", "pooler.")


class CheckpointError(BadInput):
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
    """A directory path as given, else a name in the checkpoint store, else a Hub id; otherwise a clear error."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} is a directory but holds no config.json, so it is not a checkpoint")
        return path
    candidate = store_root() / str(name_or_path)
    if (candidate / "config.json").is_file():
        return candidate
    from . import hub  # then a Hugging Face Hub id, org/name[@revision] (bert/hub.py)

    if hub.is_hub_id(name_or_path):
        return hub.resolve(str(name_or_path), CheckpointError)
    found = list_checkpoints()
    lines = [
        f"no checkpoint {str(name_or_path)!r}: it is not a directory, and the checkpoint store "
        f"{store_root()} (set BERTSERVE_HOME to move it) has no entry of that name."
    ]
    lines.append(f"Checkpoints found: {', '.join(found)}." if found else "The store holds no checkpoints.")
    if str(name_or_path) in PRESETS:
        lines.append(
            f"{str(name_or_path)!r} is an architecture preset; pass --random-init to use it with "
            "randomly initialised weights (for benchmarking only)."
        )
    raise CheckpointError(" ".join(lines))


# ----------------------------------------------------------------------------- reading


def _read_index(directory: Path) -> dict[str, str]:
    """The weight_map of a sharded checkpoint's index, every shard name checked to be a file name inside
    `directory`: an index is data, and must not steer reading to files elsewhere. A shard that is a
    symlink is followed, as model.safetensors is: the Hugging Face cache stores every file as a symlink
    into its blobs/ folder."""
    path = directory / INDEX_NAME
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise CheckpointError(f"{path} is not a readable JSON file: {one_line(e, 200)}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f'{path} has no "weight_map" object mapping tensor names to shard files')
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.strip():
            raise CheckpointError(f"{path} maps {name!r:.80} to {shard!r:.80}, which is not a shard file name")
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise CheckpointError(
                f"{path} names shard {shard!r:.200}, outside the checkpoint directory {directory}; "
                "shards must be files in that directory"
            )
    return weight_map


def weight_files(directory: str | os.PathLike) -> list[Path]:
    """The files that hold a checkpoint's weights: the shards its index names, else model.safetensors,
    else a legacy pytorch_model.bin."""
    directory = Path(directory)
    if (directory / INDEX_NAME).is_file():
        files = []
        for shard in sorted(set(_read_index(directory).values())):
            if not (directory / shard).is_file():
                raise CheckpointError(f"{directory / INDEX_NAME} names shard {shard}, which is missing")
            files.append(directory / shard)
        return files
    for name in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME):
        if (directory / name).is_file():
            return [directory / name]
    raise CheckpointError(f"no weights in {directory}: expected {WEIGHTS_NAME}, {INDEX_NAME} or {LEGACY_WEIGHTS_NAME}")


def _not_safetensors(path: Path, error: Exception) -> CheckpointError:
    size = path.stat().st_size if path.is_file() else None
    if size == 0:
        return CheckpointError(f"{path} is empty (0 bytes), not a safetensors file")
    return CheckpointError(
        f"{path} ({size} bytes) is not a valid safetensors file (truncated or corrupt?): {one_line(error, 200)}"
    )


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    try:  # reads the header only; it also checks that the data it describes fills the file exactly
        with safe_open(path, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises SafetensorError, OSError and others
        raise _not_safetensors(path, e) from None


def _safetensors_tensors(path: Path) -> dict[str, "torch.Tensor"]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as e:  # noqa: BLE001 - as above
        raise _not_safetensors(path, e) from None


_TORCH_LOAD_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _pickle_tensors(path: Path) -> dict[str, "torch.Tensor"]:
    """A legacy pytorch_model.bin, never unpickled beyond tensors (weights_only=True); mapped, not read,
    when its format allows, so that checking its shapes first costs little."""
    import torch

    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:  # files from before torch 1.6 cannot be mapped; everything else fails again below
            if "mmap" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError, ... for a bad file
        # torch wraps the reason in paragraphs of advice (some of it to load with weights_only=False): keep the reason.
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        reason = one_line(" ".join(line for line in lines if not line.startswith(_TORCH_LOAD_ADVICE)) or lines[0], 200)
        if "GLOBAL" in reason:
            raise CheckpointError(
                f"{path} holds objects other than tensors, which are not loaded (unpickling "
                f"them could run code): {reason}"
            ) from None
        raise CheckpointError(f"{path} is not a readable PyTorch weights file: {reason}") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise CheckpointError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return state


def _read_weights(directory: str | os.PathLike, read_file) -> dict:
    """read_file(path) of every weight file, merged; with an index, every tensor it lists must be there."""
    directory = Path(directory)
    found: dict = {}
    for path in weight_files(directory):
        found.update(read_file(path))
    if (directory / INDEX_NAME).is_file():
        missing = sorted(set(_read_index(directory)) - set(found))
        if missing:
            raise CheckpointError(f"the shards of {directory / INDEX_NAME} lack tensors it lists: {_names(missing)}")
    return found


def read_tensor_shapes(directory: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, by its name in the file, from the safetensors headers alone: cheap, so a
    checkpoint is checked against its config before a model is allocated or any tensor data is read."""
    return _read_weights(
        directory,
        lambda path: (
            {k: tuple(v.shape) for k, v in _pickle_tensors(path).items()}
            if path.name == LEGACY_WEIGHTS_NAME
            else _safetensors_shapes(path)
        ),
    )


def read_state_dict(directory: str | os.PathLike) -> dict[str, "torch.Tensor"]:
    """All tensors of a checkpoint directory, by their names in the file."""
    return _read_weights(
        directory,
        lambda path: _pickle_tensors(path) if path.name == LEGACY_WEIGHTS_NAME else _safetensors_tensors(path),
    )


def _names(keys: list[str], limit: int = 8) -> str:
    """A list of tensor names for a one-line message: the first `limit`, and how many in all."""
    shown = ", ".join(keys[:limit])
    return f"[{shown}]" if len(keys) <= limit else f"[{shown}, ... ({len(keys)} in all)]"


@dataclass
class LoadReport:
    """What loading did beyond copying matching tensors; empty lists for an exact match."""

    initialised: list[str] = field(default_factory=list)  # in the model, not in the file: freshly initialised
    dropped: list[str] = field(default_factory=list)  # in the file, not used by the model
    reinitialised: list[str] = field(default_factory=list)  # shape differed (head with other labels)

    def __bool__(self) -> bool:
        return bool(self.initialised or self.dropped or self.reinitialised)


def _normalise_names(
    state: dict[str, "torch.Tensor"], model_keys: set[str], family: Family = BERT
) -> dict[str, "torch.Tensor"]:
    """Map a file's names onto the model's: the family's layout onto BERT's (bert/families/), legacy
    gamma/beta, and the `bert.` prefix that BertModel checkpoints lack and head models have."""
    wants_prefix = any(k.startswith("bert.") for k in model_keys)
    if family.weight_layouts:
        state = family.relayout_to_bert(state, *_layout_ops(state))
    out = {}
    for key, tensor in state.items():
        if key.endswith(".gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith(".beta"):
            key = key[: -len("beta")] + "bias"
        key = family.name_to_bert(key, model_keys)
        if wants_prefix and key.startswith(ENCODER_PREFIXES):
            key = "bert." + key
        elif not wants_prefix and key.startswith("bert."):
            key = key[len("bert.") :]
        out[key] = tensor
    return out


def _layout_ops(state: dict):
    """(join, split) for a family's weight layouts over this state dict's values: tensors, or their shapes."""
    if all(isinstance(v, tuple) for v in state.values()):
        return (
            lambda shapes: (sum(s[0] for s in shapes),) + tuple(shapes[0][1:]),
            lambda shape, n: [(shape[0] // n,) + tuple(shape[1:])] * n,
        )
    import torch

    return (lambda tensors: torch.cat(tensors)), (lambda tensor, n: list(tensor.chunk(n)))


def _is_head(key: str) -> bool:
    """Parameters a fine-tuning run may create fresh: anything outside the encoder, and the pooler
    (token-level checkpoints have none)."""
    body = key[len("bert.") :] if key.startswith("bert.") else key
    return not body.startswith(("embeddings.", "embeddings_project.", "encoder.")) or body.startswith("pooler.")


def _match_shapes(
    model_name: str,
    expected: dict[str, tuple],
    found: dict[str, tuple],
    *,
    from_backbone: bool,
    source: str,
    drop_unused: bool = False,
) -> LoadReport:
    """Compare the shapes of a file's tensors (names already normalised) with a model's, naming every
    missing, unexpected or mis-shaped key; `source` says which files the tensors came from. drop_unused: heads
    in the file that the model has no task for are dropped (a pretraining checkpoint's NSP head and pooler)."""
    report = LoadReport()
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
    if drop_unused and not from_backbone:
        report.dropped = [k for k in unexpected if _is_head(k)]
        unexpected = [k for k in unexpected if k not in report.dropped]
    if from_backbone:
        report.initialised = [k for k in missing if _is_head(k)]
        report.dropped = [k for k in unexpected if _is_head(k)]
        report.reinitialised = [k for k in mismatched if _is_head(k)]
        missing = [k for k in missing if k not in report.initialised]
        unexpected = [k for k in unexpected if k not in report.dropped]
        mismatched = [k for k in mismatched if k not in report.reinitialised]
    problems = []
    if missing:
        problems.append(f"missing keys {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_names(unexpected)}")
    if mismatched:
        problems.append(
            "mis-shaped keys " + _names([f"{k} (file {found[k]}, model {expected[k]})" for k in mismatched], limit=4)
        )
    if problems:
        hint = "" if from_backbone else " (to fine-tune fresh task heads on this encoder, load it as a backbone)"
        raise CheckpointError(
            f"{source} does not match {model_name} as its config.json describes it: " + "; ".join(problems) + hint
        )
    return report


def _comparable(model: "BertPreTrainedModel", state: dict) -> tuple[dict[str, tuple], dict]:
    """The model's parameter shapes, and the file's entries under the model's names, with the keys that
    carry nothing to load (tied, harmless) left out of both."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in TIED_KEYS}
    family = model.config.family
    state = _normalise_names(state, set(expected), family)
    for key in [k for k in state if k not in expected and k.removeprefix("bert.") in family.unused_parameters]:
        log.info(
            "%s %s in the checkpoint is not used by the model its config describes: skipped",
            key,
            tuple(state[key].shape),
        )
        del state[key]
    return expected, {k: v for k, v in state.items() if not k.endswith(HARMLESS_SUFFIXES) and k not in TIED_KEYS}


def _check_decoder(model: "BertPreTrainedModel", state: dict, source: str) -> None:
    """A masked LM's decoder is the word-embedding table here (tied, as transformers ties it by default), so a file's
    decoder weights are not read. transformers gives the decoder weights of its own where config.json says
    tie_word_embeddings false, and where the file holds a decoder that differs from the table: such a checkpoint is
    refused, not run with the table in the decoder's place."""
    import torch

    if TIED_KEYS[0] not in model.state_dict():
        return  # no masked-LM head: a decoder in the file is an unused head
    family = model.config.family
    decoder = state.get(family.name_from_bert(TIED_KEYS[0]))
    if decoder is None:
        return
    if not model.config.tie_word_embeddings:
        raise CheckpointError(
            f"{source}: tie_word_embeddings false (a masked-LM decoder with weights of its own) is not supported; "
            "the decoder must be the word-embedding table"
        )
    table = state.get(family.name_from_bert("bert.embeddings.word_embeddings.weight"))
    if table is not None and (decoder.shape != table.shape or not torch.equal(decoder, table)):
        raise CheckpointError(
            f"{source}: its masked-LM decoder ({family.name_from_bert(TIED_KEYS[0])}) differs from the word-embedding "
            "table it is tied to (tie_word_embeddings); a decoder with weights of its own is not supported"
        )


def match_state_dict(
    model: "BertPreTrainedModel",
    state: dict[str, "torch.Tensor"],
    *,
    from_backbone: bool = False,
    source: str = "the checkpoint",
    drop_unused: bool = False,
) -> tuple[dict[str, "torch.Tensor"], LoadReport]:
    """Check a file's tensors against a model (see _match_shapes); returns the tensors to load and a report.

    from_backbone: take the encoder and keep fresh heads where the file has none or other shapes
    (fine-tuning a task head on a pretrained encoder). Without it any difference is an error.
    """
    _check_decoder(model, state, source)
    expected, state = _comparable(model, state)
    report = _match_shapes(
        type(model).__name__,
        expected,
        {k: tuple(v.shape) for k, v in state.items()},
        from_backbone=from_backbone,
        source=source,
        drop_unused=drop_unused,
    )
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


@dataclass
class LoadPlan:
    """A checkpoint checked for loading: where it is, its config, the model class it loads into."""

    directory: Path
    config: BertConfig
    model_cls: type


def _weights_source(directory: Path) -> str:
    files = weight_files(directory)
    return str(files[0]) if len(files) == 1 else f"{directory / INDEX_NAME} with its {len(files)} shards"


def _check_sizes(config: BertConfig, shapes: dict[str, tuple], directory: Path) -> None:
    """The config's sizes against the weights' own (embeddings, feed-forward width, layer count), read from
    the headers: a config that disagrees with its weights is an error naming both files before a model is
    allocated, so that the model loading allocates is the size of the weights on disk, not the config's."""
    found = _normalise_names(shapes, set(), config.family)  # encoder names without a head model's "bert." prefix
    hidden, width = config.hidden_size, config.embedding_width
    # Each of these is (size, width): embedding tables have a row per id, nn.Linear stores (out, in).
    sized_by = {
        "embeddings.word_embeddings.weight": ("vocab_size", config.vocab_size, width),
        "embeddings.position_embeddings.weight": (
            "max_position_embeddings",
            config.max_position_embeddings + config.position_offset,
            width,
        ),
        "embeddings.token_type_embeddings.weight": ("type_vocab_size", config.type_vocab_size, width),
        "encoder.layer.0.intermediate.dense.weight": (
            "intermediate_size",
            config.intermediate_size * (2 if config.family.gated_mlp else 1),  # a gated MLP's input is twice as wide
            hidden,
        ),
    }
    problems = [
        f"{field} {getattr(config, field)} and hidden_size {hidden} in config.json, but {key} is {found[key]}"
        for key, (field, rows, columns) in sized_by.items()
        if key in found
        and tuple(found[key]) != (rows, columns)
        and (field != "max_position_embeddings" or config.position_table)  # no table built: its rows say nothing
    ]
    # A layer counts by its feed-forward weight; any other stray name is left to the per-tensor check.
    layers = sum(1 for k in found if re.fullmatch(r"encoder\.layer\.\d+\.intermediate\.dense\.weight", k))
    if layers and layers != config.num_hidden_layers:
        problems.append(
            f"num_hidden_layers {config.num_hidden_layers} in config.json, but the weights have {layers} layers"
        )
    if problems:
        raise CheckpointError(
            f"{directory / 'config.json'} does not fit {_weights_source(directory)}: " + "; ".join(problems)
        )


def check_checkpoint(
    ckpt: str | os.PathLike,
    model_cls=None,
    *,
    task: str | None = None,
    labels: list[str] | None = None,
    config_overrides: dict | None = None,
) -> LoadPlan:
    """What can be checked of a checkpoint without allocating a model or reading a tensor: the directory,
    config.json, the weight files and their headers, and the config's sizes against the weights'. A bad
    checkpoint fails here in milliseconds, as a CheckpointError or ConfigError naming the file: before a
    command starts its long steps. Arguments as for load_checkpoint, which checks the rest (every tensor
    name and shape against the model it allocates)."""
    import dataclasses

    directory = resolve_checkpoint(ckpt)
    config = BertConfig.from_json_file(directory / "config.json")
    if labels is not None:
        config = config.with_labels(list(labels))
    if config_overrides:
        config = dataclasses.replace(config, **config_overrides)
    if task is not None and not config.task_labels:
        config = dataclasses.replace(config, task=task)
    try:
        cls = model_cls or model_class_for(config, task)
    except CheckpointError as e:
        raise CheckpointError(f"{directory / 'config.json'}: {e}") from None
    _check_sizes(config, read_tensor_shapes(directory), directory)
    return LoadPlan(directory, config, cls)


def load_checkpoint(
    ckpt: str | os.PathLike,
    model_cls=None,
    *,
    task: str | None = None,
    labels: list[str] | None = None,
    from_backbone: bool = False,
    dtype: "torch.dtype | None" = None,
    device: "str | torch.device" = "cpu",
    config_overrides: dict | None = None,
):
    """Load `ckpt` (a path or a store name) into a model; returns (model, report).

    The model class comes from `model_cls`, else `task`, else the config's `architectures`.
    `labels` sets a task head's labels (fine-tuning); `from_backbone` lets heads start fresh.
    """
    plan = check_checkpoint(ckpt, model_cls, task=task, labels=labels, config_overrides=config_overrides)
    model = plan.model_cls(plan.config)
    state, report = match_state_dict(
        model, read_state_dict(plan.directory), from_backbone=from_backbone, source=_weights_source(plan.directory)
    )
    model.load_state_dict(state, strict=False)  # match_state_dict has already checked every key
    model.tie_weights()
    if report:
        log.info(
            "loaded %s into %s: initialised %s; dropped %s; re-initialised %s",
            plan.directory,
            type(model).__name__,
            report.initialised,
            report.dropped,
            report.reinitialised,
        )
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, report


def load_for_inference(
    ckpt: str | os.PathLike, *, dtype: "torch.dtype | None" = None, device: "str | torch.device" = "cpu"
):
    """Any checkpoint as the one model class serving and export run: a BertForMultiTask whose heads are the
    checkpoint's own, where it has them (bert.config.head_layout: a multi-task checkpoint's at their multi-task
    attributes, a single-task one's at transformers' names), so that every model gives one output table.
    Every head the model has must be in the file; what the file holds beyond them that no task reads (NSP,
    an unused pooler) is dropped. Returns (model, report)."""
    from .model import BertForMultiTask, without_random_init

    plan = check_checkpoint(ckpt, BertForMultiTask)
    try:
        with without_random_init():  # the file overwrites every parameter (checked below)
            model = BertForMultiTask(plan.config)
    except (ValueError, CheckpointError) as e:
        raise CheckpointError(f"{plan.directory / 'config.json'}: {e}") from None
    state, report = match_state_dict(
        model, read_state_dict(plan.directory), drop_unused=True, source=_weights_source(plan.directory)
    )
    if any(name not in state for name, _ in model.named_parameters()):
        model.init_weights()  # what the file does not hold starts as a freshly built model's would
    model.load_state_dict(state, strict=False)  # match_state_dict has already checked every key
    model.tie_weights()
    if report:
        log.info("loaded %s for inference: dropped %s", plan.directory, report.dropped)
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, report


def init_model(preset_or_config: str | BertConfig, task: str | None = None, *, seed: int = 0, **config_overrides):
    """A randomly initialised model: only for benchmarking and pretraining from scratch, never implied."""
    import torch

    config = (
        BertConfig.preset(preset_or_config, **config_overrides)
        if isinstance(preset_or_config, str)
        else preset_or_config
    )
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


def save_checkpoint(
    model: "BertPreTrainedModel",
    directory: str | os.PathLike,
    *,
    tokenizer=None,
    dtype: "torch.dtype | None" = None,
    max_shard_bytes: int | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write config.json, weights (one file, or shards of at most max_shard_bytes + an index), the
    tokenizer (an object with .save(dir), or a directory to copy its tokenizer files from) and
    checkpoint.json (what the directory holds). The directory is written aside and published whole
    (bert.atomic.publish_dir): a kill or a full disk leaves the previous one as it was."""
    from .atomic import publish_dir

    directory = Path(directory)
    with publish_dir(directory) as tmp:
        # In place inside an outer publish (a training save): clear what an earlier writer left there.
        for old in list(tmp.glob("model*.safetensors")) + [tmp / INDEX_NAME]:
            old.unlink(missing_ok=True)
        _write_checkpoint(
            model, tmp, tokenizer=tokenizer, dtype=dtype, max_shard_bytes=max_shard_bytes, extra_files=extra_files
        )
        write_manifest(tmp)
    return directory


def _write_checkpoint(model, directory: Path, *, tokenizer, dtype, max_shard_bytes, extra_files) -> None:
    from safetensors.torch import save_file

    from .atomic import pause_point

    state = {k: v for k, v in model.state_dict().items() if k not in TIED_KEYS}
    family = model.config.family
    if family.name != "bert":  # written in the family's own layout, so that transformers loads it
        sequence_head = _sequence_head(model)
        state = {family.name_from_bert(k, sequence_head, state.keys()): v for k, v in state.items()}
        state = family.relayout_from_bert(state, *_layout_ops(state))
    state = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in state.items()
    }

    config = model.config
    config.architectures = [model.architecture]
    config_dict = config.to_dict()
    stored_dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    config_dict["torch_dtype"] = str(stored_dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")

    metadata = {"format": "pt"}
    shards = _shards(state, max_shard_bytes) if max_shard_bytes else [state]
    if len(shards) == 1:
        _save_safetensors(save_file, state, directory / WEIGHTS_NAME, metadata)
        pause_point(f"{directory.name}:weights", partial=directory / WEIGHTS_NAME)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _save_safetensors(save_file, shard, directory / name, metadata)
            pause_point(f"{directory.name}:weights", partial=directory / name)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(v.numel() * v.element_size() for v in state.values())
        (directory / INDEX_NAME).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
        )

    if tokenizer is not None:
        save_tokenizer_files(tokenizer, directory)
    for name, text in (extra_files or {}).items():
        (directory / name).write_text(text)


def _sequence_head(model) -> str | None:
    """The attribute of a model's head on the pooler, if it has one (a family lays the pooler and that head out
    its own way, as one sequence classifier)."""
    from . import heads as head_kinds

    heads = getattr(model, "heads", None)
    if heads is not None:  # BertForMultiTask
        return next((model.attributes[name] for name, head in heads.items() if head_kinds.get(head.kind).pooled), None)
    from .model import BertForSequenceClassification

    return "classifier" if isinstance(model, BertForSequenceClassification) else None


def _save_safetensors(save_file, state: dict, path: Path, metadata: dict) -> None:
    try:
        save_file(state, path, metadata=metadata)
    except Exception as e:  # noqa: BLE001 - safetensors reports a full disk as SafetensorError "... (os error 28)"
        found = re.search(r"\(os error (\d+)\)", str(e))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


def save_torch_file(obj, path: str | os.PathLike) -> None:
    """torch.save through a Python file, so that a full disk or another write failure is the OSError naming
    `path` (torch's own writer reports it as "RuntimeError: basic_ios::clear: iostream error")."""
    import torch

    with open(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                cause = e.__context__
                raise OSError(cause.errno, cause.strerror, str(path)) from None
            raise


# ----------------------------------------------------------------------------- what a directory holds

MANIFEST_NAME = "checkpoint.json"


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: str | os.PathLike, **fields) -> dict:
    """checkpoint.json: the size and sha256 of every file in `directory` (itself excepted), plus `fields`
    (a training save adds the step its weights, optimizer and trainer state come from)."""
    directory = Path(directory)
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST_NAME
    }
    manifest = dict(fields, files=files)
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def verify_manifest(directory: str | os.PathLike) -> dict | None:
    """The manifest of `directory` once every file it lists is there with its size and sha256; None for a
    directory written before manifests existed. Anything else is a CheckpointError naming the file and why."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable JSON file: {one_line(e, 200) or type(e).__name__}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise CheckpointError(f'{path} has no "files" object listing what the checkpoint holds')
    for name, entry in files.items():
        file = directory / name
        if not isinstance(entry, dict) or Path(name).name != name:
            raise CheckpointError(f"{path} lists {name!r:.80} oddly; it is not a checkpoint manifest")
        if not file.is_file():
            raise CheckpointError(f"{file} is missing, though {path} lists it")
        size = file.stat().st_size
        if size != entry.get("bytes"):
            raise CheckpointError(
                f"{file} is {size} bytes, but {path} says {entry.get('bytes')} "
                "(truncated or replaced after the checkpoint was written)"
            )
        if entry.get("sha256") and _sha256(file) != entry["sha256"]:
            raise CheckpointError(
                f"{file} does not match the sha256 in {path} (corrupt or replaced after the checkpoint was written)"
            )
    return manifest


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
