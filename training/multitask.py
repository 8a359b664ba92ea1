"""python -m training.multitask: one encoder, a head per trainable task (classify, ner, qa, ...) fine-tuned together.

    python -m training.multitask --ckpt PATH \
        --classify-train SST-2/train.tsv --classify-eval SST-2/dev.tsv --classify-label-names negative,positive \
        --ner-train conll2003/train.txt --ner-eval conll2003/valid.txt \
        --qa-train squad-train/ --heldout-articles 10 \
        --output-dir runs/demo --save-dtype fp16 --max-shard-mb 15

Give any subset of the tasks (a task takes part when its --X-train is given; each trainable task of the registry
has --X-train, --X-eval, --X-max-seq-length and its own copies of the options it names in `multitask_options`).
Each task's data is read and encoded exactly as `training.finetune` does (the task's training hooks); each batch holds one task, and the tasks' batches are
interleaved in proportion to their sizes (or to --task-weights). The loss of a batch is its task's head
on the shared BertForMultiTask forward pass. Evaluation runs each task's own metrics; best/ is the
step with the highest mean of the main metrics on a 0-100 scale (classify accuracy in %, ner entity F1, qa F1).

--embed-teacher DIR keeps the encoder's sentence embeddings (what /embed serves) close to DIR's while the heads
learn: each batch adds --embed-weight x the cosine distance between the student's pooled embedding of the first
segment of every input (classify and ner: the whole text, from the same forward pass; qa: the question alone) and
the frozen teacher's, embedded once before training (docs/training.md, "Keeping the encoder's embeddings").

Writes <output-dir>/best (checkpoint in --save-dtype, sharded by --max-shard-mb, + metrics.json),
<output-dir>/last (full precision + trainer state for --resume), log.jsonl and metrics.json (with the
scores of best/ re-measured after loading it back from disk).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert.options import like, option
from bert.tasks import registry
from training.config import ConfigError, TrainConfig, is_model_spec, model_config, parse_config, run
from training.finetune import FinetuneConfig, prepare, run_labels, task_view

TASKS = registry.names(trainable=True)
SAVE_DTYPES = ("fp32", "fp16", "bf16")
DEFAULT_EMBED_WEIGHT = 1.0
AGREEMENT_TEXTS = 256  # held-out texts per source (a task's Task.embed_texts: classify, ner, qa questions, qa contexts) for the embed agreement


@dataclass
class MultiTaskOptions(TrainConfig):
    """The options every task shares; MultiTaskConfig adds each trainable task's own (see _task_fields). Those
    that mean what they mean to training.finetune are its declarations (bert.options.like)."""

    env_prefix = "BERTSERVE_MULTITASK_"  # bert/options.py: an env var belongs to one command

    ckpt: str = option(
        "", "checkpoint path, store name or Hub id whose encoder all heads share (heads start fresh if absent)"
    )
    init_preset: str = like(FinetuneConfig, "init_preset")
    tokenizer: str = like(FinetuneConfig, "tokenizer")
    task_weights: list[str] = option(
        [], "e.g. classify=1,ner=1,qa=2: share of batches per task (default: by dataset size)"
    )
    eval_batch_size: int = like(FinetuneConfig, "eval_batch_size")
    max_train_examples: int = like(FinetuneConfig, "max_train_examples")
    max_eval_examples: int = like(FinetuneConfig, "max_eval_examples")
    save_dtype: str = option(
        "fp32", "fp32 | fp16 | bf16 weights of best/ (last/ keeps full precision for exact resume)"
    )
    max_shard_mb: float = option(0.0, "shard the weights into files of at most this many MB (+ index); 0 = one file")
    stop_at_step: int = like(FinetuneConfig, "stop_at_step")
    embed_teacher: str = option(
        "", "checkpoint (sentence-transformers or BERT) whose sentence embeddings the encoder keeps; empty = none"
    )
    embed_weight: float = option(
        DEFAULT_EMBED_WEIGHT, "weight of the embedding loss (cosine distance to --embed-teacher's vectors)"
    )

    def tasks(self) -> list[str]:
        return [t for t in TASKS if getattr(self, f"{t}_train")]

    def weights(self) -> dict[str, float] | None:
        if not self.task_weights:
            return None
        out = {}
        for item in self.task_weights:
            name, _, value = item.partition("=")
            out[name.strip()] = float(value)
        return out

    def task_config(self, task: str) -> FinetuneConfig:
        """The single-task fine-tuning config whose data reading and evaluation this task reuses: the shared
        options, this task's own (--<task>-<option>), and of the shared task options only those it reads."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig)}
        declared = registry.get(task)
        options = {}
        for opt in (o.name for o in declared.train_options):
            name = f"{task}_{opt}" if opt in declared.multitask_options else opt
            if hasattr(self, name):
                value = getattr(self, name)
                options[opt] = list(value) if isinstance(value, list) else value
        config = FinetuneConfig(
            **shared,
            **options,
            task=task,
            ckpt=self.ckpt,
            init_preset=self.init_preset,
            tokenizer=self.tokenizer,
            train_data=getattr(self, f"{task}_train"),
            eval_data=getattr(self, f"{task}_eval"),
            max_seq_length=getattr(self, f"{task}_max_seq_length"),
            eval_batch_size=self.eval_batch_size,
            max_train_examples=self.max_train_examples,
            max_eval_examples=self.max_eval_examples,
        )
        config.flag_names = task_flags(task)  # its messages name this command's flags (--qa-train, --classify-labels)
        return config

    def task_problems(self) -> list[str]:
        problems = []
        if not self.tasks():
            return [f"give at least one of {', '.join(f'--{t}-train' for t in TASKS)}"]
        if bool(self.ckpt) == bool(self.init_preset):
            return ["give exactly one of --ckpt (pretrained weights) and --init-preset (random weights)"]
        if self.init_preset and not is_model_spec(self.init_preset):
            return [f"--init-preset {self.init_preset!r} is neither a preset nor a config.json"]
        for task in TASKS:
            if not getattr(self, f"{task}_train"):
                own = ["eval"] + [o.replace("_", "-") for o in registry.get(task).multitask_options]
                given = [f"--{task}-{o}" for o in own if getattr(self, f"{task}_{o.replace('-', '_')}")]
                if given:
                    problems.append(f"{'/'.join(given)} given without --{task}-train")
        for opt in shared_task_options():
            trained = [t for t in self.tasks() if opt in _train_option_names(t)]
            if not trained and getattr(self, opt) != _default(MultiTaskConfig, opt):
                owners = [t for t in TASKS if opt in _train_option_names(t)]
                problems.append(
                    f"--{opt.replace('_', '-')} given without {' or '.join(f'--{t}-train' for t in owners)}"
                )
        for task in self.tasks():
            for p in self.task_config(task).task_problems():
                problems.append(self._task_message(task, p))
        try:
            weights = self.weights()
        except ValueError:
            problems.append(f"--task-weights must look like classify=1,ner=1,qa=2, got {self.task_weights}")
        else:
            if weights is not None:
                unknown = [name for name in weights if name not in TASKS]
                if unknown:
                    raise registry.UnknownTask(
                        f"--task-weights names {', '.join(map(repr, unknown))}: the trainable "
                        f"tasks are {', '.join(TASKS)}"
                    )
                if set(weights) != set(self.tasks()):
                    problems.append(
                        f"--task-weights must name each trained task ({', '.join(self.tasks())}) "
                        f"once, got {sorted(weights)}"
                    )
                elif any(w <= 0 for w in weights.values()):
                    problems.append("--task-weights must be positive")
        if self.save_dtype not in SAVE_DTYPES:
            problems.append(f"--save-dtype must be one of {', '.join(SAVE_DTYPES)}, got {self.save_dtype!r}")
        if self.max_shard_mb < 0:
            problems.append("max_shard_mb must be >= 0")
        if self.embed_weight <= 0:
            problems.append(f"--embed-weight must be positive, got {self.embed_weight}")
        return list(dict.fromkeys(problems))

    @staticmethod
    def _task_message(task: str, problem: str) -> str:
        """A single-task run's message (in this command's flags, task_flags): prefixed with its task unless it
        starts with a flag of that task."""
        return problem if problem.startswith("--") else f"{task}: {problem}"


