"""python -m training.finetune --task {classify,ner,qa}: fine-tune a checkpoint, evaluate, save best/ and last/.

    python -m training.finetune --task classify --ckpt PATH --train-data train.tsv --eval-data dev.tsv \
        --output-dir runs/sst2 --learning-rate 1e-4 --num-epochs 1 --max-seq-length 64

Writes <output-dir>/best (checkpoint + metrics.json + finetune_config.json), <output-dir>/last
(the same, plus trainer state for --resume), log.jsonl and metrics.json.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bert.tasks import registry
from training.config import ConfigError, TrainConfig, is_model_spec, model_config, parse_config, run

TASKS = registry.names(trainable=True)
BEST_METRIC = {"classify": "accuracy", "regression": "pearson", "ner": "f1", "qa": "f1"}


@dataclass
class FinetuneConfig(TrainConfig):
    task: str = ""  # classify | ner | qa
    ckpt: str = ""  # checkpoint path or store name to start from (its encoder; heads start fresh if absent)
    init_preset: str = ""  # instead of --ckpt: random weights of a preset or a config.json (tests; needs --tokenizer)
    tokenizer: str = ""  # tokenizer directory (default: the checkpoint's)
    train_data: str = ""  # TSV (classify), CoNLL (ner), SQuAD JSON / .gz / comma-separated parts (qa)
    eval_data: str = ""  # same format; for qa it may be empty when --heldout-articles > 0
    max_seq_length: int = 128  # longest encoded input (longer inputs are truncated; qa: windowed)
    eval_batch_size: int = 64  # examples per evaluation batch
    max_train_examples: int = 0  # use only the first N training examples (0 = all)
    max_eval_examples: int = 0  # evaluate on only the first N examples (0 = all)
    # classify
    text_column: str = "0"  # TSV column (index or header name) of the text
    pair_column: str = ""  # TSV column of the second text of a pair (empty = single texts)
    label_column: str = "-1"  # TSV column of the label
    header: str = "auto"  # auto | yes | no: whether the TSV's first row names its columns
    labels: list[str] = field(default_factory=list)  # label values as written in the data (default: sorted unique)
    label_names: list[str] = field(default_factory=list)  # names the checkpoint shows for them (default: the values)
    regression: bool = False  # one output, MSE loss, Pearson/Spearman (e.g. STS-B)
    # ner
    scheme: str = "auto"  # auto | iob1 | iob2: tag scheme of the CoNLL files (IOB1 is converted to IOB2)
    label_all_subtokens: bool = False  # ner: train every sub-token (B- becomes I- after a word's first; default: first only)
    # qa
    doc_stride: int = 128  # tokens between the starts of consecutive context windows
    max_query_length: int = 64  # questions are cut to this many tokens
    max_answer_length: int = 30  # longest predicted answer, in tokens
    heldout_articles: int = 0  # qa: hold out the last N articles of --train-data for evaluation (never trained on)
    stop_at_step: int = 0  # stop as if interrupted after this step (schedule unchanged; then --resume)

    def task_problems(self) -> list[str]:
        problems = []
        if self.task not in TASKS:
            problems.append(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if bool(self.ckpt) == bool(self.init_preset):
            problems.append("give exactly one of --ckpt (pretrained weights) and --init-preset (random weights)")
        if self.init_preset and not is_model_spec(self.init_preset):
            problems.append(f"--init-preset {self.init_preset!r} is neither a preset nor a config.json")
        elif self.init_preset:
            model_config(self.init_preset)  # a config.json that is not a BERT config: its one-line error, now
        if self.init_preset and not self.tokenizer:
            problems.append("--init-preset needs --tokenizer (a directory with vocab.txt or tokenizer.json)")
        if not self.train_data:
            problems.append("--train-data is required")
        if not self.eval_data and not (self.task == "qa" and self.heldout_articles > 0):
            problems.append("--eval-data is required (for qa, or --heldout-articles N)")
        if self.max_seq_length < 8 or self.max_seq_length > 512:
            problems.append(f"max_seq_length must be in [8, 512], got {self.max_seq_length}")
        if self.task == "qa":
            if self.max_seq_length <= self.max_query_length + 3:
                problems.append(f"max_seq_length ({self.max_seq_length}) must exceed max_query_length + 3 "
                                f"({self.max_query_length + 3}): [CLS] question [SEP] context [SEP] needs room")
            elif self.doc_stride >= self.max_seq_length - self.max_query_length - 3:
                problems.append(f"doc_stride ({self.doc_stride}) must be smaller than the context room "
                                f"max_seq_length - max_query_length - 3 = {self.max_seq_length - self.max_query_length - 3}")
            if self.doc_stride <= 0 or self.max_answer_length <= 0:
                problems.append("doc_stride and max_answer_length must be positive")
        if self.regression and self.task != "classify":
            problems.append("--regression applies to --task classify only")
        if self.regression and self.labels:
            problems.append("--regression and --labels contradict each other (regression has no classes)")
        if self.label_names and len(self.label_names) != len(self.labels):
            problems.append("--label-names needs --labels, one name per label value")
        if self.task != "classify" and (self.labels or self.label_names or self.pair_column):
            problems.append("--labels/--label-names/--pair-column apply to --task classify only")
        if self.header not in ("auto", "yes", "no"):
            problems.append(f"--header must be auto, yes or no, got {self.header!r}")
        if self.scheme not in ("auto", "iob1", "iob2"):
            problems.append(f"--scheme must be auto, iob1 or iob2, got {self.scheme!r}")
        if self.stop_at_step < 0:
            problems.append("stop_at_step must be >= 0")
        if self.ckpt and not problems:
            from bert.checkpoint import resolve_checkpoint
            from bert.config import BertConfig

            # A checkpoint that cannot be read is not an option clash: its error (one line naming the file)
            # goes to the command line as it is.
            ckpt_config = BertConfig.from_json_file(resolve_checkpoint(self.ckpt))
            if self.max_seq_length > ckpt_config.max_position_embeddings:
                problems.append(f"max_seq_length {self.max_seq_length} exceeds the model's "
                                f"max_position_embeddings {ckpt_config.max_position_embeddings}")
        return problems


# ----------------------------------------------------------------------------- per task


def _tsv_kwargs(cfg) -> dict:
    return dict(text_column=cfg.text_column, pair_column=cfg.pair_column or None, label_column=cfg.label_column,
                header={"auto": None, "yes": True, "no": False}[cfg.header])


def _limit(items: list, n: int) -> list:
    return items[:n] if n else items


def prepare(cfg: FinetuneConfig, tokenizer):
    """Read and encode the data: returns (train FeatureData, evaluate(model) -> metrics, head labels, kind)."""
    from training.data import readers
    from training import task_data as T

    if cfg.task == "classify":
        train = _limit(readers.read_tsv(cfg.train_data, **_tsv_kwargs(cfg)), cfg.max_train_examples)
        dev = _limit(readers.read_tsv(cfg.eval_data, **_tsv_kwargs(cfg)), cfg.max_eval_examples)
        if cfg.regression:
            values, names, kind = None, ["score"], "regression"
        else:
            values = cfg.labels or sorted({e.label for e in train})
            names, kind = (cfg.label_names or values), "classify"
        features = T.encode_classify(tokenizer, train, cfg.max_seq_length)
        data = T.FeatureData(features, T.classify_targets(train, values), kind, cfg.batch_size, cfg.seed,
                             cfg.group_by_length, tokenizer.pad_token_id)

        def evaluate(model):
            return T.evaluate_classify(model, tokenizer, dev, labels=values, max_seq_length=cfg.max_seq_length,
                                       batch_size=cfg.eval_batch_size)
        return data, evaluate, names, kind, {"labels": values}

    if cfg.task == "ner":
        train = _limit(readers.read_conll(cfg.train_data, scheme=cfg.scheme), cfg.max_train_examples)
        dev = _limit(readers.read_conll(cfg.eval_data, scheme=cfg.scheme), cfg.max_eval_examples)
        kinds = sorted({t.split("-", 1)[1] for s in train for t in s.tags if t != "O"})
        labels = ["O"] + [f"{p}-{k}" for k in kinds for p in ("B", "I")]
        unknown = {t for s in dev for t in s.tags} - set(labels)
        if unknown:
            raise ConfigError(f"evaluation tags {sorted(unknown)} never occur in the training data")
        features, targets = T.encode_ner(tokenizer, train, labels, cfg.max_seq_length, cfg.label_all_subtokens)
        data = T.FeatureData(features, targets, "ner", cfg.batch_size, cfg.seed, cfg.group_by_length,
                             tokenizer.pad_token_id)

        def evaluate(model):
            return T.evaluate_ner(model, tokenizer, dev, labels=labels, max_seq_length=cfg.max_seq_length,
                                  batch_size=cfg.eval_batch_size)
        return data, evaluate, labels, "ner", {"labels": labels}

    from training import qa_data as Q
    train_examples, dev_examples = Q.load_qa(cfg)
    features, targets = Q.train_features(tokenizer, train_examples, max_seq_length=cfg.max_seq_length,
                                         doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length)
    data = T.FeatureData(features, targets, "qa", cfg.batch_size, cfg.seed, cfg.group_by_length,
                         tokenizer.pad_token_id)

    def evaluate(model):
        return Q.evaluate_qa(model, tokenizer, dev_examples, max_seq_length=cfg.max_seq_length,
                             doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length,
                             max_answer_length=cfg.max_answer_length, batch_size=cfg.eval_batch_size)
    return data, evaluate, None, "qa", {}


def build_model(cfg: FinetuneConfig, labels, kind):
    import torch
    from bert.checkpoint import init_model, load_checkpoint

    torch.manual_seed(cfg.seed)  # fresh heads start the same way every run
    overrides = {"problem_type": "regression"} if kind == "regression" else None
    if cfg.init_preset:
        from bert.tokenizer import BertTokenizer
        vocab = BertTokenizer.from_dir(cfg.tokenizer).vocab_size
        config = model_config(cfg.init_preset, vocab_size=vocab, **(overrides or {}))
        if labels is not None:
            config = config.with_labels(labels)
        model = init_model(config, cfg.task, seed=cfg.seed)
        model.config.task = cfg.task
    else:
        model = _from_multitask(cfg, labels, overrides)
        if model is None:
            model, report = load_checkpoint(cfg.ckpt, task=cfg.task, labels=labels, from_backbone=True,
                                            config_overrides=overrides)
    model.train()
    return model


# Where a multi-task checkpoint keeps a task's head, and where the task's own model keeps it.
MULTITASK_HEADS = {"classify": ("classifier.", "classifier."), "ner": ("token_classifier.", "classifier."),
                   "qa": ("qa_outputs.", "qa_outputs.")}


def _from_multitask(cfg: FinetuneConfig, labels, overrides):
    """For a multi-task checkpoint (config.task_labels): the task's single-task model cut from it, the
    shared encoder and, when the labels are the same, that task's head; None for any other checkpoint.
    The model saved from it is a plain single-task checkpoint (no task_labels), so it exports as one."""
    from bert.checkpoint import check_checkpoint, match_state_dict, read_state_dict, resolve_checkpoint
    from bert.config import BertConfig
    from bert.model import TASK_ARCHITECTURES

    directory = resolve_checkpoint(cfg.ckpt)
    stored = BertConfig.from_json_file(directory / "config.json").task_labels
    if not stored:
        return None
    cls = TASK_ARCHITECTURES[cfg.task]
    plan = check_checkpoint(directory, cls, labels=labels,
                            config_overrides=dict(overrides or {}, task_labels=None, task=cfg.task))
    model = cls(plan.config)
    state = read_state_dict(directory)
    source_head, head = MULTITASK_HEADS.get(cfg.task, (None, None))
    kept = cfg.task in stored and source_head is not None and (cfg.task == "qa" or list(labels or []) == stored[cfg.task])
    heads = tuple(prefix for prefix, _ in MULTITASK_HEADS.values())
    state = {(head + k[len(source_head):] if kept and k.startswith(source_head) else k): v
             for k, v in state.items() if not k.startswith(heads) or (kept and k.startswith(source_head))}
    state, _ = match_state_dict(model, state, from_backbone=True, source=str(directory))
    model.load_state_dict(state, strict=False)
    if kept:
        print(f"finetune: {directory} is a multi-task checkpoint ({', '.join(stored)}); fine-tuning its "
              f"{cfg.task} head on the shared encoder", file=sys.stderr)
    else:
        why = (f"it has no {cfg.task} head" if cfg.task not in stored
               else f"its {cfg.task} labels {stored[cfg.task]} are not {list(labels or [])}")
        print(f"finetune: {directory} is a multi-task checkpoint ({', '.join(stored)}); the {cfg.task} "
              f"model starts from its shared encoder with a fresh head ({why})", file=sys.stderr)
    return model


def main(argv=None) -> int:
    cfg = parse_config(FinetuneConfig, argv, description=__doc__.split("\n")[0])
    from bert.checkpoint import save_checkpoint
    from training.loop import finish_run, start_run, train

    dist, device, tokenizer = start_run(cfg)
    data, evaluate, labels, kind, extra = prepare(cfg, tokenizer)
    model = build_model(cfg, labels, kind)
    if dist.main:
        print(f"finetune {cfg.task}: {len(data)} training features, {len(data.batches(0))} steps/epoch, "
              f"device {device}, {dist.world_size} process(es)", file=sys.stderr)

    run_settings = dict(cfg.to_dict(), **extra, kind=kind)

    def save_model(m, directory: Path) -> None:
        save_checkpoint(m, directory, tokenizer=tokenizer,
                        extra_files={"finetune_config.json": json.dumps(run_settings, indent=2, sort_keys=True) + "\n"})

    result = train(cfg, model, data, save_model=save_model, evaluate=evaluate, best_metric=BEST_METRIC[kind],
                   dist=dist, device=device, stop_at_step=cfg.stop_at_step)
    summary = {"task": cfg.task, "steps": result["step"], "total_steps": result["total_steps"],
               "best": result["best"], "last_eval": result["last_eval"]}
    return finish_run(dist, cfg.output_dir, summary)


if __name__ == "__main__":
    sys.exit(run(main))
