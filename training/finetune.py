"""python -m training.finetune --task TASK (a trainable task: classify, ner, qa, ...): fine-tune a checkpoint, evaluate, save best/ and last/.

    python -m training.finetune --task classify --ckpt PATH --train-data train.tsv --eval-data dev.tsv \
        --output-dir runs/sst2 --learning-rate 1e-4 --num-epochs 1 --max-seq-length 64

Writes <output-dir>/best (checkpoint + metrics.json + finetune_config.json), <output-dir>/last
(the same, plus trainer state for --resume), log.jsonl and metrics.json.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from bert.options import flag, option
from bert.tasks import registry
from training import data_checks
from training.config import TrainConfig, is_model_spec, model_config, parse_config, run

TASKS = registry.names(trainable=True)


def trainable_task(name: str):
    """The trainable task called `name`; an unknown or untrainable one is UnknownTask, one line naming the
    trainable tasks (training.config.run: exit 2)."""
    if name not in TASKS:
        raise registry.UnknownTask(f"--task must be one of {', '.join(TASKS)}, got {name!r}")
    return registry.get(name)


@dataclass
class FinetuneOptions(TrainConfig):
    """The options of every fine-tuning run; FinetuneConfig adds the trainable tasks' own (task_option_fields)."""

    env_prefix = "BERTSERVE_FINETUNE_"  # bert/options.py: an env var belongs to one command

    task: str = option("", "a trainable task: classify | ner | qa ...")
    ckpt: str = option(
        "",
        'checkpoint path, store name or Hub id `org/name[@revision]` (README "Models from the Hub") to start from (its encoder; heads start fresh if absent)',
    )
    init_preset: str = option(
        "", "instead of --ckpt: random weights of a preset or a config.json (tests; needs --tokenizer)"
    )
    tokenizer: str = option("", "tokenizer directory (default: the checkpoint's)")
    train_data: str = option(
        "",
        "; ".join(
            f"{name}: {registry.get(name).train_data_help}" for name in TASKS if registry.get(name).train_data_help
        ),
    )
    eval_data: str = option("", "same format; for qa it may be empty when --heldout-articles > 0")
    max_seq_length: int = option(
        128,
        "longest encoded input (longer inputs are truncated; qa: windowed); at most the model's "
        "max_position_embeddings",
        minimum=8,
    )
    eval_batch_size: int = option(64, "examples per evaluation batch", minimum=1)
    max_train_examples: int = option(0, "use only the first N training examples (0 = all)", minimum=0)
    max_eval_examples: int = option(0, "evaluate on only the first N examples (0 = all)", minimum=0)
    stop_at_step: int = option(
        0, "stop as if interrupted after this step (schedule unchanged; then --resume)", minimum=0
    )

    def task_problems(self) -> list[str]:
        task = trainable_task(self.task)
        problems = []
        if bool(self.ckpt) == bool(self.init_preset):
            problems.append("give exactly one of --ckpt (pretrained weights) and --init-preset (random weights)")
        if self.init_preset and not is_model_spec(self.init_preset):
            problems.append(f"--init-preset {self.init_preset!r} is neither a preset nor a config.json")
        elif self.init_preset:
            # a config.json that is not a BERT config: its one-line error, now
            positions = model_config(self.init_preset).max_position_embeddings
            if self.max_seq_length > positions:
                problems.append(
                    f"{flag(self, 'max_seq_length')} {self.max_seq_length} exceeds the model's "
                    f"max_position_embeddings {positions}"
                )
        if self.init_preset and not self.tokenizer:
            problems.append("--init-preset needs --tokenizer (a directory with vocab.txt or tokenizer.json)")
        if not self.train_data:
            problems.append(f"{flag(self, 'train_data')} is required")
        problems += foreign_options(self, task)
        problems += task.train_problems(self)
        if self.ckpt and not problems:
            from bert.checkpoint import resolve_checkpoint
            from bert.config import BertConfig

            # A checkpoint that cannot be read is not an option clash: its error (one line naming the file)
            # goes to the command line as it is.
            ckpt_config = BertConfig.from_json_file(resolve_checkpoint(self.ckpt))
            if self.max_seq_length > ckpt_config.max_position_embeddings:
                problems.append(
                    f"{flag(self, 'max_seq_length')} {self.max_seq_length} exceeds the model's "
                    f"max_position_embeddings {ckpt_config.max_position_embeddings}"
                )
        return problems