def task_flags(task: str) -> dict[str, str]:
    """The flags a task's own options have here: --<task>-train for --train-data, --<task>-labels ..."""
    own = {
        "train_data": "train",
        "eval_data": "eval",
        "max_seq_length": "max_seq_length",
        **{o: o for o in registry.get(task).multitask_options},
    }
    return {name: f"--{task}-{suffix.replace('_', '-')}" for name, suffix in own.items()}


def _default(cls, name: str):
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _train_option_names(task: str) -> set[str]:
    return {o.name for o in registry.get(task).train_options}


def shared_task_options() -> list[str]:
    """Task options that multitask has once, for every task that reads them (--doc-stride, --scheme ...): those
    a task declares with `multitask` and does not name in its `multitask_options`."""
    return list(
        dict.fromkeys(
            o.name
            for t in TASKS
            for o in registry.get(t).train_options
            if o.multitask and o.name not in registry.get(t).multitask_options
        )
    )


def _task_fields() -> list[tuple]:
    """The task options multitask has once (shared_task_options, as training.finetune declares them); each
    trainable task's own flags: --<task>-train, --<task>-eval, --<task>-max-seq-length, and each of its
    `multitask_options` as training.finetune declares it (e.g. --classify-labels); help from those declarations."""
    hints = typing.get_type_hints(FinetuneConfig)
    out = [(opt, hints[opt], like(FinetuneConfig, opt)) for opt in shared_task_options()]
    for name in TASKS:
        task = registry.get(name)
        what = task.train_data_help or "training data"
        out += [
            (f"{name}_train", str, option("", f"{what} for the {name} head; empty = no {name} head")),
            (f"{name}_eval", str, option("", f"{what} to evaluate {name} on")),
            (
                f"{name}_max_seq_length",
                int,
                option(task.train_max_seq_length, f"longest {name} input (longer inputs are truncated or windowed)"),
            ),
        ]
        for opt in task.multitask_options:
            out.append((f"{name}_{opt}", hints[opt], like(FinetuneConfig, opt, prefix=f"{name}: ")))
    return out


