"""Self-attention kinds, one class each, chosen by the family (`Family.attention` names one in ATTENTIONS).

Every kind keeps BERT's parameter names (attention.self.query/key/value; a family's own layout, a fused qkv
among them, is mapped at the checkpoint's edge, bert/families/base.py's weight_layouts) and runs three ways:
"sdpa" (PyTorch's fused kernels: training, torch serving), "eager" (explicit matmul-softmax-matmul, the graph
pattern onnxruntime's optimizer fuses into Attention) and, for a packed batch (a Packing in place of the mask),
"varlen" over (N, nh, hs) tensors with the kernel the Packing carries. Rotary positions and windows are the
layer's inputs (bert/blocks/positions.py), so any kind takes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BertConfig
from .basics import Packing
from .positions import RelativePositions, rotate


class DotProductAttention(nn.Module):
    """BERT's: softmax(q k^T / sqrt(hs) + mask) v, per head."""

    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        hidden, bias = config.hidden_size, config.attention_bias is not False
        self.query = nn.Linear(hidden, hidden, bias=bias)
        self.key = nn.Linear(hidden, hidden, bias=bias)
        self.value = nn.Linear(hidden, hidden, bias=bias)
        self.window = config.attention_window(index)  # None: every token attends to every token
        self.rope_theta = config.layer_rope_theta(index)  # None: no rotary positions
        self.dropout_p = config.attention_probs_dropout_prob
        self.scale_factor = 1  # scores are divided by sqrt(head_size * scale_factor)
        # "sdpa" or "eager"; a packed batch always runs "varlen": chosen per call, not set on the module, so that
        # padded and packed batches may run on one model at the same time.
        self.implementation = "sdpa"
        # Query, key and value stacked (3H, H) for one GEMM instead of three: made by fuse_qkv (the varlen path,
        # and padded batches after it), a plain attribute (not in the state dict), stale if the weights change.
        self.fused_qkv: tuple[torch.Tensor, torch.Tensor | None] | Callable | None = None  # or int8 products

    def fuse_qkv(self) -> None:
        if getattr(self.query, "low_precision", None):  # int8 / fp8 products (bert/precision.py) stacked there
            return  # already; a stacked fp32 copy would bypass them
        with torch.no_grad():
            linears = (self.query, self.key, self.value)
            self.fused_qkv = (
                torch.cat([lin.weight for lin in linears]),
                torch.cat([lin.bias for lin in linears]) if self.query.bias is not None else None,
            )

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, each (..., nh, hs) for x (..., H)."""
        if self.fused_qkv is not None:  # (weight, bias), or int8 / fp8 products (bert/precision.py)
            qkv = self.fused_qkv(x) if callable(self.fused_qkv) else F.linear(x, *self.fused_qkv)
            return qkv.view(qkv.shape[:-1] + (3, self.num_heads, self.head_size)).unbind(-3)
        return tuple(
            lin(x).view(x.shape[:-1] + (self.num_heads, self.head_size)) for lin in (self.query, self.key, self.value)
        )

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (self.num_heads, self.head_size)).transpose(1, 2)  # (B, nh, T, hs)

    def sdpa_scale(self) -> float | None:
        return None if self.scale_factor == 1 else 1.0 / math.sqrt(self.head_size * self.scale_factor)

    def score_bias(self, q: torch.Tensor, k: torch.Tensor, relative: RelativePositions | None) -> torch.Tensor | None:
        """Scores added to q k^T beside the mask, (B, nh, T, T), already scaled; None: none."""
        return None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | Packing | None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        relative: RelativePositions | None = None,
    ) -> torch.Tensor:
        """mask: the additive mask for this layer (its window already in it), or a Packing; rope: the (cos, sin)
        tables of this layer's rotary positions, if it has them; relative: what disentangled attention reads."""
        if isinstance(mask, Packing):
            return self.forward_varlen(x, mask, rope, relative)
        if callable(self.fused_qkv):  # int8 / fp8 products of query, key and value at once (bert/precision.py)
            q, k, v = (t.transpose(1, 2) for t in self.project(x))
        else:
            q, k, v = (self.split_heads(lin(x)) for lin in (self.query, self.key, self.value))  # (B, nh, T, hs)
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        bias = self.score_bias(q, k, relative)
        if bias is not None:
            mask = bias if mask is None else bias + mask
        dropout = self.dropout_p if self.training else 0.0
        if self.implementation == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.sdpa_scale())
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size * self.scale_factor)
            if mask is not None:
                scores = scores + mask
            probs = F.dropout(scores.softmax(dim=-1), p=dropout, training=self.training)
            y = torch.matmul(probs, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous()
        return y.view(y.size()[:-2] + (self.num_heads * self.head_size,))  # (B, T, H)

    def forward_varlen(self, x: torch.Tensor, packing: Packing, rope=None, relative=None) -> torch.Tensor:
        n = x.shape[0]  # x: (N, H), the real tokens of every sequence
        q, k, v = self.project(x)  # (N, nh, hs)
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        y = self.attend_packed(q, k, v, packing, relative)
        return y.reshape(n, self.num_heads * self.head_size)  # (N, H)

    def attend_packed(self, q, k, v, packing: Packing, relative) -> torch.Tensor:
        window = {} if self.window is None else {"window": self.window}  # kernels without windows stay callable
        return packing.attention(q, k, v, packing.cu_seqlens, packing.max_len, packing.cu_host, **window)


class DisentangledAttention(DotProductAttention):
    """DeBERTa's: beside content->content, content->position ("c2p") and position->content ("p2c") scores over a
    table of relative-position embeddings, every term scaled by 1 / sqrt(hs * (1 + terms)) as DeBERTa scales
    them (the factor follows pos_att_type even without relative attention, as there). The position terms are on
    where the config's relative_attention is."""

    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__(config, index)
        terms = tuple(t for t in ("c2p", "p2c") if t in (config.pos_att_type or ()))
        self.relative_terms = terms if config.relative_attention else ()
        self.scale_factor = 1 + len(terms)
        hidden = config.hidden_size
        if self.relative_terms and not config.share_att_key:  # else the content projections serve positions too
            if "c2p" in terms:
                self.pos_key_proj = nn.Linear(hidden, hidden)
            if "p2c" in terms:
                self.pos_query_proj = nn.Linear(hidden, hidden)
        self.relative_dropout_p = config.hidden_dropout_prob

    def score_bias(self, q, k, relative):
        """c2p[i, j] is query i against the embedding of its distance to key j, p2c[i, j] key j against the same
        distance's embedding (DeBERTa's buckets are odd in the distance, so its -delta(j, i) is delta(i, j))."""
        if relative is None or not self.relative_terms:
            return None
        table = F.dropout(relative.embeddings, self.relative_dropout_p, self.training)
        index = relative.index
        shape = q.shape[:2] + index.shape

        def heads_of(linear: nn.Linear) -> torch.Tensor:  # (nh, 2 * span, hs)
            # fp32 whatever the model's products: weights alone (the int8 graph folds them to constants)
            return F.linear(table, linear.weight, linear.bias).view(-1, self.num_heads, self.head_size).transpose(0, 1)

        scores = torch.zeros((), dtype=q.dtype, device=q.device)
        if "c2p" in self.relative_terms:
            positions = heads_of(getattr(self, "pos_key_proj", self.key))
            scores = torch.gather(torch.matmul(q, positions.transpose(-1, -2)), -1, index.expand(shape))
        if "p2c" in self.relative_terms:
            positions = heads_of(getattr(self, "pos_query_proj", self.query))
            by_key = torch.gather(torch.matmul(k, positions.transpose(-1, -2)), -1, index.t().expand(shape))
            scores = scores + by_key.transpose(-1, -2)
        return scores / math.sqrt(self.head_size * self.scale_factor)

    def attend_packed(self, q, k, v, packing: Packing, relative) -> torch.Tensor:
        """Packed tokens laid out padded per sequence (on the device, no host sync, so it runs in a CUDA graph),
        attended there with the relative scores, and gathered back."""
        if relative is None or not self.relative_terms:
            return super().attend_packed(q, k, v, packing, relative)
        slots, rows = relative.slots, relative.key_mask.shape[0]

        def padded(t: torch.Tensor) -> torch.Tensor:  # (N, nh, hs) -> (S + 1, nh, T, hs)
            out = t.new_zeros((rows * relative.index.shape[0],) + t.shape[1:]).index_copy(0, slots, t)
            return out.view(rows, -1, self.num_heads, self.head_size).transpose(1, 2)

        q, k, v = padded(q), padded(k), padded(v)
        bias = self.score_bias(q, k, relative) + relative.key_mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.sdpa_scale())
        return y.transpose(1, 2).reshape(-1, self.num_heads, self.head_size)[slots]


ATTENTIONS: dict[str, type[DotProductAttention]] = {
    "dot_product": DotProductAttention,
    "disentangled": DisentangledAttention,
}