# ----------------------------------------------------------------------------- per task


def task_option_fields() -> list[tuple]:
    """Each trainable task's `train_options`, declared in its module (bert/tasks), as fields: once each, so a
    name two tasks read must be one declaration (classify's TSV columns, which rerank reads too)."""
    declared: dict = {}
    for task in registry.TASKS.values():
        for o in task.train_options:
            if declared.setdefault(o.name, o) != o:
                raise TypeError(f"training option {o.name!r} is declared two ways (task {task.name} and another)")
    return [
        (
            o.name,
            list[str] if isinstance(o.default, list) else o.kind or type(o.default),
            option(o.default, o.help, minimum=o.minimum, maximum=o.maximum),
        )
        for o in declared.values()
    ]


FinetuneConfig = dataclasses.make_dataclass("FinetuneConfig", task_option_fields(), bases=(FinetuneOptions,))
FinetuneConfig.__module__ = __name__


def foreign_options(cfg, task) -> list[str]:
    """Options that belong to other tasks (their `train_options`), set away from their defaults."""
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(FinetuneConfig)
    }
    owners: dict[str, list[str]] = {}
    for other in registry.TASKS.values():
        for o in other.train_options:
            owners.setdefault(o.name, []).append(other.name)
    mine = {o.name for o in task.train_options}
    return [
        f"--{name.replace('_', '-')} applies to --task {' or '.join(names)} only"
        for name, names in owners.items()
        if name not in mine and getattr(cfg, name) != defaults[name]
    ]


def read_data(cfg: FinetuneConfig):
    """The task's (training, evaluation) examples, each cut to --max-*-examples; a file the task's reader cannot
    read is one line naming it (data_checks.read_examples)."""
    train, evaluation = data_checks.read_examples(registry.get(cfg.task), cfg)
    return _limit(train, cfg.max_train_examples), _limit(evaluation, cfg.max_eval_examples)


def check_data(cfg: FinetuneConfig, train: list, evaluation: list) -> None:
    """Data that cannot be trained on, refused in one line before the model is built (training/data_checks.py):
    no training examples, no evaluation examples where evaluation data was given, tags that are not IOB,
    evaluation tags of an entity type the training data lacks."""
    data_checks.check_not_empty(cfg.train_data, train, "training")
    if cfg.eval_data:
        data_checks.check_not_empty(cfg.eval_data, evaluation, "evaluation")
    data_checks.check_labels(cfg.train_data, train, None, "")  # the format (CoNLL tags) before labels are made
    data_checks.check_labels(cfg.eval_data or cfg.train_data, evaluation, None, "")
    data_checks.check_tag_types(cfg.train_data, train, cfg.eval_data or cfg.train_data, evaluation)


def _limit(items: list, n: int) -> list:
    return items[:n] if n else items