MultiTaskConfig = dataclasses.make_dataclass("MultiTaskConfig", _task_fields(), bases=(MultiTaskOptions,))
MultiTaskConfig.__module__ = __name__


# ----------------------------------------------------------------------------- data


class MultiTaskData:
    """Several tasks' FeatureData behind one index space; implements training.loop.TrainData.

    Example i of task t has global index offsets[t] + i. An epoch's batches are each task's own
    length-grouped batches (one task per batch), interleaved in a seeded random order. Without weights
    every task contributes its natural number of batches; with weights, the epoch keeps the same total
    and task t gets a share w_t / sum(w), cycling through its data (fresh order each pass) or cutting it.
    """

    def __init__(
        self,
        parts: dict,
        *,
        seed: int,
        weights: dict[str, float] | None = None,
        embed_targets: dict[str, "EmbedTargets"] | None = None,
    ):
        self.parts = dict(parts)
        self.tasks = list(self.parts)
        self.seed = seed
        self.weights = weights
        self.embed_targets = embed_targets  # with a teacher: what each batch's embedding loss compares
        self.offsets, total = [], 0
        for task in self.tasks:
            self.offsets.append(total)
            total += len(self.parts[task])
        self.size = total
        empty = [t for t in self.tasks if not self.parts[t].batches(0)]
        if empty:
            raise ValueError(
                f"no full batch of {self.parts[empty[0]].batch_size} examples in the "
                f"training data of {', '.join(empty)}"
            )

    def __len__(self) -> int:
        return self.size

    def quotas(self, natural: dict[str, int]) -> dict[str, int]:
        if self.weights is None:
            return dict(natural)
        total, weight_sum = sum(natural.values()), sum(self.weights[t] for t in self.tasks)
        return {t: max(1, round(total * self.weights[t] / weight_sum)) for t in self.tasks}

    def batches(self, epoch: int) -> list[list[int]]:
        own = {t: self.parts[t].batches(epoch) for t in self.tasks}
        quotas = self.quotas({t: len(b) for t, b in own.items()})
        queues = {}
        for k, task in enumerate(self.tasks):
            queue, repeat = list(own[task]), 0
            while len(queue) < quotas[task]:  # weighted up: further passes, each in a fresh order
                repeat += 1
                queue += self.parts[task].batches(1_000_000 * repeat + epoch)
            queues[task] = [[self.offsets[k] + i for i in b] for b in queue[: quotas[task]]]
        slots = np.concatenate([np.full(quotas[t], k) for k, t in enumerate(self.tasks)])
        slots = slots[np.random.default_rng([self.seed, epoch, 2]).permutation(len(slots))]
        cursor = dict.fromkeys(range(len(self.tasks)), 0)
        out = []
        for k in slots.tolist():
            out.append(queues[self.tasks[k]][cursor[k]])
            cursor[k] += 1
        return out

    def task_of(self, index: int) -> tuple[str, int]:
        k = bisect.bisect_right(self.offsets, index) - 1
        return self.tasks[k], self.offsets[k]

    def collate(self, indices: list[int], rng=None) -> dict:
        task, offset = self.task_of(indices[0])
        if self.task_of(indices[-1])[0] != task:
            raise ValueError("a batch mixes tasks")
        local = [i - offset for i in indices]
        batch = self.parts[task].collate(local, rng)
        batch["task"] = task
        if self.embed_targets is not None:
            batch.update(self.embed_targets[task].collate(local, self.parts[task].pad_token_id))
        return batch


