"""Model families: each BERT-style encoder layout we load, declared once.

A family says which `model_type`s of a transformers config.json it covers, how its config keys and parameter
names map onto BERT's (both ways: we load theirs, and write ours in their layout so that transformers loads
them), and its few differences from BERT as flags the one encoder forward (bert/model.py) reads. Everything
inside bertserve speaks BERT's names; a family's own names exist only at the edges: reading and writing
config.json and the weights.

Adding a family is one `Family(...)` here (plus, if it differs from BERT in a way no flag covers yet, that flag
in bert/model.py). torch-free: serving reads artifact configs without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from .errors import BadInput

# The classes transformers has for each of our single-task layouts, by suffix after the family's class prefix
# ("Bert" + "ForSequenceClassification"); other architectures keep their names.
ARCHITECTURE_SUFFIXES = ("Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")


class UnsupportedFamily(BadInput, ValueError):
    """A config.json whose model_type no family covers, or a setting of its family we do not run."""


@dataclass(frozen=True)
class Family:
    name: str
    # model_type -> the prefix of its transformers class names ("xlm-roberta": "XLMRoberta")
    model_types: dict[str, str]
    # the encoder's attribute in a head model's state dict ("roberta.encoder...."); BERT's is "bert"
    base_prefix: str
    # config.json key -> ours (BertConfig field); keys not listed are BERT's own
    config_keys: dict[str, str] = field(default_factory=dict)
    # transformers' config class defaults that differ from BertConfig's, for keys a config.json may omit
    config_defaults: dict[str, Any] = field(default_factory=dict)
    # (their substring, BERT's substring) inside a parameter name, each replaced once, in this order (both ways)
    parameter_names: tuple[tuple[str, str], ...] = ()
    # Where a sequence classifier's first-token layer (ours: the pooler, bert.pooler.dense) and output layer
    # (ours: the head itself) sit in their layout; "{head}" is the head's attribute ("classifier").
    # None: BERT's layout (pooler in the encoder, the head a plain Linear).
    sequence_pooler: str | None = None
    sequence_output: str = "{head}"
    # (their prefix, ours) of head parameters whose place depends on the model's heads: taken when the model has
    # parameters under our prefix, the first that applies (ModernBERT's one "head." is the pooler of a classifier
    # and the transform of a masked LM)
    head_prefixes: tuple[tuple[str, str], ...] = ()
    # the transformers class suffixes this family's architectures map onto ours
    architecture_suffixes: tuple[str, ...] = ARCHITECTURE_SUFFIXES
    # config.json <-> ours beyond key renames (nested or derived keys): (to ours, to theirs), each dict -> dict
    config_converters: tuple[Callable[[dict], dict], Callable[[dict], dict]] | None = None
    # --- differences the encoder forward reads (bert/model.py) ---
    position_offset: bool = False  # positions start at pad_token_id + 1 (fairseq's convention)
    token_types: bool = True  # False: no token-type table at all
    pooler_activation: str = "tanh"  # the first-token layer's activation before a sequence head
    bare_pooler: bool = True  # a bare encoder of this family carries a pooler
    pre_norm: bool = False  # LayerNorm before each sublayer (and one after the last layer), not after
    first_attention_norm: bool = True  # with pre_norm: False leaves the first layer's attention input as it is
    gated_mlp: bool = False  # the feed-forward input projection is 2x wide: act(first half) * second half (GLU)
    qkv_projection: bool = False  # query, key and value as one (3H, H) projection, attention.self.qkv
    pooler_norm: bool = False  # the pooler ends in a LayerNorm
    token_head_transform: bool = False  # per-token heads (token, span) read the pooler's transform of each token

    # ---- config.json ------------------------------------------------------------------------------------
    def config_to_ours(self, data: dict) -> dict:
        """A config.json's keys and values as BertConfig reads them (positions counted as usable positions)."""
        if self.config_converters is not None:
            data = self.config_converters[0](data)
        out = dict(self.config_defaults)
        out.update({self.config_keys.get(k, k): v for k, v in data.items()})
        if not self.token_types:
            out["type_vocab_size"] = 0
        if self.position_offset and isinstance(out.get("max_position_embeddings"), int):
            pad = out.get("pad_token_id", 0)
            out["max_position_embeddings"] -= (pad if isinstance(pad, int) else 0) + 1
        if isinstance(out.get("architectures"), list):
            out["architectures"] = [self.architecture_to_ours(a) for a in out["architectures"]]
        return out

    def config_to_theirs(self, data: dict, model_type: str) -> dict:
        """Our config dict in this family's keys (the inverse of config_to_ours)."""
        data = dict(data)
        if not self.token_types:
            data.pop("type_vocab_size", None)
        if self.position_offset and "max_position_embeddings" in data:
            data["max_position_embeddings"] += data.get("pad_token_id", 0) + 1
        if isinstance(data.get("architectures"), list):
            data["architectures"] = [self.architecture_to_theirs(a, model_type) for a in data["architectures"]]
        theirs = {ours: key for key, ours in self.config_keys.items()}
        data = {theirs.get(k, k): v for k, v in data.items()}
        return self.config_converters[1](data) if self.config_converters is not None else data

    def architecture_to_ours(self, name: str) -> str:
        for prefix in sorted(self.model_types.values(), key=len, reverse=True):
            suffix = name[len(prefix) :] if name.startswith(prefix) else None
            if suffix in self.architecture_suffixes:
                return "Bert" + suffix
        return name

    def architecture_to_theirs(self, name: str, model_type: str) -> str:
        suffix = name[len("Bert") :] if name.startswith("Bert") else None
        return self.model_types[model_type] + suffix if suffix in self.architecture_suffixes else name

    # ---- parameter names --------------------------------------------------------------------------------
    def name_to_bert(self, key: str, model_keys: Collection[str] = ()) -> str:
        """A parameter name in this family's layout -> BERT's (as transformers' BERT classes name it);
        `model_keys`: the model's own parameter names, which place the head_prefixes."""
        for theirs, ours in self.head_prefixes:
            if key.startswith(theirs) and any(k.startswith(ours) for k in model_keys):
                return ours + key[len(theirs) :]
        if self.sequence_pooler is not None:
            pooler = self.sequence_pooler.format(head="classifier") + "."
            output = self.sequence_output.format(head="classifier") + "."
            if key.startswith(pooler):
                return "bert.pooler.dense." + key[len(pooler) :]
            if output != "classifier." and key.startswith(output):
                return "classifier." + key[len(output) :]
        if self.base_prefix != "bert" and key.startswith(self.base_prefix + "."):
            key = "bert." + key[len(self.base_prefix) + 1 :]
        for theirs, bert in self.parameter_names:
            key = key.replace(theirs, bert, 1)
        return key

    def name_from_bert(self, key: str, sequence_head: str | None = None) -> str:
        """BERT's parameter name -> this family's; `sequence_head`: the attribute of the model's sequence
        classifier, whose layers this family lays out its own way (None: the model has none)."""
        for theirs, ours in self.head_prefixes:
            if key.startswith(ours):
                return theirs + key[len(ours) :]
        if self.sequence_pooler is not None and sequence_head is not None:
            if key.startswith("bert.pooler.dense."):
                return self.sequence_pooler.format(head=sequence_head) + key[len("bert.pooler.dense") :]
            if key.startswith(sequence_head + "."):
                return self.sequence_output.format(head=sequence_head) + key[len(sequence_head) :]
        if self.base_prefix != "bert" and key.startswith("bert."):
            key = self.base_prefix + "." + key[len("bert.") :]
        for theirs, bert in self.parameter_names:
            key = key.replace(bert, theirs, 1)
        return key


