"""Head kinds: how a task's head sits on the encoder, one object per kind (`bert.tasks.base.Head.kind` names one).

A kind builds its module (the one transformers has for it, at the task's attribute), runs it on the encoder's
outputs (in the order of its task's graph outputs), ties what it shares with the embeddings, says which axes
its exported outputs have after their batch (and sequence) axes, and what export's parity check compares on
them. The multi-task model, the checkpoint writer and the exporter look a kind up here (`get`) and never branch
on its name.

Every kind is declared here, the masked-LM one with transformers' masked-LM modules (which the pretraining classes
in bert/model.py reuse), so that `get` knows every kind as soon as this module is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .blocks.basics import Packing, activation, layer_norm
from .tasks.base import MLM_CANDIDATES

if TYPE_CHECKING:
    from bert.config import BertConfig
    from bert.model import EncoderOutput

KINDS: dict[str, HeadKind] = {}


class HeadKind:
    """One kind of head. `width`: the head's outputs per row (its task's Head.width, or one per label)."""

    name: str
    pooled: bool = False  # reads the pooler's [CLS] state: the encoder keeps its pooler (a family may lay out
    # the pooler and this head as one classifier of its own, bert.families.Family.sequence_pooler)
    agreement: str = "labels"  # what export's parity agreement compares: the argmax over labels, positions, none
    token_states: bool = False  # reads every token's state (EncoderOutput.token_states: through the pooler's
    # transform where the family's per-token heads read it, bert.families.Family.token_head_transform)

    @property
    def module(self) -> str:
        """What `build` makes, by name: kinds that build the same module may share one attribute of a model (the
        kind's own name unless it builds another kind's module)."""
        return self.name

    def build(self, config: BertConfig, width: int) -> nn.Module:
        return nn.Linear(config.hidden_size, width)

    def read(self, module: nn.Module, out: EncoderOutput):
        """What every kind built on this module starts from, computed once per batch however many kinds read it
        (the masked-LM logits); `run` gets it. By default the module itself: the kind runs it."""
        return module

    def run(self, read, out: EncoderOutput, dropout: nn.Module) -> tuple[torch.Tensor, ...]:
        """The kind's outputs, from `read`'s answer (by default the module)."""
        raise NotImplementedError

    def tie(self, module: nn.Module, word_embeddings: nn.Embedding) -> None:
        """Share weights with the word embeddings (a masked-LM decoder); most heads share none."""

    def row_axes(self, config: BertConfig, width: int) -> list[int]:
        """The fixed axes of an exported output after its batch (and sequence) axes."""
        return [width]

    def __repr__(self) -> str:
        return f"<head kind {self.name}>"


def register(kind: HeadKind) -> HeadKind:
    if kind.name in KINDS:
        raise ValueError(f"head kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def get(name: str) -> HeadKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown head kind {name!r} (the kinds are {', '.join(KINDS)})") from None


class SequenceHead(HeadKind):
    """Dropout + linear on the pooled [CLS] state (the pooler: dense + activation), one row per sequence."""

    name = "sequence"
    pooled = True

    def run(self, module, out, dropout):
        return (module(dropout(out.pooler_output)),)  # (B, L)


class TokenHead(HeadKind):
    """Dropout + linear on every token's state."""

    name = "token"
    token_states = True

    def run(self, module, out, dropout):
        return (module(dropout(out.token_states())),)  # (B, T, L)


class SpanHead(HeadKind):
    """One linear H -> 2 on every token, split into start and end logits."""

    name = "span"
    agreement = "positions"
    token_states = True

    def run(self, module, out, dropout):
        return tuple(module(out.token_states()).unbind(dim=-1))  # (B, T) start, (B, T) end


SEQUENCE = register(SequenceHead())
TOKEN = register(TokenHead())
SPAN = register(SpanHead())


# ----------------------------------------------------------------------------- masked LM: transformers' modules


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        # to the word embeddings' width: ELECTRA's generator maps hidden_size down to its embedding_size
        width = config.embedding_width
        self.dense = nn.Linear(config.hidden_size, width, bias=config.classifier_bias is not False)
        self.act = activation(getattr(config, config.family.transform_activation) or config.hidden_act)
        self.LayerNorm = layer_norm(config, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.embedding_width, config.vocab_size, bias=False)  # tied to word embeddings
        # one output bias, saved once as cls.predictions.bias; none where the config says so (decoder_bias)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias is not False else None
        self.decoder.bias = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


MLM_TOP_K = MLM_CANDIDATES  # candidates per token an mlm head hands back (bert.tasks.base says why)


class MaskedLMHead(HeadKind):
    """The masked-LM transform (dense, activation, LayerNorm) and the decoder tied to the word embeddings,
    scored as probabilities and cut to the MLM_TOP_K likeliest tokens in the graph itself."""

    name = "mlm"
    agreement = "none"

    def build(self, config: BertConfig, width: int) -> nn.Module:
        return BertOnlyMLMHead(config)

    def read(self, module, out):
        return module.predictions(out.last_hidden_state).float()  # (B, T, V) logits, or (N, V) packed

    def run(self, logits, out, dropout):
        probs = logits.softmax(dim=-1)
        scores, ids = probs.topk(min(MLM_TOP_K, probs.shape[-1]), dim=-1)  # (B, T, K)
        return scores, ids

    def tie(self, module, word_embeddings):
        module.predictions.decoder.weight = word_embeddings.weight

    def row_axes(self, config: BertConfig, width: int) -> list[int]:
        return [min(MLM_TOP_K, config.vocab_size)]


MLM = register(MaskedLMHead())


class SpladeHead(MaskedLMHead):
    """The masked-LM head read as SPLADE: log(1 + ReLU(logits)) max-pooled over each sequence's real tokens, one
    vocabulary-wide vector per sequence (sentence-transformers' SpladePooling("max") after its MLMTransformer).
    Pooled in the graph itself, so an exported graph ends in (B, V), not in (B, T, V) rows a backend would carry.
    It builds and reads the masked-LM module, so a masked-LM checkpoint serves both kinds from one head."""

    name = "splade"

    @property
    def module(self) -> str:
        return MLM.name

    def run(self, logits, out, dropout):
        # ReLU before the max and log1p after it: log1p is increasing, so the max commutes with it, and padding
        # set to 0 never wins over a real token's ReLU (>= 0); one log per vocabulary entry, not per token.
        scores = logits.relu()  # (B, T, V), or (N, V) packed
        mask = out.attention_mask
        if isinstance(mask, Packing):
            bounds = mask.cu_seqlens.long()
            # each token's sequence; tokens past the last sequence (a bucket's filler) land in a row dropped below
            sequence = torch.searchsorted(bounds[1:], torch.arange(scores.shape[0], device=scores.device), right=True)
            pooled = scores.new_zeros(bounds.numel(), scores.shape[-1]).index_reduce_(0, sequence, scores, "amax")
            return (pooled[:-1].log1p(),)  # (S, V)
        if mask is not None:
            scores = scores * mask[..., None].to(scores.dtype)
        return (scores.amax(dim=1).log1p(),)  # (B, V)

    def row_axes(self, config: BertConfig, width: int) -> list[int]:
        return [config.vocab_size]


SPLADE = register(SpladeHead())