# ----------------------------------------------------------------------------- keeping the encoder's embeddings


def first_segment(feature):
    """The text of a training input whose embedding the teacher anchors, encoded as /embed encodes a text:
    the whole input for a single text (classify, ner), [CLS] question [SEP] for a qa window."""
    from bert.tasks.common import Features

    types = list(feature.token_type_ids)
    n = types.index(1) if 1 in types else len(types)
    return Features(list(feature.input_ids[:n]), [0] * n)


@dataclass
class EmbedTargets:
    """What the embedding loss compares for one task's training examples. Per example: a row of `vectors`,
    the teacher's embedding of its first segment (embedded once, before training: the teacher never runs
    during training, and a resumed run embeds the same texts in the same batches, so the same bits); and,
    where that segment is not the whole input (qa: the question), the segment itself, which the student
    embeds in a forward pass of its own (questions are short: ~15 tokens beside a 384-token window)."""

    vectors: np.ndarray  # (distinct segments, H) float32, pooled as the teacher pools, not normalised
    rows: np.ndarray  # (examples,): each example's row of `vectors`
    segments: list | None  # per example, its first segment (Features); None: the input itself

    def collate(self, indices: list[int], pad_token_id: int) -> dict:
        import torch

        from bert.running import batch_tensors

        batch = {"teacher_embedding": torch.from_numpy(self.vectors[self.rows[indices]])}
        if self.segments is not None:
            inputs = batch_tensors([self.segments[i] for i in indices], pad_token_id)
            batch.update({f"embed_{k}": v for k, v in inputs.items()})
        return batch


