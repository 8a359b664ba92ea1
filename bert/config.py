"""BertConfig: the architecture of a BERT model, read from and written to Hugging Face `config.json`.

No torch here: serving reads configs of exported artifacts without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BadInput, json_type
from .families import FAMILIES, Family, UnsupportedFamily, family_of

# Google's BERT family (BERT-FACTS.md): name -> (layers, hidden, heads). Feed-forward is 4 * hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

ACTIVATIONS = ("gelu", "relu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish")
LAYER_TYPES = ("full_attention", "sliding_attention")
RELATIVE_TERMS = ("c2p", "p2c")  # disentangled attention: content->position, position->content
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
# BertConfig's building-block fields (where a family's encoder differs from BERT's): each family declares those its
# transformers classes read (Family.config_blocks); the same key in another family's config.json is one transformers
# never reads there, so it builds nothing here either (kept in `extra`, written back as it was).
BLOCK_FIELDS = tuple(dict.fromkeys(key for family in FAMILIES for key in family.config_blocks))
# A config.json without these does not say which model it is (every transformers-written one has them).
REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
# Far beyond any BERT (BERT-large: 3.4e8 parameters; multilingual vocabularies: ~1.2e5 tokens). A config
# past them is corrupt, and is refused before a model of that size is allocated (vocab_size 10**12 would
# ask for terabytes).
MAX_PARAMETERS = 20_000_000_000
MAX_LABELS = 1_000_000

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_short = _repr.repr  # a value quoted in an error message: short, so the message stays one line


class ConfigError(BadInput, ValueError):
    """A config that cannot describe a working model, or a command's options that cannot work together (raised
    before any work starts); one line, exit 2."""


@dataclass
class BertConfig:
    vocab_size: int = 30522  # WordPiece vocabulary size
    hidden_size: int = 768  # H, width of every token state
    num_hidden_layers: int = 12  # L, number of encoder blocks
    num_attention_heads: int = 12  # A, must divide H
    intermediate_size: int = 3072  # feed-forward width (4H in the paper)
    hidden_act: str = "gelu"  # exact (erf) GELU, as in the original BERT
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512  # longest sequence the position table covers
    type_vocab_size: int = 2  # segments A/B
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02  # std of the truncated-normal init
    pad_token_id: int = 0
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    architectures: list[str] | None = None  # HF class names, e.g. ["BertForSequenceClassification"]
    id2label: dict[int, str] | None = None  # task heads: output index -> label
    problem_type: str | None = None  # "regression" | "single_label_classification" | "multi_label_classification"
    task: str | None = None  # bertserve task this checkpoint was made for (bert.tasks.registry)
    # Multi-task checkpoints (one encoder, several heads): task -> its labels; qa needs none.
    task_labels: dict[str, list[str]] | None = None
    # The layout family (bert/families/): its model_type, as config.json names it ("roberta", "distilbert", ...)
    model_type: str = "bert"
    embedding_size: int | None = None  # ELECTRA: width of the embedding tables, projected to hidden_size (None: H)
    # Building blocks beyond BERT's, under transformers' names; None (never written) is BERT's own choice.
    rope_theta: float | None = None  # rotary positions with this base, instead of a position table
    local_rope_theta: float | None = None  # the rotary base of windowed layers (None: rope_theta)
    layer_types: list[str] | None = None  # per layer: "full_attention" or "sliding_attention" (None: all full)
    local_attention: int | None = None  # a sliding layer's window: each token sees those local_attention // 2 away
    attention_bias: bool | None = None  # False: attention projections without biases
    mlp_bias: bool | None = None  # False: feed-forward projections without biases
    norm_bias: bool | None = None  # False: LayerNorms without biases
    classifier_pooling: str | None = None  # what the pooler reads: the first token ("cls", None) or the "mean"
    classifier_activation: str | None = None  # pooler and MLM transform activation (None: the family's, hidden_act)
    classifier_bias: bool | None = None  # False: pooler and MLM transform without a bias
    decoder_bias: bool | None = None  # False: the MLM decoder without its output bias (ModernBERT's option)
    position_biased_input: bool | None = None  # False: no absolute position table (positions are relative only)
    # Disentangled (relative) attention, DeBERTa's: each layer adds content->position ("c2p") and/or
    # position->content ("p2c") scores, read from a shared table of relative-position embeddings
    relative_attention: bool | None = None
    pos_att_type: list[str] | None = None  # which of "c2p", "p2c" the scores have
    position_buckets: int | None = None  # > 0: relative distances log-bucketed into this many each way
    max_relative_positions: int | None = None  # < 1: max_position_embeddings
    share_att_key: bool | None = None  # position projections are the content query/key ones
    norm_rel_ebd: str | None = None  # "layer_norm": the relative embeddings through a LayerNorm first
    # Keys we do not model (transformers_version, torch_dtype, ...): kept so a round trip loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.id2label is not None:
            try:
                self.id2label = {int(k): str(v) for k, v in dict(self.id2label).items()}
            except (TypeError, ValueError):
                raise ConfigError(
                    f"invalid BERT config: id2label must map label ids to names, got {_short(self.id2label)}"
                ) from None
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Every value checked for its type before it is compared, so that a config.json of the wrong
        shape is one ConfigError naming the field, never a TypeError."""
        problems = []
        try:
            family_of(self.model_type)  # a model_type some family covers
        except UnsupportedFamily as e:
            raise ConfigError(str(e)) from None
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if name == "type_vocab_size" and value == 0:
                continue  # no token types (DistilBERT's family; DeBERTa's config)
            if not _is_int(value) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {_short(value)}")
        sizes_ok = not problems
        if sizes_ok and self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if sizes_ok and self.parameter_estimate > MAX_PARAMETERS:
            problems.append(
                f"it describes a model of about {self.parameter_estimate:.1e} parameters "
                f"(vocab_size {self.vocab_size}, hidden_size {self.hidden_size}, num_hidden_layers {self.num_hidden_layers}, intermediate_size "
                f"{self.intermediate_size}, max_position_embeddings {self.max_position_embeddings}); no BERT has "
                f"more than {MAX_PARAMETERS:.0e}"
            )
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACTIVATIONS:
            problems.append(f"hidden_act {_short(self.hidden_act)} is not one of {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            p = getattr(self, name)
            if p is None and name == "classifier_dropout":
                continue
            if not _is_number(p) or not 0.0 <= p < 1.0:
                problems.append(f"{name} must be in [0, 1), got {_short(p)}")
        for name in ("layer_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                problems.append(f"{name} must be a positive number, got {_short(value)}")
        if not _is_int(self.pad_token_id):
            problems.append(f"pad_token_id must be an integer, got {_short(self.pad_token_id)}")
        elif _is_int(self.vocab_size) and not 0 <= self.pad_token_id < self.vocab_size:
            problems.append(f"pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        problems.extend(self._block_problems())
        if self.embedding_size is not None and (not _is_int(self.embedding_size) or self.embedding_size <= 0):
            problems.append(f"embedding_size must be a positive integer, got {_short(self.embedding_size)}")
        if self.architectures is not None and (
            not isinstance(self.architectures, list) or not all(isinstance(a, str) for a in self.architectures)
        ):
            problems.append(f"architectures must be a list of class names, got {_short(self.architectures)}")
        if self.id2label is not None and sorted(self.id2label) != list(range(len(self.id2label))):
            problems.append(f"id2label keys must be 0..{len(self.id2label) - 1}, got {_short(sorted(self.id2label))}")
        if self.id2label is not None and len(self.id2label) > MAX_LABELS:
            problems.append(f"id2label has {len(self.id2label)} labels, more than {MAX_LABELS}")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            problems.append(f"problem_type {_short(self.problem_type)} is not one of {', '.join(PROBLEM_TYPES)}")
        if self.task_labels is not None and not isinstance(self.task_labels, dict):
            problems.append(f"task_labels must map tasks to label lists, got {_short(self.task_labels)}")
        # The task names come from the registry, read here rather than at import: a config needs no codec.
        from .tasks import registry

        tasks, headed_tasks = registry.names(), registry.with_heads()
        for t, labels in (self.task_labels if isinstance(self.task_labels, dict) else {}).items():
            if t not in headed_tasks:
                problems.append(f"task_labels names task {_short(t)}, which is not one of {', '.join(headed_tasks)}")
            elif not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
                problems.append(f"task_labels[{t!r}] must be a list of label names, got {_short(labels)}")
            elif len(labels) > MAX_LABELS:
                problems.append(f"task_labels[{t!r}] has {len(labels)} labels, more than {MAX_LABELS}")
        if self.task is not None and (not isinstance(self.task, str) or self.task not in tasks):
            problems.append(f"task {_short(self.task)} is not one of {', '.join(tasks)}")
        if problems:
            raise ConfigError("invalid BERT config: " + "; ".join(problems))

    def _block_problems(self) -> list[str]:
        problems = []
        for name in ("rope_theta", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value <= 0):
                problems.append(f"{name} must be a positive number, got {_short(value)}")
        for name in ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias", "decoder_bias"):
            if getattr(self, name) not in (None, True, False):
                problems.append(f"{name} must be true or false, got {_short(getattr(self, name))}")
        if self.classifier_pooling not in (None, "cls", "mean"):
            problems.append(f"classifier_pooling must be cls or mean, got {_short(self.classifier_pooling)}")
        if self.classifier_activation is not None and self.classifier_activation not in (*ACTIVATIONS, "tanh"):
            problems.append(
                f"classifier_activation {_short(self.classifier_activation)} is not one of {', '.join(ACTIVATIONS)}, tanh"
            )
        for name in ("position_biased_input", "relative_attention", "share_att_key"):
            if getattr(self, name) not in (None, True, False):
                problems.append(f"{name} must be true or false, got {_short(getattr(self, name))}")
        terms = self.pos_att_type
        if terms is not None and (not isinstance(terms, list) or not set(terms) <= set(RELATIVE_TERMS)):
            problems.append(f"pos_att_type must be a list of {', '.join(RELATIVE_TERMS)}, got {_short(terms)}")
        for name in ("position_buckets", "max_relative_positions"):
            if getattr(self, name) is not None and not _is_int(getattr(self, name)):
                problems.append(f"{name} must be an integer, got {_short(getattr(self, name))}")
        if self.norm_rel_ebd is not None and self.norm_rel_ebd not in ("none", "layer_norm"):
            problems.append(f"norm_rel_ebd must be none or layer_norm, got {_short(self.norm_rel_ebd)}")
        types = self.layer_types
        if types is not None:
            if not isinstance(types, list) or not all(t in LAYER_TYPES for t in types):
                problems.append(f"layer_types must be a list of {' or '.join(LAYER_TYPES)}, got {_short(types)}")
            elif _is_int(self.num_hidden_layers) and len(types) != self.num_hidden_layers:
                problems.append(f"layer_types has {len(types)} entries for {self.num_hidden_layers} layers")
            elif "sliding_attention" in types and (not _is_int(self.local_attention) or self.local_attention < 2):
                problems.append(
                    f"local_attention must be an integer of at least 2 for sliding layers, got {_short(self.local_attention)}"
                )
        return problems

    def attention_window(self, index: int) -> int | None:
        """How far layer `index` looks each way (None: the whole sequence)."""
        if self.layer_types and self.layer_types[index] == "sliding_attention":
            return self.local_attention // 2
        return None

    def layer_rope_theta(self, index: int) -> float | None:
        """The rotary base of layer `index` (None: no rotary positions)."""
        if self.rope_theta is None:
            return None
        if self.attention_window(index) is not None and self.local_rope_theta is not None:
            return float(self.local_rope_theta)
        return float(self.rope_theta)

    @property
    def position_table(self) -> bool:
        """Whether the embeddings add a learned (or sinusoidal) absolute position table."""
        return self.rope_theta is None and self.position_biased_input is not False

    @property
    def relative_span(self) -> int:
        """Disentangled attention: how many relative-position embeddings each side of 0 (0: none)."""
        if not self.relative_attention:
            return 0
        if self.position_buckets and self.position_buckets > 0:
            return self.position_buckets
        limit = self.max_relative_positions
        return limit if limit and limit > 0 else self.max_position_embeddings

    @property
    def relative_max_position(self) -> int:
        """The distance the log buckets reach (max_relative_positions, else max_position_embeddings)."""
        limit = self.max_relative_positions
        return limit if limit and limit > 0 else self.max_position_embeddings

    # ------------------------------------------------------------ derived
    @property
    def parameter_estimate(self) -> int:
        """Parameters of the encoder (embeddings + layers), to within a few percent; computed, never allocated."""
        hidden, inner = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * hidden
        return embeddings + self.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * inner)

    @property
    def family(self) -> Family:
        return family_of(self.model_type)

    @property
    def position_offset(self) -> int:
        """The position id of a sequence's first token: 0, or pad_token_id + 1 in RoBERTa's layout (its position
        table has that many rows more than max_position_embeddings, which counts usable positions)."""
        return self.pad_token_id + 1 if self.family.position_offset else 0

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def tie_word_embeddings(self) -> bool:
        """Whether a masked-LM decoder is the word-embedding table (transformers' tie_word_embeddings: true unless
        config.json says false, when transformers gives the decoder weights of its own, which our masked-LM head does
        not have: bert.checkpoint refuses such a checkpoint)."""
        return self.extra.get("tie_word_embeddings") is not False

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def label2id(self) -> dict[str, int]:
        return {label: i for i, label in (self.id2label or {}).items()}

    def with_labels(self, labels: list[str]) -> "BertConfig":
        return dataclasses.replace(self, id2label=dict(enumerate(labels)))

    # ------------------------------------------------------------ presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; presets are {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        args = dict(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden
        )
        args.update(overrides)
        return cls(**args)

    # ------------------------------------------------------- config.json I/O
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BertConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"a BERT config is a JSON object of settings, not a JSON {json_type(data)}")
        model_type = data.get("model_type", "bert")
        try:
            family = family_of(model_type)
        except UnsupportedFamily as e:
            if data.get("auto_map"):  # a family only the repository's own code defines
                raise ConfigError(
                    f"{e} (auto_map names the repository's own code, which bertserve never runs)"
                ) from None
            raise ConfigError(str(e)) from None
        try:
            data = {**family.config_to_ours(data), "model_type": model_type}
        except UnsupportedFamily as e:  # a setting of the family we do not run
            raise ConfigError(f"invalid BERT config: {e}") from None
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise ConfigError(f"invalid BERT config: it lacks {', '.join(missing)}")
        unread = (set(BLOCK_FIELDS) - set(family.config_blocks)) | set(family.unread_keys)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"} - unread
        args = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and k != "label2id"}
        if "num_labels" in extra and "id2label" not in args:
            count = extra["num_labels"]
            if not _is_int(count) or not 1 <= count <= MAX_LABELS:  # checked before a dict of that size is built
                raise ConfigError(
                    f"invalid BERT config: num_labels must be an integer in 1..{MAX_LABELS}, got {_short(count)}"
                )
            args["id2label"] = {i: f"LABEL_{i}" for i in range(count)}
        extra.pop("num_labels", None)
        return cls(**args, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        data = {**self.extra, **{k: v for k, v in data.items() if v is not None}}
        data["model_type"] = self.model_type
        if self.id2label is not None:
            data["id2label"] = {str(i): label for i, label in self.id2label.items()}
            data["label2id"] = self.label2id
        return self.family.config_to_theirs(data, self.model_type)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no config.json at {path}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}), so not a config.json") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        except OSError as e:
            raise ConfigError(f"{path} cannot be read: {e.strerror or e}") from None
        try:
            return cls.from_dict(data)
        except ConfigError as e:  # the same rules as for a config built in code, and the file they come from
            raise ConfigError(f"{path}: {e}") from None

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def head_layout(config: BertConfig) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The task heads a checkpoint holds, as (task -> its labels, task -> the head's attribute); torch-free, so
    serving reads the same answer from a directory as the model it loads (bert.model.BertForMultiTask):
    - a multi-task checkpoint (config.task_labels): those tasks, each at its multi-task attribute (Head.attribute);
    - a checkpoint made for one task alone (config.task, else its architectures): every task its architecture
      serves (the registry's tasks_of_architecture: a one-output sequence classifier serves classify and rerank
      from its one head; with config.task, those whose head is of that task's kind), at their single-task
      attributes (Head.single_attribute: transformers' names);
    - a bare encoder, or a config whose task has no head: none (those tasks are served by the encoder)."""
    from .tasks import registry

    tasks_table = registry.TASKS
    if config.task_labels:
        unknown = [t for t in config.task_labels if t not in tasks_table or tasks_table[t].head is None]
        if unknown:
            raise ConfigError(
                f"config.task_labels names {', '.join(map(repr, unknown))}: not tasks with a head "
                f"({', '.join(registry.with_heads())})"
            )
        return (
            {t: list(labels or []) for t, labels in config.task_labels.items()},
            {t: tasks_table[t].head.attribute for t in config.task_labels},
        )
    declared = tasks_table.get(config.task) if config.task else None
    if declared is not None and declared.head is None:
        return {}, {}
    architectures = ([declared.architecture] if declared is not None and declared.architecture else []) + list(
        config.architectures or []
    )
    facts = {**config.to_dict(), "num_labels": config.num_labels}
    found = [t for a in architectures for t in registry.tasks_of_architecture(a, facts)]
    if declared is not None:  # made for that task: the tasks its head's outputs answer, not every reading of them
        found = [t for t in found if tasks_table[t].head.kind == declared.head.kind]
    if declared is not None and declared.name not in found:
        found.insert(0, declared.name)
    tasks = list(dict.fromkeys(found))
    labels = (
        [config.id2label[i] for i in range(len(config.id2label))]
        if config.id2label
        else [f"LABEL_{i}" for i in range(config.num_labels)]
    )
    return (
        {t: list(labels) if tasks_table[t].labelled else [] for t in tasks},
        {t: tasks_table[t].head.single_attribute for t in tasks},
    )
