"""python -m training.evaluate --task TASK --ckpt NAME|PATH --data FILE: metrics JSON on stdout.

Settings the fine-tuning run used (max_seq_length, TSV columns, label values, qa windows, held-out
articles) are read from the checkpoint's finetune_config.json, so evaluating best/ reproduces its
metrics.json; any flag given here overrides them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from dataclasses import dataclass

from bert import options
from bert.options import bounds_problems, like, option
from bert.tasks import registry
from training import data_checks
from training.config import ConfigError, run
from training.finetune import FinetuneConfig, trainable_task

RUN = " (default: the fine-tuning run's, from finetune_config.json, else training.finetune's)"


def _from_run(name: str):
    """A fine-tuning option that evaluation reads: finetune's declaration, unset (None) by default, so that the
    run's own value applies unless the flag is given."""
    return like(FinetuneConfig, name, None, suffix=RUN)


@dataclass
class EvaluateOptions:
    """Evaluation's own options; EvaluateConfig adds the tasks' training options that evaluation re-reads."""

    env_prefix = "BERTSERVE_EVALUATE_"  # bert/options.py: an env var belongs to one command

    task: str = option("", "a trainable task: classify | ner | qa ... (default: the checkpoint's task)")
    ckpt: str = option("", "checkpoint path, store name or Hub id (org/name[@revision])")
    data: str = option("", "evaluation file(s): TSV, CoNLL, or SQuAD JSON / .gz / comma-separated parts / directory")
    max_seq_length: int | None = _from_run("max_seq_length")
    eval_batch_size: int | None = _from_run("eval_batch_size")
    max_examples: int = option(
        0, "evaluate only the first N examples (0 = all); the same as --max-eval-examples", minimum=0
    )
    max_eval_examples: int = like(
        FinetuneConfig,
        "max_eval_examples",
        help="evaluate on only the first N examples (0 = all): training.finetune's option, to reproduce a run's "
        "best/metrics.json that used it (the run's value is not applied unless given)",
    )
    labels: list[str] = option([], "classify: label values as in the data, in head order")
    heldout_articles: int | None = like(
        FinetuneConfig,
        "heldout_articles",
        None,
        suffix=RUN,
        help="qa: evaluate on the last N articles of --data (the held-out split)",
    )
    device: str = option("cpu", "cpu | cuda | cuda:N")
    torch_threads: int = like(FinetuneConfig, "torch_threads")

    def resolved(self, saved: dict) -> "EvaluateConfig":
        """Unset options take the fine-tuning run's value, then finetune's declared default."""
        defaults = FinetuneConfig()
        values = {
            name: saved.get(name, getattr(defaults, name)) for name in _RUN_OPTIONS if getattr(self, name) is None
        }
        if self.task == "" and saved.get("task"):
            values["task"] = saved["task"]
        return dataclasses.replace(self, **values)

    def finetune_config(self) -> FinetuneConfig:
        """The fine-tuning options these evaluation options stand for, which the task's hooks read: --data as
        the evaluation data, or, with --heldout-articles, as the training data whose tail is held out."""
        shared = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name in {g.name for g in dataclasses.fields(FinetuneConfig)}
            and getattr(self, f.name) is not None
            and f.name != "max_eval_examples"  # below: --max-examples or --max-eval-examples
        }
        held_out = bool(self.heldout_articles)
        return FinetuneConfig(
            **shared,
            train_data=self.data if held_out else "",
            eval_data="" if held_out else self.data,
            max_eval_examples=self.limit,
        )

    @property
    def limit(self) -> int:
        """--max-examples or --max-eval-examples (one meaning, two names; validate refuses two values)."""
        return self.max_eval_examples or self.max_examples

    def validate(self) -> None:
        task = trainable_task(self.task)
        problems = []
        if not self.ckpt:
            problems.append("--ckpt is required")
        problems += bounds_problems(type(self), vars(self))
        if self.max_examples and self.max_eval_examples and self.max_examples != self.max_eval_examples:
            problems.append(
                f"--max-examples {self.max_examples} and --max-eval-examples {self.max_eval_examples} "
                "are one option: give one"
            )
        if not self.data:
            problems.append("--data is required")
        else:
            problems += task.train_problems(self.finetune_config())
        if problems:
            raise ConfigError("; ".join(problems))


def _task_fields() -> list[tuple]:
    """The trainable tasks' training options declared with `evaluate` (bert/tasks), once each, unset by default:
    the fine-tuning run's value applies unless the flag is given."""
    hints = typing.get_type_hints(FinetuneConfig)
    names = dict.fromkeys(o.name for t in registry.TASKS.values() for o in t.train_options if o.evaluate)
    return [(name, hints[name] | None, _from_run(name)) for name in names]


EvaluateConfig = dataclasses.make_dataclass("EvaluateConfig", _task_fields(), bases=(EvaluateOptions,))
EvaluateConfig.__module__ = __name__

_RUN_OPTIONS = [f.name for f in dataclasses.fields(EvaluateConfig) if f.default is None]


def _run_settings(path) -> dict:
    """The fine-tuning run's settings saved next to the checkpoint; {} when there are none."""
    from bert.checkpoint import CheckpointError
    from bert.errors import read_json_object

    return read_json_object(path, CheckpointError) or {}


def evaluate(cfg: EvaluateConfig) -> dict:
    import torch

    from bert.checkpoint import check_checkpoint, load_checkpoint, resolve_checkpoint
    from bert.tasks import registry
    from bert.tokenizer import BertTokenizer

    if cfg.task:
        trainable_task(cfg.task)  # an unknown --task is named before the checkpoint is opened
    directory = resolve_checkpoint(cfg.ckpt)
    saved = _run_settings(directory / "finetune_config.json")
    cfg = cfg.resolved(saved)
    cfg.validate()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    task = registry.get(cfg.task)
    settings = cfg.finetune_config()
    plan = check_checkpoint(directory, task=cfg.task)  # config and weight files, before the data: cheap
    tokenizer = BertTokenizer.from_dir(directory)
    # The data is read and checked before the model is loaded or run: an empty file, a label the checkpoint does
    # not know or a file of another task's format is one line at once (training/data_checks.py).
    _, examples = data_checks.read_examples(task, settings, train=False)
    if cfg.limit:
        examples = examples[: cfg.limit]
    data_checks.check_not_empty(cfg.data, examples, "evaluation")
    whose = "--labels" if cfg.labels else f"the labels of {directory}"
    data_checks.check_labels(cfg.data, examples, task.saved_labels(settings, plan.config, saved), whose)
    data_checks.check_examples(cfg.data, examples, settings, "evaluation")
    model, _ = load_checkpoint(directory, task=cfg.task, device=cfg.device)
    return task.evaluate(model, tokenizer, examples, task.saved_labels(settings, model.config, saved), settings)


def main(argv=None) -> int:
    cfg = EvaluateConfig(**options.read(EvaluateConfig, argv, description=__doc__.split("\n")[0]))
    try:
        metrics = evaluate(cfg)
    except ConfigError as e:
        options.fail(str(e))
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