def teacher_targets(teacher, mode: str, parts: dict, *, batch_size: int) -> dict[str, EmbedTargets]:
    """The teacher's embedding of every training example's first segment, each distinct segment once."""
    from training.task_data import pooled_embeddings

    targets = {}
    for task, part in parts.items():
        segments = [first_segment(f) for f in part.features]
        distinct: dict[tuple, int] = {}
        rows = np.array([distinct.setdefault(tuple(s.input_ids), len(distinct)) for s in segments], dtype=np.int64)
        unique = [None] * len(distinct)
        for segment, row in zip(segments, rows.tolist()):
            unique[row] = segment
        whole = all(len(s) == len(f) for s, f in zip(segments, part.features))
        vectors = pooled_embeddings(teacher, unique, mode, batch_size=batch_size, pad_token_id=part.pad_token_id)
        targets[task] = EmbedTargets(vectors, rows, None if whole else segments)
    return targets


def embedding_loss(student, teacher):
    """Mean cosine distance, 1 - cos(student, teacher): zero when the vectors point the same way. The served
    vectors are unit length, so only direction counts (for unit vectors ||s - t||^2 = 2 (1 - cos): MSE on
    normalised vectors is this loss times 2 / H), and the number reads the same for any model width."""
    import torch.nn.functional as F

    return (1.0 - F.cosine_similarity(student.float(), teacher.float(), dim=-1)).mean()


def student_embedding(model, batch: dict, out):
    """The student's pooled embedding of the batch's first segments: the forward pass's own (its inputs are
    single texts), else one more forward of the segments (qa questions). That one goes to the module inside
    DistributedDataParallel: the batch's forward already marked every encoder parameter used, and a second
    forward through the wrapper would re-arm its gradient reduction before this step's backward."""
    if "embed_input_ids" not in batch:
        return out.embedding
    encoder = getattr(model, "module", model).encoder_module()
    return encoder(batch["embed_input_ids"], batch["embed_attention_mask"], batch["embed_token_type_ids"]).embedding


def load_teacher(path: str, device):
    import torch

    from bert.checkpoint import load_checkpoint
    from bert.model import BertModel

    with torch.random.fork_rng(devices=[]):  # building a model draws weights: the run's RNG stream stays untouched
        teacher, _ = load_checkpoint(path, model_cls=BertModel, from_backbone=True, device=device)
    teacher.requires_grad_(False)
    return teacher.eval()


def check_embed_teacher(cfg: MultiTaskConfig, tokenizer):
    """--embed-teacher checked before any data is read: a BERT checkpoint as wide as the student that reads
    the student's token ids as the same word pieces, with a pooling we can reproduce. Returns that pooling.
    Every refusal is one line (training.config.run: exit 2)."""
    from bert.checkpoint import CheckpointError, check_checkpoint, resolve_checkpoint
    from bert.model import BertModel
    from bert.tasks.embed import PoolingError, read_pooling
    from bert.tokenizer import BertTokenizer, TokenizerError

    flag = f"--embed-teacher {cfg.embed_teacher}"
    try:
        teacher = check_checkpoint(cfg.embed_teacher, BertModel).config
        student = model_config(cfg.init_preset) if cfg.init_preset else check_checkpoint(cfg.ckpt, BertModel).config
        teacher_vocab = BertTokenizer.from_dir(resolve_checkpoint(cfg.embed_teacher)).get_vocab()
        pooling = read_pooling(resolve_checkpoint(cfg.embed_teacher))
    except (CheckpointError, ConfigError, TokenizerError, PoolingError) as e:
        raise ConfigError(f"{flag}: {e}") from None
    if teacher.hidden_size != student.hidden_size:
        raise ConfigError(
            f"{flag}: its embeddings have {teacher.hidden_size} dimensions, the student's "
            f"{student.hidden_size}; the teacher must be as wide as the encoder it anchors"
        )
    if teacher_vocab != tokenizer.get_vocab():
        raise ConfigError(
            f"{flag}: its vocabulary ({len(teacher_vocab)} word pieces) is not the student's "
            f"tokenizer's ({tokenizer.vocab_size}); it would read the student's token ids as other words"
        )
    return pooling


