"""python -m training.evaluate --task {classify,ner,qa} --ckpt NAME|PATH --data FILE: metrics JSON on stdout.

Settings the fine-tuning run used (max_seq_length, TSV columns, label values, qa windows, held-out
articles) are read from the checkpoint's finetune_config.json, so evaluating best/ reproduces its
metrics.json; any flag given here overrides them.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field

from training.config import ConfigError, build_parser, run
from training.finetune import TASKS

FALLBACKS = {"max_seq_length": 128, "eval_batch_size": 64, "text_column": "0", "pair_column": "",
             "label_column": "-1", "header": "auto", "scheme": "auto", "doc_stride": 128, "max_query_length": 64,
             "max_answer_length": 30, "heldout_articles": 0}


@dataclass
class EvaluateConfig:
    task: str = ""  # classify | ner | qa (default: the checkpoint's task)
    ckpt: str = ""  # checkpoint path or store name
    data: str = ""  # evaluation file(s): TSV, CoNLL, or SQuAD JSON / .gz / comma-separated parts / directory
    max_seq_length: int | None = None  # default: the fine-tuning run's (finetune_config.json), else 128
    eval_batch_size: int | None = None  # examples per batch (default: the run's, else 64)
    max_examples: int = 0  # evaluate only the first N examples (0 = all)
    text_column: str | None = None  # classify: TSV text column (index or header name)
    pair_column: str | None = None  # classify: TSV second-text column ("" = none)
    label_column: str | None = None  # classify: TSV label column
    header: str | None = None  # classify: auto | yes | no
    labels: list[str] = field(default_factory=list)  # classify: label values as in the data, in head order
    scheme: str | None = None  # ner: auto | iob1 | iob2
    doc_stride: int | None = None  # qa: tokens shared by neighbouring windows
    max_query_length: int | None = None  # qa
    max_answer_length: int | None = None  # qa: longest answer in tokens
    heldout_articles: int | None = None  # qa: evaluate on the last N articles of --data (the held-out split)
    device: str = "cpu"  # cpu | cuda | cuda:N
    torch_threads: int = 0  # torch.set_num_threads (0 = default)

    def resolved(self, saved: dict) -> "EvaluateConfig":
        """Unset options take the fine-tuning run's value, then the finetune default."""
        values = {}
        for name, fallback in FALLBACKS.items():
            if getattr(self, name) is None:
                values[name] = saved.get(name, fallback)
        if self.task == "" and saved.get("task"):
            values["task"] = saved["task"]
        return dataclasses.replace(self, **values)

    def validate(self) -> None:
        problems = []
        if self.task not in TASKS:
            problems.append(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if not self.ckpt:
            problems.append("--ckpt is required")
        if not self.data:
            problems.append("--data is required")
        if self.task == "qa" and self.max_seq_length <= self.max_query_length + 3:
            problems.append(f"max_seq_length ({self.max_seq_length}) must exceed max_query_length + 3")
        if problems:
            raise ConfigError("; ".join(problems))


def _run_settings(path) -> dict:
    """The fine-tuning run's settings saved next to the checkpoint; {} when there are none."""
    from bert.checkpoint import CheckpointError
    from bert.errors import read_json_object

    return read_json_object(path, CheckpointError) or {}


def evaluate(cfg: EvaluateConfig) -> dict:
    import torch
    from bert.checkpoint import load_checkpoint, resolve_checkpoint
    from bert.tokenizer import BertTokenizer
    from training import task_data as T
    from training.data import readers

    directory = resolve_checkpoint(cfg.ckpt)
    saved = _run_settings(directory / "finetune_config.json")
    cfg = cfg.resolved(saved)
    cfg.validate()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    tokenizer = BertTokenizer.from_dir(directory)
    model, _ = load_checkpoint(directory, task=cfg.task, device=cfg.device)
    id2label = model.config.id2label or {}
    limit = (lambda xs: xs[:cfg.max_examples]) if cfg.max_examples else (lambda xs: xs)

    if cfg.task == "classify":
        examples = limit(readers.read_tsv(cfg.data, text_column=cfg.text_column, pair_column=cfg.pair_column or None,
                                          label_column=cfg.label_column,
                                          header={"auto": None, "yes": True, "no": False}[cfg.header]))
        regression = model.config.problem_type == "regression"
        labels = None if regression else (cfg.labels or saved.get("labels") or [id2label[i] for i in sorted(id2label)])
        return T.evaluate_classify(model, tokenizer, examples, labels=labels, max_seq_length=cfg.max_seq_length,
                                   batch_size=cfg.eval_batch_size)
    if cfg.task == "ner":
        sentences = limit(readers.read_conll(cfg.data, scheme=cfg.scheme))
        labels = [id2label[i] for i in sorted(id2label)]
        return T.evaluate_ner(model, tokenizer, sentences, labels=labels, max_seq_length=cfg.max_seq_length,
                              batch_size=cfg.eval_batch_size)
    from training import qa_data as Q
    articles = readers.read_squad_articles(cfg.data)
    if cfg.heldout_articles:
        _, articles = readers.split_heldout(articles, cfg.heldout_articles)
    examples = limit(readers.squad_examples(articles))
    return Q.evaluate_qa(model, tokenizer, examples, max_seq_length=cfg.max_seq_length, doc_stride=cfg.doc_stride,
                         max_query_length=cfg.max_query_length, max_answer_length=cfg.max_answer_length,
                         batch_size=cfg.eval_batch_size)


def main(argv=None) -> int:
    parser = build_parser(EvaluateConfig, __doc__.split("\n")[0])
    cfg = EvaluateConfig(**vars(parser.parse_args(argv)))
    try:
        metrics = evaluate(cfg)
    except ConfigError as e:
        parser.error(str(e))
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
