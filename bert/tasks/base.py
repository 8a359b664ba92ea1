"""What a task is: one object that owns everything task-specific.

A task (one module in bert/tasks, one `TASK = SomeTask()` instance in it) declares
- its codec: request items -> model inputs (`encode_request`) and model outputs -> answers (`decode_request`);
- its head: how it sits on the encoder (`Head`: a kind the model knows how to build, the attribute it has in a
  checkpoint, its width), the arrays a backend hands back for it and their names in an exported graph;
- its HTTP routes (`Route`: path, its request's fields (`Param`: name, type, default, bounds, help), its answer's
  type (dataclasses in the task's module, fields described with `described`), how a body becomes items and how the
  answers are shaped back), which one generic route factory in serving/routes turns into endpoints; the request
  and response models are made of these declarations (serving/routes/schemas.py), and the fields marked `job` are
  python -m batch's options too (batch/options.py);
- its outputs, their ranks and whether they are per token, which follow from its head kind (`HEAD_OUTPUTS`);
- how batch jobs run it (`JobColumns`: input columns, row -> item, typed result columns) and how export judges
  it (`calibration`, `agreement`);
- its training hooks (read data, encode, collate targets, loss, evaluate, main metric), used by
  python -m training.finetune / multitask / evaluate; the code behind them (the reader of its formats, its
  encoding, targets, evaluation and metric) is in the task's own module.

Everything else in the server and training (the multi-task model, the backends, export, the routes, training)
loops over the registry (`bert.tasks.registry`) and never names a task (tests/test_task_names.py). The SDK
(clients/) is installed without bert/: it has one hand-written request plan and method per task, held to the
server's OpenAPI schema field for field (tests/test_sdk_openapi.py). torch-free at import time: torch
is imported inside the training hooks only, so a server with an ONNX backend imports every task without torch.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union, get_args, get_origin

from bert.options import flag

if TYPE_CHECKING:
    from bert.tasks.common import Limits, ModelFacts
    from bert.tasks.windows import LongInputs

# What a backend hands back for a head of each kind (a task served by the encoder itself: ENCODER_OUTPUTS), named
# after the task: (suffixes of its outputs, their ranks in a batch, one value per token or not). "span": start and
# end logits (B, T) each; "mlm": the likeliest tokens' scores and ids (B, T, MLM_CANDIDATES). A kind declared
# elsewhere joins with `declare_head_kind`, beside its task (the torch side of the kind is an object in bert/heads.py).
HEAD_OUTPUTS: dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]] = {
    "sequence": (("",), (2,), False),
    "token": (("",), (3,), True),
    "span": (("_start", "_end"), (2, 2), True),
    "mlm": (("_scores", "_ids"), (3, 3), True),
}


# What a task without a head answers from, by the name of the encoder's output it reads (bert/model.py's
# EncoderOutput), in HEAD_OUTPUTS' terms: the pooled sentence vector (B, H), or every token's last hidden state
# (B, T, H).
ENCODER_OUTPUTS: dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]] = {
    "embedding": (("",), (2,), False),
    "last_hidden_state": (("",), (3,), True),
}


def declare_head_kind(name: str, suffixes: tuple[str, ...], ranks: tuple[int, ...], per_token: bool) -> str:
    """Add a head kind to HEAD_OUTPUTS (what its task's backend arrays are: see there); the same declaration again
    is a no-op (a module imported twice), a different one an error."""
    declared = (tuple(suffixes), tuple(ranks), bool(per_token))
    if len(declared[0]) != len(declared[1]):
        raise ValueError(f"head kind {name!r}: one rank per output suffix")
    if HEAD_OUTPUTS.setdefault(name, declared) != declared:
        raise ValueError(f"head kind {name!r} is declared twice, differently")
    return name


def head_kinds() -> tuple[str, ...]:
    """The head kinds a task may declare."""
    return tuple(HEAD_OUTPUTS)


# Candidates per token an "mlm" head hands back (probabilities and ids of its likeliest tokens), not (B, T, V)
# logits: a 30k vocabulary would make every served sequence tens of megabytes. A request's top_k is at most this.
MLM_CANDIDATES = 50


class UnknownTask(ValueError):
    """A task name the registry does not know; the message lists the known ones."""


class EmptyInput(ValueError):
    """A request with nothing to work on (no inputs, a blank text): the server's 400."""


class TooManyInputs(ValueError):
    """More items in one request than it may carry: the server's 413."""


@dataclass(frozen=True)
class Head:
    """How a task's head sits on the encoder. Each kind is one object in bert/heads.py (it builds, runs and exports
    its module; the model, checkpoint writer and exporter look it up by this name):
    - "sequence": dropout + linear on the pooled [CLS] state (the pooler: dense + tanh), one row per sequence;
    - "token": dropout + linear on every token's state;
    - "span": one linear H -> 2 on every token, split into start and end logits;
    - "mlm": the masked-LM transform (dense, activation, LayerNorm) and the decoder tied to the word embeddings,
      scored as probabilities and cut to the `width` most likely tokens in the graph itself.
    `attribute` is the head's name in a multi-task model, `single_attribute` in a checkpoint made for this task
    alone (transformers' names: "classifier", "qa_outputs", "cls"). `width`: outputs per row (None: one per label).
    """

    kind: str
    attribute: str
    single_attribute: str
    width: int | None = None

    def __post_init__(self):
        if self.kind not in head_kinds():
            raise ValueError(f"head kind must be one of {', '.join(head_kinds())}, got {self.kind!r}")


REQUIRED = ...  # a request field with no default


class TextPair(list):
    """A request's [text, text_pair]: exactly two texts (the request model bounds it)."""


@dataclass(frozen=True)
class Param:
    """One field of a request body, declared once: the server's request model (serving/routes/schemas.py) and,
    with `job`, python -m batch's `--<name>` (batch/options.py) are made of it. `kind`: its type (a `Literal`
    gives its choices); `minimum` / `maximum`: a number's bounds; `min_length`: a text's shortest length.
    `job_kind` / `job_default`: the batch job's type and default where they differ from a request's (a list
    option where a request also takes one comma-separated string; no default where a request requires one)."""

    name: str
    kind: Any
    default: Any = REQUIRED
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    examples: tuple = ()
    job: bool = False
    job_kind: Any = None
    job_default: Any = REQUIRED
    job_help: str = ""  # the batch job's help where a request's speaks of the server

    @property
    def job_value(self) -> Any:
        """The batch job option's default (`job_default`, else the request's)."""
        return self.default if self.job_default is REQUIRED else self.job_default

    @property
    def choices(self) -> tuple | None:
        """The values a `Literal` kind (or an Optional one) allows, None: any of its type."""
        kind = self.job_kind or self.kind
        if get_origin(kind) is Literal:
            return get_args(kind)
        literal = [a for a in get_args(kind) if get_origin(a) is Literal]
        return get_args(literal[0]) if literal else None


MODEL = Param(
    "model",
    str | None,
    None,
    "which of the task's models answers (a name /info lists under models; default: the first); an unknown name "
    "is a 404 listing them",
)
TRUNCATE = Param("truncate", bool, False, "cut inputs longer than the model's limit instead of refusing them")
# text-embeddings-inference's fields of its embedding routes. A route that declares PROMPT_NAME gets each text with
# the model's prompt of that name before it (the route factory puts it there: serving/routes/api.py).
TEI_TRUNCATE = Param(
    "truncate",
    Union[bool, None],
    False,
    "cut inputs longer than the model's limit instead of refusing them (null: false)",
)
DIRECTIONS = ("right", "Right", "left", "Left")  # TEI's spellings of its truncation_direction
TRUNCATION_DIRECTION = Param(
    "truncation_direction",
    Literal[DIRECTIONS],
    "right",
    "which end `truncate` cuts: right cuts a text's end (its start is kept), left its start (its end is kept)",
)
PROMPT_NAME = Param(
    "prompt_name",
    Union[str, None],
    None,
    "the name of a prompt in the model's sentence-transformers configuration (config_sentence_transformers.json's "
    '"prompts"), put before each text; an unknown name is a 422 listing the model\'s prompts',
)


def texts_param(example: str, help: str = "a text or a list of texts", name: str = "inputs") -> Param:
    """A body's texts, one or a list (`inputs`, as TEI and transformers' pipelines take them)."""
    return Param(name, Union[str, list[str]], help=help, examples=(example,))


def described(help: str, default: Any = REQUIRED):
    """A field of a task's answer (a dataclass: the type a `Route` answers) with its description, which the
    response models (serving/routes/schemas.py) give it in the OpenAPI schema; `default`: a field an answer may
    leave out (REQUIRED: one it always has)."""
    if default is REQUIRED:
        return field(metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Route:
    """One HTTP endpoint of a task. The generic route factory validates the body against `request` (a class
    name in serving/routes/schemas.py), turns it into items and options with `to_items`, runs the task's one
    inference path, and answers `shape(answers, body)` documented by `response`: the answer's type, made of the
    task's dataclasses (`list[list[Label]]`) or of plain values (`list[list[float]]`)."""

    path: str
    request: str
    response: Any
    summary: str
    to_items: Callable[[Any], tuple[list, dict]]  # body -> (items, options)
    shape: Callable[[list, Any, Any], Any]  # (answers, body, info) -> the response content
    batch_field: str = "inputs"  # the body's field named in "too many / empty" errors
    many: bool = False  # the body may also be a list of `request` objects (one item each)
    check: Callable[[Any, Any], None] | None = None  # (body, info) -> None, or raise ValueError naming the field
    # The body's fields in order (serving/routes/schemas.py makes the request model of them) and the endpoint's
    # description in the OpenAPI schema. No fields: `request` names a model written out in schemas.py.
    fields: tuple[Param, ...] = ()
    doc: str = ""


def texts_of(body) -> tuple[list, dict]:
    """A body whose `inputs` is a text or a list of texts (or pairs): the texts, and the other fields as
    options."""
    inputs = body.inputs
    return ([inputs] if isinstance(inputs, str) else list(inputs)), body.model_dump(exclude={"inputs"})


def tei_texts_of(body) -> tuple[list, dict]:
    """`texts_of` for a body with TEI_TRUNCATE, whose null means its default (false)."""
    texts, options = texts_of(body)
    options["truncate"] = bool(options["truncate"])
    return texts, options


def one_or_list(answers: list, body, info=None):
    """A single text's answer alone, a list's answers as a list."""
    return answers[0] if isinstance(body.inputs, str) else answers


def check_texts(texts: list, field: str = "inputs[{}]") -> None:
    """An empty or blank text has nothing to classify, tag or embed: EmptyInput (400), not a confident answer
    about nothing. `field` names the text in the message ("{}" takes its index)."""
    for index, text in enumerate(texts):
        parts = [text] if isinstance(text, str) else text
        if any(not part.strip() or _invisible(part) for part in parts):
            raise EmptyInput(f"{field.format(index)} is empty")
        for part in parts:
            if part.isascii():  # no surrogate: nothing to encode
                continue
            try:
                part.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate ("\ud83d" in JSON): not text a tokenizer can read
                raise ValueError(
                    f"{field.format(index)} is not valid Unicode: a lone surrogate {part[e.start]!r} at character "
                    f"{e.start} (send a whole surrogate pair, or the character itself)"
                ) from None


def _invisible(text: str) -> bool:
    """A text of only spaces, controls and format characters (a zero-width space, a byte-order mark, NUL) and
    replacement characters (U+FFFD, what a decoder leaves of bytes it could not read), which a BERT tokenizer drops:
    no tokens, so nothing to answer about. Decided at the first visible character."""
    return all(c.isspace() or c == "\ufffd" or unicodedata.category(c) in ("Cc", "Cf") for c in text)


def check_inputs(body, info=None) -> None:
    """The blank-text check of a body whose `inputs` is a text or a list of them."""
    single = isinstance(body.inputs, str)
    check_texts([body.inputs] if single else body.inputs, "inputs" if single else "inputs[{}]")


def text_chars(items: list) -> int:
    """Characters of text in a request's items (texts, [text, pair] lists, QA items as dicts)."""
    total = 0
    for x in items:
        parts = [x] if isinstance(x, str) else x.values() if isinstance(x, dict) else x
        total += sum(len(p) for p in parts if isinstance(p, str))
    return total


@dataclass(frozen=True)
class JobColumns:
    """How python -m batch runs the task on a table's rows (batch/columns.py reads it): the input columns it reads,
    how a row becomes the codec's item, and its result columns. A column's type: "string", "float32", "int32",
    "int64", "vector" (the encoder's width of float32), ("list", type) or ("struct", ((name, type), ...))."""

    inputs: tuple[str, ...]  # the default --column
    arity: tuple[int, ...]  # how many columns it may read
    results: tuple[tuple[str, Any], ...]  # (name, type) of each result column
    values: Callable[[list], dict[str, list]]  # answers (None for a failed row) -> each result column's values
    to_item: Callable[[list, dict], Any] = lambda texts, options: texts[0] if len(texts) == 1 else list(texts)
    # The job's options -> the codec's; None: `truncate` and the task's request fields that are job options.
    options: Callable[[dict], dict] | None = None


def column_of(answers: list, get) -> list:
    """One result column: `get` of each answer, None where the row failed."""
    return [None if a is None else get(a) for a in answers]


@dataclass(frozen=True)
class TaskOption:
    """An option or limit a task declares; the command that reads it names it after the task: the server's
    `--qa-max-length` (BERTSERVE_QA_MAX_LENGTH) is QA's `max_length`. `minimum` / `maximum`: the bounds a value
    must keep; `kind`: the value's type when the default (None) does not say. A training option (`train_options`)
    is finetune's `--name`; `multitask`: multitask offers it too (once for every task that reads it, or per task
    when the task names it in `multitask_options`), else multitask runs the task with the default; `evaluate`:
    training.evaluate has it too, defaulting to the fine-tuning run's value."""

    name: str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    kind: type | None = None
    multitask: bool = True
    evaluate: bool = True


@dataclass(frozen=True)
class Labels:
    """What a trained head predicts. `values`: labels as written in the training data, in head order (None: the
    head predicts no named labels); `names`: what the checkpoint shows for them (config id2label; None: no
    labels); `problem_type`: transformers' problem_type ("regression": one output, MSE), None by default."""

    values: list | None = None
    names: list | None = None
    problem_type: str | None = None


class Task:
    """Base class of every task; subclasses set the class attributes and implement the codec (and the training
    hooks when trainable). Class attributes, not instance fields: a task is declared, not configured."""

    name: ClassVar[str]
    order: ClassVar[int] = 100  # where it stands in listings (registration order of the built-in tasks)
    head: ClassVar[Head | None]  # None: served by the encoder itself (embed)
    encoder_output: ClassVar[str] = "embedding"  # without a head: the encoder output it reads (ENCODER_OUTPUTS)
    # Served by every model that can serve it; False: only by a model the server names for it (--<task>-model).
    served_by_default: ClassVar[bool] = True
    # transformers classes of a checkpoint made for this task alone; the first is the one we write
    architectures: ClassVar[tuple[str, ...]] = ()
    labelled: ClassVar[bool] = False  # its head predicts named labels (id2label)
    many_inputs_per_item: ClassVar[bool] = False  # an item is many model inputs (a query against each text)
    graph_outputs: ClassVar[dict[str, str]]  # output names in an exported multi-task graph -> our output names
    single_graph_outputs: ClassVar[dict[str, str]]  # output names in a graph made for this task alone -> ours
    routes: ClassVar[tuple[Route, ...]] = ()
    # How a text longer than one model input is answered (bert/tasks/windows.py): windows, and how their answers
    # merge. None: it is refused (422), or cut when the request asks ("truncate": true).
    long_inputs: ClassVar[LongInputs | None] = None
    trainable: ClassVar[bool] = False
    main_metric: ClassVar[str] = ""  # the metric (0-100 after `score`) best/ is chosen by

    # How python -m batch runs it; None: batch jobs do not run it.
    job: ClassVar[JobColumns | None] = None
    # Export's verification and int8 search: the calibration inputs it is judged on (export/sensitivity.py's
    # CALIBRATION_SETS: "sentences", "question_contexts", "ranked_groups" of a query's candidates, "hypotheses" of a
    # text's labels), and what
    # "agreement" with fp32 means for it (None: its head kind's, bert/heads.py: labels, positions, top-1 token).
    calibration: ClassVar[str] = "sentences"
    agreement: ClassVar[str | None] = None

    # The server's options for this task, generated into python -m serving's as --<task>-<name>; a task that
    # has `margins` also gets --<task>-verify-model and --<task>-verify-margin.
    serve_options: ClassVar[tuple[TaskOption, ...]] = ()

    def serve_problems(self, values: dict) -> list[str]:
        """Contradictions among this task's serve_options (`values` by their names here), found at startup."""
        return []

    def max_doc_stride(self, values: dict) -> int | None:
        """The largest `doc_stride` (tokens neighbouring windows share) a request may send under these
        serve_options values, which the server declares in its OpenAPI schema; None: its requests send none."""
        return None

    # ---- what a checkpoint offers ------------------------------------------------------------------------
    def serves(self, config: dict) -> bool:
        """Whether a checkpoint made for this task alone (its architecture is ours) really is one: e.g. a
        sequence classifier serves rerank only with one output."""
        return True

    def unserved_reason(self, config: dict) -> str:
        """Why a checkpoint of this task's architecture does not serve it (serves() is False): the second half of
        the one-line refusal of a model given for this task alone (--TASK-model). "" says nothing more."""
        return ""

    # ---- what a backend hands back for it: its head kind says (HEAD_OUTPUTS), else its encoder output ------
    @property
    def _declared_outputs(self) -> tuple[tuple[str, ...], tuple[int, ...], bool]:
        return HEAD_OUTPUTS[self.head.kind] if self.head else ENCODER_OUTPUTS[self.encoder_output]

    @property
    def outputs(self) -> tuple[str, ...]:
        """The backend's arrays for this task, named after it: "classify" (B, L), "ner" (B, T, L), "qa_start"."""
        return tuple(self.name + suffix for suffix in self._declared_outputs[0])

    @property
    def output_ranks(self) -> tuple[int, ...]:
        """Each output's dimensions in a batch: (B, L) 2, (B, T, L) 3."""
        return self._declared_outputs[1]

    @property
    def per_token(self) -> bool:
        """Whether its outputs have a row per token (sliced to each sequence's length)."""
        return self._declared_outputs[2]

    @property
    def architecture(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    def job_options(self, options: dict) -> dict:
        """A batch job's options -> the codec's options."""
        if self.job is not None and self.job.options is not None:
            return self.job.options(options)
        return {"truncate": options["truncate"], **{name: options[name] for name in sorted(self.job_fields())}}

    def job_fields(self) -> dict[str, Param]:
        """The request fields a batch job offers as its options (`Param.job`), by name."""
        return {p.name: p for route in self.routes for p in route.fields if p.job}

    def job_defaults(self, truncate: bool = False) -> dict:
        """A batch job's options at their defaults (what `job.to_item` and `job_options` read)."""
        return {"truncate": truncate, **{name: p.job_value for name, p in self.job_fields().items()}}

    def job_problems(self, options: dict) -> list[str]:
        """What is wrong with a batch job's options for this task (one message each), found before any row is read;
        it may put its options in their canonical form (a comma-separated list split) in `options`."""
        return []

    def head_width(self, labels: list | dict | None) -> int:
        return self.head.width if self.head.width is not None else len(labels or ())

    # ---- codec -------------------------------------------------------------------------------------------
    def encode_request(self, tokenizer, items: list, limits: Limits, **options) -> list[list]:
        """Items -> one list of Features per item (QA: its windows). Refusals: InputTooLong, TooMuchWork,
        ValueError (the message names the field)."""
        raise NotImplementedError

    def decode_request(self, items: list, features: list, outputs: list, facts: ModelFacts, **options) -> list:
        """One answer per item, where `outputs` holds, per item, one {output name: array} per sequence, sliced
        to the sequence's length for per-token outputs."""
        raise NotImplementedError

    def request_chars(self, items: list, options: dict) -> int:
        """Characters of text the codec tokenises for these items: the server decides by it where the codec runs
        (serving/engine.py). A task whose items fan out into several model inputs counts the text of each."""
        return text_chars(items)

    def margins(self, items: list, features: list, outputs: list, facts: ModelFacts, **options) -> list[float] | None:
        """Per item, how sure its answer is (None: the task has no notion of it and is never re-answered): an item
        whose margin is under --<task>-verify-margin is answered again by --<task>-verify-model."""
        return None

    # A task with `margins` declares its --<task>-verify-margin here: default, bounds and what the unit is.
    verify_margin: ClassVar[TaskOption | None] = None

    def decisions(self, items: list, answers: list) -> list | None:
        """What a user reads off these answers, each comparable with ==: a label, a text's entity spans, an answer,
        a query's top text (None: not declared). Export's --precision auto compares an int8 graph whose unsure
        items fp32 answers again with fp32 by them (export/verified.py)."""
        return None

    # ---- training hooks (torch imported inside) -------------------------------------------------------
    # python -m training.finetune / multitask / evaluate call these and never name a task. `cfg` is a
    # training.finetune.FinetuneConfig (multitask builds one per task; evaluate one from its own options): the
    # task reads its data options from it (train_data, eval_data, max_seq_length, max_*_examples and the fields
    # in `train_options`). Examples are whatever the task's reader returns; Labels says what its head predicts.
    # The options only this task reads (others leave them at their defaults), declared here: training.finetune's
    # config is generated from them (a name two tasks read is one declaration both use).
    train_options: ClassVar[tuple[TaskOption, ...]] = ()
    multitask_options: ClassVar[
        tuple[str, ...]
    ] = ()  # of those, the ones multitask gives each task its own copy of: --<task>-<option>
    train_max_seq_length: ClassVar[int] = 128  # multitask's default --<task>-max-seq-length
    train_data_help: ClassVar[str] = ""  # what --train-data / --<task>-train holds for this task (help text)

    def train_problems(self, cfg) -> list[str]:
        """Contradictions among this task's options (one message each), checked before any data is read."""
        return [] if cfg.eval_data else [f"{flag(cfg, 'eval_data')} is required"]

    def read_examples(self, cfg, *, train: bool = True) -> tuple[list, list]:
        """(training examples, evaluation examples) as cfg's data options say, before any --max-*-examples cut;
        with train=False only the evaluation examples are read (the first list is empty)."""
        raise NotImplementedError

    def train_labels(self, cfg, train: list, evaluation: list) -> Labels:
        """What the head of a run on these examples predicts (raise bert.config.ConfigError when the
        evaluation examples need a label the training examples never show)."""
        return Labels()

    def saved_labels(self, cfg, model_config, saved: dict) -> Labels:
        """What a fine-tuned checkpoint's head predicts: its config (id2label, problem_type) and the run's
        settings saved beside it (finetune_config.json), for evaluation."""
        return Labels()

    def encode_train(self, tokenizer, examples: list, labels: Labels, cfg) -> tuple[list, list]:
        """Training examples -> (Features per training input, its target per input)."""
        raise NotImplementedError

    def train_group_size(self, cfg) -> int:
        """Training inputs that must share a batch, as consecutive runs of this many (a loss over a query's
        candidates); 1: each input stands alone. Batches then hold whole groups, --batch-size inputs each."""
        return 1

    def collate_targets(self, targets: list, width: int) -> dict:
        """A batch's targets as tensors, under the names the single-task model's forward takes (its `labels`,
        `start_positions`, ...); `width` is the batch's padded length."""
        raise NotImplementedError

    def loss(self, outputs: dict, batch: dict):
        """This task's loss from a BertForMultiTask forward: `outputs` maps graph-output names
        (`graph_outputs`) to tensors, `batch` holds collate_targets' tensors. A single-task model computes its
        own loss from the same tensors."""
        raise NotImplementedError

    def evaluate(self, model, tokenizer, examples: list, labels: Labels, cfg) -> dict:
        """Predict with `model` (a single-task model, or a multi-task model seen as one: outputs named as in
        `single_graph_outputs`) and measure: the metrics dict metrics.json records."""
        raise NotImplementedError

    def best_metric(self, labels: Labels) -> str:
        """The metric best/ is chosen by (higher is better)."""
        return self.main_metric

    def score(self, metrics: dict) -> float:
        """The main metric on a 0-100 scale."""
        return float(metrics[self.main_metric])

    def summary(self, metrics: dict) -> str:
        """One line of the metrics a person looks at first."""
        return f"{self.name} {self.main_metric} {self.score(metrics):.2f}"

    def embed_texts(self, examples: list) -> dict[str, list[str]]:
        """Texts of evaluation examples, by source name, as /embed would be asked to embed them: what
        multitask's --embed-teacher agreement is measured on."""
        return {}

    def output_name(self, output: str, *, single: bool = False) -> str:
        """The graph-output name (multi-task, or with `single` a graph of this task alone) of one of our outputs."""
        names = self.single_graph_outputs if single else self.graph_outputs
        return next(name for name, ours in names.items() if ours == output)

    def __repr__(self) -> str:
        return f"<task {self.name}>"