def declared_pooling(cfg: MultiTaskConfig):
    """Without a teacher, the pooling this run's encoder is read with: what the starting checkpoint declares
    (a sentence-transformers directory's modules.json, our config.json's "pooling"), else mean pooling."""
    from bert.checkpoint import resolve_checkpoint
    from bert.tasks.embed import Pooling, PoolingError, read_pooling

    if not cfg.ckpt:
        return Pooling()
    try:
        return read_pooling(resolve_checkpoint(cfg.ckpt))
    except PoolingError as e:
        raise ConfigError(f"--ckpt {cfg.ckpt}: {e}") from None


def record_pooling(model, pooling) -> None:
    """config.json says how to pool this encoder (bert.tasks.embed.read_pooling reads it; a server pools as
    trained). Only mode and normalisation: a "max_length" there would cap every task the server runs with
    this model, not /embed alone. A measured "embedding_quality" inherited from the checkpoint we started
    from describes those weights, not these, and is dropped."""
    extra = {k: v for k, v in model.config.extra.items() if k != "embedding_quality"}
    model.config.extra = dict(extra, pooling={"mode": pooling.mode, "normalize": pooling.normalize})


def agreement_sample(held_out: dict[str, list], tokenizer, max_length: int) -> dict[str, list]:
    """Held-out texts, up to AGREEMENT_TEXTS per source, encoded as /embed encodes them: what each task's
    evaluation examples give (Task.embed_texts: the classify and ner evaluation sentences, the qa evaluation
    questions and their contexts)."""
    from bert.tasks import embed

    texts: dict[str, list[str]] = {}
    for task, examples in held_out.items():
        for source, items in registry.get(task).embed_texts(examples).items():
            texts[source] = items[:AGREEMENT_TEXTS]
    return {
        source: embed.encode(tokenizer, items, max_length=max_length, truncate=True)
        for source, items in texts.items()
        if items
    }


def make_agreement(
    sample: dict[str, list], teacher_vectors: dict[str, np.ndarray], mode: str, *, batch_size: int, pad_token_id: int
):
    """evaluate(model) -> {"teacher_cosine", "texts", "by_source"}: the mean cosine between the model's and the
    teacher's embeddings of the held-out sample (1.0 = the teacher's embeddings exactly)."""
    from training.task_data import pooled_embeddings

    def unit(v: np.ndarray) -> np.ndarray:
        return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)

    def agreement(model) -> dict:
        cosines = {
            source: (
                unit(pooled_embeddings(model, features, mode, batch_size=batch_size, pad_token_id=pad_token_id))
                * unit(teacher_vectors[source])
            ).sum(axis=-1)
            for source, features in sample.items()
        }
        every = np.concatenate(list(cosines.values()))
        return {
            "teacher_cosine": float(every.mean()),
            "texts": int(len(every)),
            "by_source": {source: float(c.mean()) for source, c in cosines.items()},
        }

    return agreement


# ----------------------------------------------------------------------------- losses and evaluation


def compute_loss(model, batch: dict, embed_weight: float = 0.0):
    """The loss of a single-task batch: its head's loss on the shared forward pass, plus, when the batch
    carries the teacher's embeddings, `embed_weight` x the embedding loss (see EmbedTargets)."""
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    )
    loss = task_loss(batch["task"], out, batch)
    if "teacher_embedding" in batch:
        loss = loss + embed_weight * embedding_loss(student_embedding(model, batch, out), batch["teacher_embedding"])
    return loss


def task_loss(task: str, out, batch: dict):
    """The batch's task's loss from the multi-task forward's outputs (keyed by graph-output names)."""
    return registry.get(task).loss(out.outputs, batch)


def main_score(task: str, metrics: dict) -> float:
    """A task's main metric on a 0-100 scale (classify accuracy is a fraction in task metrics)."""
    return registry.get(task).score(metrics)


