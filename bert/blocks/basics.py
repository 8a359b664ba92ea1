"""What every building block and head uses: activations by config name, a family's LayerNorm, the additive padding
mask, and `Packing`, the packed batch that selects the "varlen" attention implementation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BertConfig


def activation(name: str):
    if name == "gelu":
        return F.gelu  # exact erf GELU, as the paper's TF code
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    if name == "tanh":  # BERT's pooler's, or a classifier_activation (ModernBERT's also sets its masked-LM transform)
        return torch.tanh
    raise ValueError(f"unsupported activation {name!r}")


def layer_norm(config: BertConfig, width: int | None = None) -> nn.LayerNorm:
    """A LayerNorm as the config's family has it (without a bias where config.norm_bias is False)."""
    return nn.LayerNorm(width or config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias is not False)


def additive_padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B, 1, 1, T) bias: 0 where attended, the dtype's most negative value where padded.

    finfo(dtype).min instead of -inf or -1e9: -1e9 overflows fp16, and -inf turns a fully padded
    row into NaN. Adding it to a score can saturate to -inf in fp16, which softmax handles.
    """
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


@dataclass
class Packing:
    """A batch as its real tokens only, sequence after sequence: passed where the padded (B, T) attention mask
    goes, it makes the same modules run on (N,) ids and (N, H) states. Attention then runs as the "varlen"
    implementation: `attention(q, k, v, cu_seqlens, max_len, cu_host)` over (N, nh, hs) tensors, a kernel the
    caller chooses (FlashAttention's varlen form on CUDA, a per-sequence reference elsewhere). A windowed layer
    (config.layer_types) also passes `window=w`: each token attends only to tokens of its own sequence at most w
    positions away. Sequences may be empty and tokens after the last sequence belong to none (fixed shapes for
    CUDA graphs)."""

    positions: torch.Tensor  # (N,) each token's position within its sequence
    cu_seqlens: torch.Tensor  # (S + 1,) int32: where each sequence starts among the N tokens
    cls_rows: torch.Tensor  # (S,) int: each sequence's first ([CLS]) token
    max_len: int  # the longest sequence
    attention: Callable[..., torch.Tensor]
    cu_host: list[int] | None = None  # cu_seqlens on the host, for kernels that loop over sequences
    gelu_epilogue: bool = False  # the feed-forward GELU inside its GEMM (bert/blocks/mlp.py PlainIntermediate)