def prepare(cfg: FinetuneConfig, tokenizer):
    """Read and encode the data: returns (train FeatureData, evaluate(model) -> metrics, head Labels, the
    evaluation examples)."""
    from training.task_data import FeatureData

    task = registry.get(cfg.task)
    train, evaluation = read_data(cfg)
    check_data(cfg, train, evaluation)
    labels = task.train_labels(cfg, train, evaluation)
    whose = f"{flag(cfg, 'labels')}" if getattr(cfg, "labels", None) else "the training data's labels"
    data_checks.check_labels(cfg.train_data, train, labels, whose)
    data_checks.check_labels(cfg.eval_data or cfg.train_data, evaluation, labels, whose)
    data_checks.check_examples(cfg.train_data, train, cfg, "training")
    data_checks.check_examples(cfg.eval_data or cfg.train_data, evaluation, cfg, "evaluation")
    features, targets = task.encode_train(tokenizer, train, labels, cfg)
    data = FeatureData(
        features,
        targets,
        task.name,
        cfg.batch_size,
        cfg.seed,
        cfg.group_by_length,
        tokenizer.pad_token_id,
        task.train_group_size(cfg),
    )
    data_checks.check_full_batch(cfg.train_data, len(train), len(features), cfg.batch_size, len(data.batches(0)))

    def evaluate(model):
        return task.evaluate(model, tokenizer, evaluation, labels, cfg)

    return data, evaluate, labels, evaluation


def run_labels(task, labels) -> dict:
    """What finetune_config.json / multitask_config.json record of a labelled head: its label values as written in
    the data, in head order (evaluate reads them back)."""
    return {"labels": labels.values} if task.labelled else {}


def single_task_model(task_name: str, labels):
    """What fine-tuning trains: the one model class (bert.model.BertForMultiTask) with this task's head alone, at
    the attribute transformers' class for the task has it (Head.single_attribute), so that the checkpoint it
    writes is that class's (config.json names it; AutoModelFor... loads it). Returns config -> model."""
    from bert.model import BertForMultiTask

    head = registry.get(task_name).head
    names = list(labels.names or []) if labels is not None else []

    def make(config):
        return BertForMultiTask(config, {task_name: names}, {task_name: head.single_attribute})

    return make


def compute_loss(task_name: str, model, batch: dict):
    """The batch's loss: the task's own (Task.loss) on the model's outputs, as training.multitask computes it."""
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    )
    return registry.get(task_name).loss(out.outputs, batch)


