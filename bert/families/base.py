"""The family class: what a BERT-style encoder layout declares, and the mapping code every family shares.

A family (one file in bert/families/, `FAMILY = Family(...)`, found by bert/families/registry.py) says which
`model_type`s of a transformers config.json it covers, how its config keys and parameter names map onto BERT's
(both ways: we load theirs, and write ours in their layout so that transformers loads them), and the building
blocks where its encoder differs from BERT's, as fields the one encoder forward (bert/model.py) reads. Everything
inside bertserve speaks BERT's names; a family's own names exist only at the edges: reading and writing
config.json and the weights. The encoder skeleton, heads, packing, export and serving are shared.

torch-free: serving reads artifact configs without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadInput

# The classes transformers has for each of our single-task layouts, by suffix after the family's class prefix
# ("Bert" + "ForSequenceClassification"); other architectures keep their names.
ARCHITECTURE_SUFFIXES = ("Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")


class UnsupportedFamily(BadInput, ValueError):
    """A config.json whose model_type no family covers, or a setting of its family we do not run."""


# Settings that transformers' BERT-layout classes (BERT, RoBERTa and its kin, ELECTRA) honour and our encoder does
# not run, each with the one value we run and what another value asks for. is_decoder makes every layer's
# attention causal; position_embedding_type other than "absolute" adds relative-position scores (transformers 4
# computed them from per-layer distance_embedding weights; transformers 5 ignores both the key and the weights, so
# such a checkpoint gives neither its training-time outputs there nor here).
BERT_REFUSED_SETTINGS: dict[str, tuple[Any, str]] = {
    "is_decoder": (False, "causal attention"),
    "position_embedding_type": ("absolute", "relative-position scores; absolute positions only"),
}


@dataclass(frozen=True)
class Family:
    """One encoder layout. Every field but the names has BERT's value as its default, so a family lists only
    where it differs. The building blocks (positions, attention, MLP, norm placement, pooler) are chosen by the
    fields below and, where a checkpoint's own config decides per model, by config keys the family's
    config_defaults / config_converters fill in; the code of each block lives once, in bert/blocks/."""

    # ---- names ------------------------------------------------------------------------------------------
    name: str
    # model_type -> the prefix of its transformers class names ("xlm-roberta": "XLMRoberta")
    model_types: dict[str, str]
    # the encoder's attribute in a head model's state dict ("roberta.encoder...."); BERT's is "bert"
    base_prefix: str
    # where it stands in listings (FAMILIES, the supported model_types an error names), then by name
    order: int = 100
    # The classes of a repository's own code that this family implements: a config.json whose auto_map names only
    # these (by class name: "org/repo--module.NomicBertModel" is "NomicBertModel") is read as this family's; any
    # other auto_map is refused in one line. bertserve never runs a repository's code either way.
    auto_map_classes: tuple[str, ...] = ()

    # ---- config.json <-> BertConfig ----------------------------------------------------------------------
    # config.json key -> ours (BertConfig field); keys not listed are BERT's own
    config_keys: dict[str, str] = field(default_factory=dict)
    # transformers' config class defaults that differ from BertConfig's, for keys a config.json may omit
    config_defaults: dict[str, Any] = field(default_factory=dict)
    # config.json <-> ours beyond key renames (nested or derived keys): (to ours, to theirs), each dict -> dict
    config_converters: tuple[Callable[[dict], dict], Callable[[dict], dict]] | None = None
    # the transformers class suffixes this family's architectures map onto ours
    architecture_suffixes: tuple[str, ...] = ARCHITECTURE_SUFFIXES
    # config.json settings this family's transformers classes honour and we do not run: key -> (the only value we
    # run, what another value asks for); another value is refused in one line naming the key (a missing or null
    # key is the value we run)
    refused_settings: dict[str, tuple[Any, str]] = field(default_factory=dict)
    # The building-block keys of BertConfig (bert.config.BLOCK_FIELDS, ours: the names after config_keys) that this
    # family's config.json sets; any other such key in its config.json is one transformers' class of the family
    # never reads, so it is kept as it is (written back) but builds nothing here either
    config_blocks: tuple[str, ...] = ()
    # Other BertConfig keys that transformers' classes of this family do not read (they hard-code the value, which is
    # BertConfig's default): never read from its config.json
    unread_keys: tuple[str, ...] = ()

    # ---- parameter names <-> BERT's ----------------------------------------------------------------------
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

    # Encoder parameters (BERT's names, no "bert." prefix) that this family's checkpoints may carry although the
    # model built from their config never reads them: where the model has no such parameter, loading skips them
    # with a log line instead of refusing the file
    unused_parameters: tuple[str, ...] = ()

    # Parameters one side stores as one tensor and the other as several (a fused query/key/value projection, a
    # gated MLP's gate and up projections split in two): (their substrings, BERT's substrings), one tuple per
    # layout, where the single tensor is the several concatenated along the first axis in the order listed (either
    # side may be the single one). Applied to whole state dicts (relayout_to_bert / relayout_from_bert), in
    # their names, before name_to_bert and after name_from_bert.
    weight_layouts: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()

    # ---- building blocks: where the encoder differs from BERT's (read by bert/model.py, bert/config.py) ---
    # -- embeddings and positions. Absolute: a learned table indexed from 0 (BERT's). Offset: the same table
    #    indexed from pad_token_id + 1 (position_offset). Sinusoidal: the table filled with fixed sin/cos
    #    values, a config key (DistilBERT's sinusoidal_pos_embds). Rotary: no table, queries and keys rotated
    #    in attention, when the config has a rope_theta (per layer: local_rope_theta in windowed ones;
    #    ModernBERT's config_defaults and converter give them).
    position_offset: bool = False  # positions start at pad_token_id + 1 (fairseq's convention)
    token_types: bool = True  # False: no token-type table at all
    # -- attention: how a layer scores queries against keys, a kind in bert/blocks/attention.py: "dot_product"
    #    (BERT's) or "disentangled" (DeBERTa's content and relative-position terms, on where the config's
    #    relative_attention says). Full or windowed is per layer and the config's (layer_types, local_attention;
    #    ModernBERT's converter derives them from its own keys).
    attention: str = "dot_product"
    # -- MLP, a kind in bert/blocks/mlp.py: "plain" (BERT's: act(W1 x)) or "gated" (the input projection 2x wide:
    #    act(first half) * second half, GLU).
    mlp: str = "plain"
    # -- norm placement, a kind in bert/blocks/norms.py: "post" (BERT's: LayerNorm after each residual sum) or "pre"
    #    (LayerNorm before each sublayer and one after the last layer).
    norm: str = "post"
    first_attention_norm: bool = True  # with pre-norm: False leaves the first layer's attention input as it is
    # -- the pooler (the first-token layer before a sequence head) and what per-token heads read.
    pooler_activation: str = "tanh"  # the first-token layer's activation before a sequence head
    bare_pooler: bool = True  # a bare encoder of this family carries a pooler
    pooler_norm: bool = False  # the pooler ends in a LayerNorm
    token_head_transform: bool = False  # per-token heads (token, span) read the pooler's transform of each token
    # the config field that sets the masked-LM transform's activation: hidden_act (BERT's and DeBERTa's heads) or
    # classifier_activation (ModernBERT's one head, which is its pooler too)
    transform_activation: str = "hidden_act"

    @property
    def pre_norm(self) -> bool:
        return self.norm == "pre"

    @property
    def gated_mlp(self) -> bool:
        return self.mlp == "gated"

    @property
    def qkv_projection(self) -> bool:
        """Whether this family's checkpoints store query, key and value as one projection."""
        return any(len(theirs) == 1 and ".attention.self.query." in ours for theirs, ours in self.weight_layouts)

    def unimplemented_classes(self, auto_map: Any) -> list[str]:
        """The classes a config's auto_map names that this family does not implement (none without an auto_map)."""
        if not auto_map:
            return []
        values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
        names = [v for value in values for v in (value if isinstance(value, list) else [value]) if v is not None]
        return [str(n) for n in names if str(n).rpartition(".")[2] not in self.auto_map_classes]

    # ---- weight layouts ---------------------------------------------------------------------------------
    def relayout_to_bert(self, state: dict, join: Callable, split: Callable) -> dict:
        """A state dict in this family's names with each weight layout turned into BERT's: `join(values)`
        concatenates values along their first axis, `split(value, n)` cuts one into n equal parts (tensors, or
        their shapes: the header check runs on shapes alone)."""
        for theirs, ours in self.weight_layouts:
            state = _relayout(state, theirs, ours, join, split)
        return state

    def relayout_from_bert(self, state: dict, join: Callable, split: Callable) -> dict:
        """The inverse of relayout_to_bert, on a state dict already in this family's names (name_from_bert)."""
        for theirs, ours in self.weight_layouts:
            state = _relayout(state, ours, theirs, join, split)
        return state

    # ---- config.json ------------------------------------------------------------------------------------
    def config_to_ours(self, data: dict) -> dict:
        """A config.json's keys and values as BertConfig reads them (positions counted as usable positions)."""
        unimplemented = self.unimplemented_classes(data.get("auto_map"))
        if unimplemented:
            raise UnsupportedFamily(
                f"auto_map names the repository's own code ({unimplemented[0]!r:.80}), which bertserve never runs "
                f"and does not implement for model_type {data.get('model_type', 'bert')!r:.40}"
            )
        for key, (supported, what) in self.refused_settings.items():
            value = data.get(key)
            if value is not None and value != supported:
                raise UnsupportedFamily(f"{key} {value!r:.40} is not supported ({what})")
        if self.config_converters is not None:
            data = self.config_converters[0](data)
        out = dict(self.config_defaults)
        # beside the family's own key, a key under our name for it (ModernBERT's hidden_act beside its
        # hidden_activation) is one transformers' class never reads: the family's key decides, whatever order the
        # file has them in (alone, ours stands in for it, as transformers' attribute aliases let it)
        shadowed = {
            ours for theirs, ours in self.config_keys.items() if theirs in data and ours not in self.config_keys
        }
        out.update({self.config_keys.get(k, k): v for k, v in data.items() if k not in shadowed})
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
        `model_keys`: the model's own parameter names, which place the head_prefixes (a name the model has itself
        stays: a multi-task model's classifier beside its qa_outputs, which that layout names classifier too)."""
        for theirs, ours in self.head_prefixes:
            if key.startswith(theirs) and key not in model_keys and any(k.startswith(ours) for k in model_keys):
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

    def name_from_bert(self, key: str, sequence_head: str | None = None, model_keys: Collection[str] = ()) -> str:
        """BERT's parameter name -> this family's; `sequence_head`: the attribute of the model's sequence
        classifier, whose layers this family lays out its own way (None: the model has none); `model_keys`: the
        model's own names, none of which a head prefix may take (see name_to_bert)."""
        for theirs, ours in self.head_prefixes:
            if key.startswith(ours) and theirs + key[len(ours) :] not in model_keys:
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


def _relayout(state: dict, sources: tuple[str, ...], targets: tuple[str, ...], join: Callable, split: Callable) -> dict:
    """Every group of keys that differ only in sources[i] (all of them present) -> the same keys with targets[j],
    the group's values joined in sources' order and split into len(targets) equal parts."""
    out = dict(state)
    for key in [k for k in state if sources[0] in k]:
        group = [key.replace(sources[0], source, 1) for source in sources]
        if not all(k in state for k in group):
            continue  # a partial group is left as it is, for the key check to name
        joined = join([state[k] for k in group]) if len(group) > 1 else state[key]
        parts = split(joined, len(targets)) if len(targets) > 1 else [joined]
        for k in group:
            del out[k]
        for target, part in zip(targets, parts):
            out[key.replace(sources[0], target, 1)] = part
    return out