def agreement_key() -> str:
    """Where metrics.json reports the teacher agreement: under the name of the task whose vectors it measures
    (the embeddings /embed serves), beside the trained tasks' metrics."""
    from bert.tasks import embed

    return embed.TASK.name


def make_evaluate(evaluators: dict, agreement=None):
    """Each task's metrics and their mean_score (what best/ is chosen by); with a teacher, the agreement with its
    embeddings too (under `agreement_key()`), reported beside the tasks, not part of the mean."""

    def evaluate(model) -> dict:
        results = {task: fn(task_view(model, task)) for task, fn in evaluators.items()}
        results["mean_score"] = sum(main_score(t, results[t]) for t in evaluators) / len(evaluators)
        if agreement is not None:
            results[agreement_key()] = agreement(model)
        return results

    return evaluate


def summary_line(metrics: dict) -> str:
    parts = [registry.get(name).summary(metrics[name]) for name in TASKS if name in metrics]
    line = "; ".join(parts) + f"; mean {metrics['mean_score']:.2f}"
    if agreement_key() in metrics:
        line += f"; embedding cosine to the teacher {metrics[agreement_key()]['teacher_cosine']:.4f}"
    return line


# ----------------------------------------------------------------------------- main


def build_model(cfg: MultiTaskConfig, task_labels: dict, tokenizer):
    import torch

    from bert.checkpoint import load_checkpoint
    from bert.model import BertForMultiTask

    torch.manual_seed(cfg.seed)  # fresh heads start the same way every run
    if cfg.init_preset:
        model = BertForMultiTask(
            model_config(cfg.init_preset, vocab_size=tokenizer.vocab_size, task_labels=task_labels)
        )
    else:
        model, _ = load_checkpoint(
            cfg.ckpt, model_cls=BertForMultiTask, from_backbone=True, config_overrides={"task_labels": task_labels}
        )
    model.train()
    return model


def embed_teacher_steps(cfg: MultiTaskConfig, pooling, parts: dict, held_out: dict, tokenizer, device, dist):
    """With --embed-teacher: the teacher embeds every training example's first segment and the held-out
    agreement sample, once, then is freed. Returns (EmbedTargets per task, agreement evaluator), or
    (None, None) without a teacher."""
    import time

    from training.task_data import pooled_embeddings

    if not cfg.embed_teacher:
        return None, None
    started = time.perf_counter()
    teacher = load_teacher(cfg.embed_teacher, device)
    targets = teacher_targets(teacher, pooling.mode, parts, batch_size=cfg.eval_batch_size)
    max_length = min(pooling.max_length or 512, teacher.config.max_position_embeddings)
    sample = agreement_sample(held_out, tokenizer, max_length) if dist.main else {}
    sample_vectors = {
        source: pooled_embeddings(
            teacher, features, pooling.mode, batch_size=cfg.eval_batch_size, pad_token_id=tokenizer.pad_token_id
        )
        for source, features in sample.items()
    }
    del teacher
    if dist.main:
        count = sum(len(t.vectors) for t in targets.values())
        print(
            f"multitask: embedding teacher {cfg.embed_teacher} ({pooling.mode} pooling): {count} distinct "
            f"training texts and {sum(len(f) for f in sample.values())} held-out texts embedded in "
            f"{time.perf_counter() - started:.0f} s; weight {cfg.embed_weight}",
            file=sys.stderr,
        )
    agreement = (
        make_agreement(
            sample, sample_vectors, pooling.mode, batch_size=cfg.eval_batch_size, pad_token_id=tokenizer.pad_token_id
        )
        if sample
        else None
    )
    return targets, agreement


