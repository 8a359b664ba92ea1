"""BertConfig: the architecture of a BERT model, read from and written to Hugging Face `config.json`.

No torch here: serving reads configs of exported artifacts without it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
TASKS = ("classify", "ner", "qa")


class ConfigError(ValueError):
    """A config that cannot describe a working model."""


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
    task: str | None = None  # bertserve task this checkpoint serves: classify | ner | qa
    # Multi-task checkpoints (one encoder, several heads): task -> its labels; qa needs none.
    task_labels: dict[str, list[str]] | None = None
    # Keys we do not model (transformers_version, torch_dtype, ...): kept so a round trip loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        problems = []
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems and self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})")
        if self.hidden_act not in ACTIVATIONS:
            problems.append(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                problems.append(f"{name} must be in [0, 1), got {p}")
        if self.layer_norm_eps <= 0:
            problems.append(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if isinstance(self.vocab_size, int) and not 0 <= self.pad_token_id < self.vocab_size:
            problems.append(f"pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.id2label is not None and sorted(self.id2label) != list(range(len(self.id2label))):
            problems.append(f"id2label keys must be 0..{len(self.id2label) - 1}, got {sorted(self.id2label)}")
        for t in (self.task_labels or {}):
            if t not in TASKS:
                problems.append(f"task_labels names task {t!r}, which is not one of {', '.join(TASKS)}")
        if self.task is not None and self.task not in TASKS:
            problems.append(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        if problems:
            raise ConfigError("invalid BERT config: " + "; ".join(problems))

    # ------------------------------------------------------------ derived
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

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
        args = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                    intermediate_size=4 * hidden)
        args.update(overrides)
        return cls(**args)

    # ------------------------------------------------------- config.json I/O
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BertConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        args = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and k not in ("label2id", "model_type")}
        if "num_labels" in extra and "id2label" not in args:
            args["id2label"] = {i: f"LABEL_{i}" for i in range(int(extra["num_labels"]))}
        extra.pop("num_labels", None)
        if data.get("model_type", "bert") != "bert":
            raise ConfigError(f"model_type is {data['model_type']!r}; only BERT checkpoints are supported")
        return cls(**args, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        data = {**self.extra, **{k: v for k, v in data.items() if v is not None}}
        data["model_type"] = "bert"
        if self.id2label is not None:
            data["id2label"] = {str(i): label for i, label in self.id2label.items()}
            data["label2id"] = self.label2id
        return data

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no config.json at {path}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path
