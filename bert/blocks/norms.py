"""Norm placement kinds, chosen by the family (`Family.norm` names one in NORMS): where a layer's LayerNorms sit.
A place without a norm gets nn.Identity (no parameters, nothing in the state dict, nothing in a traced graph),
so the layer's forward is written once (bert/model.py's BertLayer)."""

from __future__ import annotations

from torch import nn

from ..config import BertConfig
from .basics import layer_norm


class PostNorm:
    """BERT's: a LayerNorm after each residual sum (attention.output.LayerNorm, output.LayerNorm); the sublayers
    read the residual stream as it is, and the last layer's output is the encoder's."""

    def residual_norm(self, config: BertConfig) -> nn.Module:
        return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def sublayer_norm(self, config: BertConfig, index: int, sublayer: str) -> nn.Module:
        return nn.Identity()

    def final_norm(self, config: BertConfig) -> nn.Module:
        return nn.Identity()


class PreNorm:
    """Each sublayer reads a LayerNorm of the residual stream (attention_norm, mlp_norm), which itself is never
    normalised until one LayerNorm after the last layer (final_norm). A family may leave out the first layer's
    attention norm (Family.first_attention_norm; ModernBERT: its embeddings end in one already)."""

    def residual_norm(self, config: BertConfig) -> nn.Module:
        return nn.Identity()

    def sublayer_norm(self, config: BertConfig, index: int, sublayer: str) -> nn.Module:
        if sublayer == "attention" and index == 0 and not config.family.first_attention_norm:
            return nn.Identity()
        return layer_norm(config)

    def final_norm(self, config: BertConfig) -> nn.Module:
        return layer_norm(config)


NORMS = {"post": PostNorm(), "pre": PreNorm()}
