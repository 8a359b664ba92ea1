"""Head kinds: how a task's head sits on the encoder, one object per kind (`bert.tasks.base.Head.kind` names one).

A kind builds its module (the one transformers has for it, at the task's attribute), runs it on the encoder's
outputs (in the order of its task's graph outputs), ties what it shares with the embeddings, says which axes
its exported outputs have after their batch (and sequence) axes, and what export's parity check compares on
them. The multi-task model, the checkpoint writer and the exporter look a kind up here (`get`) and never branch
on its name.

The kinds whose module is one linear layer are declared here; the masked-LM kind joins from bert/model.py, where
transformers' masked-LM modules (shared with the pretraining classes) are, as a task joins the task registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

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

    def build(self, config: BertConfig, width: int) -> nn.Module:
        return nn.Linear(config.hidden_size, width)

    def run(self, module: nn.Module, out: EncoderOutput, dropout: nn.Module) -> tuple[torch.Tensor, ...]:
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