BERT = Family("bert", {"bert": "Bert"}, "bert")

ROBERTA = Family(
    "roberta",
    {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"},
    "roberta",
    config_defaults={"pad_token_id": 1},
    sequence_pooler="{head}.dense",
    sequence_output="{head}.out_proj",
    position_offset=True,
)

DISTILBERT = Family(
    "distilbert",
    {"distilbert": "DistilBert"},
    "distilbert",
    config_keys={
        "dim": "hidden_size",
        "n_layers": "num_hidden_layers",
        "n_heads": "num_attention_heads",
        "hidden_dim": "intermediate_size",
        "activation": "hidden_act",
        "dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob",
        "seq_classif_dropout": "classifier_dropout",
    },
    parameter_names=(
        ("transformer.layer.", "encoder.layer."),
        # the attention output first: BERT's ".attention.output.dense." also contains ".output.dense."
        (".attention.out_lin.", ".attention.output.dense."),
        (".sa_layer_norm.", ".attention.output.LayerNorm."),
        (".attention.q_lin.", ".attention.self.query."),
        (".attention.k_lin.", ".attention.self.key."),
        (".attention.v_lin.", ".attention.self.value."),
        (".ffn.lin1.", ".intermediate.dense."),
        (".ffn.lin2.", ".output.dense."),
        (".output_layer_norm.", ".output.LayerNorm."),
    ),
    sequence_pooler="pre_classifier",
    token_types=False,
    pooler_activation="relu",
    bare_pooler=False,
)

ELECTRA = Family(
    "electra",
    {"electra": "Electra"},
    "electra",
    sequence_pooler="{head}.dense",
    sequence_output="{head}.out_proj",
    pooler_activation="gelu",
    bare_pooler=False,
)


def _modernbert_to_ours(data: dict) -> dict:
    """ModernBERT's attention pattern and rotary bases as our layer_types / rope_theta / local_rope_theta: from
    transformers 5's rope_parameters and layer_types, or the older global_attn_every_n_layers and
    global_/local_rope_theta (kept in the config as given)."""
    data = dict(data)
    rope = data.pop("rope_parameters", None) or {}
    for kind, ours, older in (
        ("full_attention", "rope_theta", "global_rope_theta"),
        ("sliding_attention", "local_rope_theta", "local_rope_theta"),
    ):
        params = rope.get(kind) if isinstance(rope, dict) else None
        if isinstance(params, dict):
            if params.get("rope_type", "default") != "default":
                raise UnsupportedFamily(
                    f"rope_type {params['rope_type']!r:.40} of {kind} is not supported (default only)"
                )
            if "rope_theta" in params:
                data[ours] = params["rope_theta"]
        elif older in data:
            data[ours] = data[older]
    data.pop("global_rope_theta", None)
    layers, every = data.get("num_hidden_layers"), data.get("global_attn_every_n_layers", 3)
    if data.get("layer_types") is None and isinstance(layers, int) and isinstance(every, int) and every > 0:
        data["layer_types"] = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    return data


def _modernbert_to_theirs(data: dict) -> dict:
    data = dict(data)
    full, local = data.pop("rope_theta", None), data.pop("local_rope_theta", None)
    if full is not None:
        data["rope_parameters"] = {
            "full_attention": {"rope_theta": full, "rope_type": "default"},
            "sliding_attention": {"rope_theta": local if local is not None else full, "rope_type": "default"},
        }
    return data


MODERNBERT = Family(
    "modernbert",
    {"modernbert": "ModernBert"},
    "model",
    config_keys={
        "hidden_activation": "hidden_act",
        "norm_eps": "layer_norm_eps",
        "embedding_dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob",
    },
    # ModernBertConfig's defaults where they differ from BertConfig's (ours: the names after config_keys)
    config_defaults={
        "pad_token_id": 50283,
        "max_position_embeddings": 8192,
        "layer_norm_eps": 1e-5,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
        "rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "local_attention": 128,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_bias": False,
        "classifier_pooling": "cls",
        "classifier_activation": "gelu",
        "classifier_bias": False,
    },
    parameter_names=(
        ("embeddings.tok_embeddings.", "embeddings.word_embeddings."),
        ("embeddings.norm.", "embeddings.LayerNorm."),
        ("final_norm.", "encoder.final_norm."),
        ("layers.", "encoder.layer."),
        (".attn_norm.", ".attention_norm."),
        (".attn.Wqkv.", ".attention.self.qkv."),
        (".attn.Wo.", ".attention.output.dense."),  # before the MLP's: ours ends in ".output.dense." too
        (".mlp.Wi.", ".intermediate.dense."),
        (".mlp.Wo.", ".output.dense."),
    ),
    # One "head" (dense, activation, norm) in every model: a masked LM's transform, else the pooler, which its
    # sequence classifier reads pooled and its token and QA heads read per token. Its QA head is "classifier".
    head_prefixes=(
        ("head.norm.", "cls.predictions.transform.LayerNorm."),
        ("head.", "cls.predictions.transform."),
        ("decoder.bias", "cls.predictions.bias"),
        ("decoder.weight", "cls.predictions.decoder.weight"),
        ("head.norm.", "bert.pooler.LayerNorm."),
        ("head.", "bert.pooler."),
        ("classifier.", "qa_outputs."),
    ),
    architecture_suffixes=(*ARCHITECTURE_SUFFIXES, "ForMaskedLM"),
    config_converters=(_modernbert_to_ours, _modernbert_to_theirs),
    token_types=False,
    pooler_activation="gelu",
    bare_pooler=False,
    pre_norm=True,
    first_attention_norm=False,
    gated_mlp=True,
    qkv_projection=True,
    pooler_norm=True,
    token_head_transform=True,
)

FAMILIES: tuple[Family, ...] = (BERT, ROBERTA, DISTILBERT, ELECTRA, MODERNBERT)
BY_MODEL_TYPE: dict[str, Family] = {mt: f for f in FAMILIES for mt in f.model_types}


def family_of(model_type: str) -> Family:
    """The family covering `model_type`, or UnsupportedFamily naming it and the supported ones."""
    try:
        return BY_MODEL_TYPE[model_type]
    except (KeyError, TypeError):
        raise UnsupportedFamily(
            f"model_type {model_type!r:.60} is not supported; the supported model_types are {', '.join(BY_MODEL_TYPE)}"
        ) from None