def task_view(model, task: str):
    """`model` seen as a single-task model (its outputs named as in a graph of the task alone: logits,
    start_logits / end_logits), so the task's own evaluation runs on it unchanged."""
    import torch

    declared = registry.get(task)
    names = {declared.output_name(o, single=True): declared.output_name(o) for o in declared.outputs}

    class TaskView(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            out = self.model(input_ids, attention_mask, token_type_ids)
            return SimpleNamespace(**{single: out.outputs[multi] for single, multi in names.items()})

    return TaskView()


def build_model(cfg: FinetuneConfig, labels):
    import torch

    from bert.checkpoint import load_checkpoint

    make = single_task_model(cfg.task, labels)
    torch.manual_seed(cfg.seed)  # fresh heads start the same way every run
    overrides = {"problem_type": labels.problem_type} if labels.problem_type else None
    if labels.names is None:
        # A head without named labels (qa's two span outputs): the starting checkpoint's id2label names another
        # head's outputs; kept, it would be written into this checkpoint and transformers would size the head by it.
        overrides = {**(overrides or {}), "id2label": None}
    if cfg.init_preset:
        from bert.tokenizer import BertTokenizer

        vocab = BertTokenizer.from_dir(cfg.tokenizer).vocab_size
        config = model_config(cfg.init_preset, vocab_size=vocab, **(overrides or {}))
        if labels.names is not None:
            config = config.with_labels(labels.names)
        config.task = cfg.task
        torch.manual_seed(cfg.seed)
        model = make(config)
    else:
        model = _from_multitask(cfg, labels, overrides)
        if model is None:
            model, report = load_checkpoint(
                cfg.ckpt,
                make,
                task=cfg.task,
                labels=labels.names,
                from_backbone=True,
                config_overrides=overrides,
            )
    model.train()
    return model


def _from_multitask(cfg: FinetuneConfig, labels, overrides):
    """For a multi-task checkpoint (config.task_labels): the task's single-task model cut from it, the
    shared encoder and, when the labels are the same, that task's head; None for any other checkpoint.
    The model saved from it is a plain single-task checkpoint (no task_labels), so it exports as one."""
    from bert.checkpoint import check_checkpoint, match_state_dict, read_state_dict, resolve_checkpoint
    from bert.config import BertConfig

    directory = resolve_checkpoint(cfg.ckpt)
    stored = BertConfig.from_json_file(directory / "config.json").task_labels
    if not stored:
        return None
    names = labels.names if labels is not None else None
    make = single_task_model(cfg.task, labels)
    plan = check_checkpoint(
        directory, make, labels=names, config_overrides=dict(overrides or {}, task_labels=None, task=cfg.task)
    )
    model = make(plan.config)
    state = read_state_dict(directory)
    # Where the multi-task checkpoint keeps the task's head, and where the task's own model keeps it.
    declared = registry.get(cfg.task).head
    source_head, head = f"{declared.attribute}.", f"{declared.single_attribute}."
    kept = cfg.task in stored and (not registry.get(cfg.task).labelled or list(names or []) == stored[cfg.task])
    heads = tuple(f"{registry.get(t).head.attribute}." for t in stored)
    state = {
        (head + k[len(source_head) :] if kept and k.startswith(source_head) else k): v
        for k, v in state.items()
        if not k.startswith(heads) or (kept and k.startswith(source_head))
    }
    state, _ = match_state_dict(model, state, from_backbone=True, source=str(directory))
    model.load_state_dict(state, strict=False)
    if kept:
        print(
            f"finetune: {directory} is a multi-task checkpoint ({', '.join(stored)}); fine-tuning its "
            f"{cfg.task} head on the shared encoder",
            file=sys.stderr,
        )
    else:
        why = (
            f"it has no {cfg.task} head"
            if cfg.task not in stored
            else f"its {cfg.task} labels {stored[cfg.task]} are not {list(names or [])}"
        )
        print(
            f"finetune: {directory} is a multi-task checkpoint ({', '.join(stored)}); the {cfg.task} "
            f"model starts from its shared encoder with a fresh head ({why})",
            file=sys.stderr,
        )
    return model


def main(argv=None) -> int:
    cfg = parse_config(FinetuneConfig, argv, description=__doc__.split("\n")[0])
    from bert.checkpoint import CALIBRATION_FILE, save_checkpoint
    from training import calibration
    from training.loop import check_resume_plan, finish_run, start_run, train

    dist, device, tokenizer = start_run(cfg)
    task = registry.get(cfg.task)
    data, evaluate, labels, evaluation = prepare(cfg, tokenizer)
    check_resume_plan(cfg, len(data.batches(0)))
    model = build_model(cfg, labels)
    if dist.main:
        print(
            f"finetune {cfg.task}: {len(data)} training features, {len(data.batches(0))} steps/epoch, "
            f"device {device}, {dist.world_size} process(es)",
            file=sys.stderr,
        )

    run_settings = dict(cfg.to_dict(), **run_labels(task, labels))
    own_text = calibration.calibration_file(tokenizer, task, evaluation, labels, cfg)

    def save_model(m, directory: Path) -> None:
        save_checkpoint(
            m,
            directory,
            tokenizer=tokenizer,
            extra_files={
                "finetune_config.json": json.dumps(run_settings, indent=2, sort_keys=True) + "\n",
                **({CALIBRATION_FILE: own_text} if own_text else {}),
            },
        )

    result = train(
        cfg,
        model,
        data,
        save_model=save_model,
        evaluate=lambda m: evaluate(task_view(m, cfg.task)),
        best_metric=task.best_metric(labels),
        dist=dist,
        device=device,
        stop_at_step=cfg.stop_at_step,
        compute_loss=functools.partial(compute_loss, cfg.task),
    )
    summary = {
        "task": cfg.task,
        "steps": result["step"],
        "total_steps": result["total_steps"],
        "best": result["best"],
        "last_eval": result["last_eval"],
    }
    return finish_run(dist, cfg.output_dir, summary, interrupted=result["interrupted"])


if __name__ == "__main__":
    sys.exit(run(main))