def main(argv=None) -> int:
    cfg = parse_config(MultiTaskConfig, argv, description=__doc__.split("\n")[0])
    import torch

    from bert.checkpoint import CALIBRATION_FILE, load_checkpoint, save_checkpoint
    from bert.model import BertForMultiTask
    from training import calibration
    from training.loop import finish_run, start_run, train

    dist, device, tokenizer = start_run(cfg)
    pooling = check_embed_teacher(cfg, tokenizer) if cfg.embed_teacher else declared_pooling(cfg)
    parts, evaluators, task_labels, extra, held_out, labels_of = {}, {}, {}, {}, {}, {}
    for k, task in enumerate(cfg.tasks()):
        data, evaluate, labels, held_out[task] = prepare(cfg.task_config(task), tokenizer)
        data.seed = cfg.seed + k  # each task its own batch order
        parts[task], evaluators[task], task_labels[task] = data, evaluate, list(labels.names or [])
        extra[task], labels_of[task] = run_labels(registry.get(task), labels), labels
    embed_targets, agreement = embed_teacher_steps(cfg, pooling, parts, held_out, tokenizer, device, dist)
    data = MultiTaskData(parts, seed=cfg.seed, weights=cfg.weights(), embed_targets=embed_targets)
    model = build_model(cfg, task_labels, tokenizer)
    record_pooling(model, pooling)
    if embed_targets is not None:
        model.set_pooling(pooling.mode)  # every forward also returns the pooled embedding the loss compares
    if dist.main:
        counts = ", ".join(f"{t} {len(d)}" for t, d in parts.items())
        print(
            f"multitask: training features {counts}; {len(data.batches(0))} steps/epoch, device {device}, "
            f"{dist.world_size} process(es)",
            file=sys.stderr,
        )

    run_settings = dict(cfg.to_dict(), task_labels=task_labels, task_settings=extra)
    best_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg.save_dtype]
    shard_bytes = int(cfg.max_shard_mb * 1_000_000) or None

    own_text = calibration.merged(
        [
            calibration.calibration_file(tokenizer, registry.get(t), held_out[t], labels_of[t], cfg.task_config(t))
            for t in parts
        ]
    )

    def save_model(m, directory: Path) -> None:
        save_checkpoint(
            m,
            directory,
            tokenizer=tokenizer,
            dtype=None if directory.name == "last" else best_dtype,
            max_shard_bytes=shard_bytes,
            extra_files={
                "multitask_config.json": json.dumps(run_settings, indent=2, sort_keys=True) + "\n",
                **({CALIBRATION_FILE: own_text} if own_text else {}),
            },
        )

    evaluate = make_evaluate(evaluators, agreement)
    result = train(
        cfg,
        model,
        data,
        save_model=save_model,
        evaluate=evaluate,
        best_metric="mean_score",
        dist=dist,
        device=device,
        stop_at_step=cfg.stop_at_step,
        compute_loss=functools.partial(compute_loss, embed_weight=cfg.embed_weight),
        find_unused_parameters=dist.world_size > 1,
    )
    summary = {
        "tasks": list(parts),
        "steps": result["step"],
        "total_steps": result["total_steps"],
        "best": result["best"],
        "last_eval": result["last_eval"],
    }
    best_dir = Path(cfg.output_dir) / "best"
    if dist.main and result["step"] == result["total_steps"] and result["best"] is not None:
        # The weights as saved (e.g. fp16), loaded back as a server would load them, then measured.
        saved, _ = load_checkpoint(best_dir, model_cls=BertForMultiTask, device=device)
        summary["best_checkpoint_eval"] = evaluate(saved.float())
        print(
            f"held-out scores of {best_dir} (step {result['best']['step']}): "
            f"{summary_line(summary['best_checkpoint_eval'])}",
            file=sys.stderr,
        )
    final = summary.get("best_checkpoint_eval") or summary["last_eval"]
    printed = {
        "steps": result["step"],
        "best": result["best"],
        "scores": {t: main_score(t, final[t]) for t in parts} if final else {},
    }
    return finish_run(dist, cfg.output_dir, summary, printed, interrupted=result["interrupted"])


if __name__ == "__main__":
    sys.exit(run(main))
