"""The torch backend's fast path: packed sequences, fused QKV, varlen flash attention, CUDA graphs.

Part of the torch backend (serving/backends/torch_backend.py is its only user). Why each piece:

- Packed (unpadded) tokens. A batch of real SQuAD windows (384 tokens at most, 171 on average, measured
  over 86,256 training windows) padded to 384 is 55 % padding; every linear layer, which is most of
  BERT's work, then runs on the real tokens only: (N, H) with N = the sum of the lengths.
- Variable-length flash attention over those tokens (`cu_seqlens`, FlashAttention's varlen form): no
  padded (B, T, T) scores and no mask, so the fused kernel applies where padded SDPA with a mask cannot
  use flash.
- One QKV projection (3H outputs) instead of three: one GEMM launch, better tile use.
- CUDA graphs per (batch bucket, token bucket), captured on first use: at batch 1 BERT-large launches
  ~300 kernels per forward, which costs more host time than the GPU needs to run them. Inputs are
  rounded up to a bucket (batch to a power of two with empty sequences, tokens to within 1/8 with
  tokens no sequence covers) so that a few graphs serve every shape.
- One pinned host buffer per bucket for all int32 inputs (one host-to-device copy), pinned output
  buffers, non_blocking copies, one synchronisation per batch.

Every piece except the flash kernel and the graph capture itself runs on CPU too (attention by a
per-sequence reference, graphs replaced by eager calls on the same static buffers), which is how the
tests prove the packing, the bucket padding and the heads equal the padded model.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from bert.model import activation

log = logging.getLogger("bertserve")

# ----------------------------------------------------------------------------- packing (host side, numpy)


@dataclass
class Packed:
    """A right-padded (B, T) batch as its real tokens, row after row."""

    ids: np.ndarray  # (N,) int32
    types: np.ndarray  # (N,) int32
    positions: np.ndarray  # (N,) int32: 0..len-1 within each sequence
    cu_seqlens: np.ndarray  # (B + 1,) int32: where each sequence starts in the N tokens
    where: np.ndarray  # (B, T) bool: the real tokens' places in the padded batch
    max_len: int

    @property
    def batch(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def tokens(self) -> int:
        return len(self.ids)


def pack(batch: dict[str, np.ndarray]) -> Packed | None:
    """The real tokens of a right-padded batch; None when some row is empty or its mask is not a prefix of
    ones (the caller then runs the padded model)."""
    mask = np.asarray(batch["attention_mask"]) != 0
    rows, width = mask.shape
    lengths = mask.sum(axis=1)
    if rows == 0 or lengths.min() == 0:
        return None
    where = np.arange(width)[None, :] < lengths[:, None]
    if not np.array_equal(where, mask):
        return None
    cu = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width))[where]
    return Packed(ids=np.asarray(batch["input_ids"])[where].astype(np.int32),
                  types=np.asarray(batch["token_type_ids"])[where].astype(np.int32),
                  positions=positions, cu_seqlens=cu, where=where, max_len=int(lengths.max()))


def batch_bucket(rows: int) -> int:
    """Sequences a graph is captured for: the next power of two (the extra ones are empty)."""
    return 1 << max(0, rows - 1).bit_length()


def token_bucket(tokens: int, minimum: int = 64) -> int:
    """Tokens a graph is captured for: rounded up to a multiple of 1/8 of the largest power of two not
    above `tokens`, or of `minimum` below 1024 tokens: the filler is under 12.5 % of the tokens (under
    64 tokens for small batches), and each doubling of the token count spans 8 buckets."""
    if tokens <= minimum:
        return minimum
    step = max(minimum, 1 << (tokens.bit_length() - 4))
    return -(-tokens // step) * step


def unpack_tokens(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """(N, ...) per-token values -> (B, T, ...) in the padded layout, zeros at the padding."""
    out = np.zeros(where.shape + values.shape[1:], dtype=values.dtype)
    out[where] = values
    return out


# ----------------------------------------------------------------------------- attention over packed tokens

# attention(q, k, v, cu_seqlens, max_len, cu_host) -> (N, heads, head_size); q, k, v: (N, heads, head_size)
Attention = Callable[..., torch.Tensor]


def attention_varlen(q, k, v, cu, max_len, cu_host=None):
    """torch.nn.attention.varlen.varlen_attn: PyTorch's public FlashAttention varlen entry (CUDA)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, cu, cu, max_len, max_len)


def attention_aten_flash(q, k, v, cu, max_len, cu_host=None):
    """The aten op behind varlen_attn and nested-tensor SDPA (present since torch 2.1; CUDA)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, False, False)[0]


def attention_reference(q, k, v, cu, max_len, cu_host=None):
    """Each sequence through plain SDPA: the definition the fast kernels must match (and the CPU path).
    Tokens after the last sequence (bucket filler) get zeros."""
    out = torch.zeros_like(q)
    bounds = cu_host if cu_host is not None else cu.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if stop > start:
            # (1, heads, len, head_size) for SDPA, back to (len, heads, head_size)
            qs, ks, vs = (t[start:stop].transpose(0, 1)[None] for t in (q, k, v))
            out[start:stop] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1)
    return out


def contiguous(attention: Attention) -> Attention:
    """The same kernel fed contiguous q, k, v (for a kernel that refuses the strided views of one QKV tensor)."""
    def call(q, k, v, cu, max_len, cu_host=None):
        return attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, max_len, cu_host)
    call.__name__ = f"{attention.__name__}_contiguous"
    return call


CUDA_ATTENTIONS: list[Attention] = [attention_varlen, attention_aten_flash,
                                    contiguous(attention_varlen), contiguous(attention_aten_flash)]


# ----------------------------------------------------------------------------- the encoder over packed tokens


@dataclass
class _Layer:
    qkv_w: torch.Tensor  # (3H, H): query, key, value stacked
    qkv_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    ln1: tuple
    inter_w: torch.Tensor
    inter_b: torch.Tensor
    ffn_w: torch.Tensor
    ffn_b: torch.Tensor
    ln2: tuple


class PackedEncoder:
    """A loaded bertserve model (eval, on its device and dtype) run over packed tokens.

    Shares the model's weights (only the stacked QKV weights are new) and computes what the model's
    heads compute: per-token heads (ner, qa) as one matrix over all tokens, the sequence head
    (classify: pooler + classifier) on each sequence's [CLS] row, and the embed task's pooled vector."""

    def __init__(self, model, attention: Attention = attention_reference, gelu_epilogue: bool | None = None,
                 pooling: str | None = None):
        """gelu_epilogue: the feed-forward GELU inside the GEMM (cuBLASLt's GELU_BIAS epilogue on CUDA: one pass
        over the 4H-wide activations fewer). That epilogue is the tanh approximation, so by default only for
        models trained with it (gelu_new / gelu_pytorch_tanh); True applies it to exact-GELU models too
        (differences far below fp16 rounding; an opt-in, measured as its own piece by the GPU kit).
        pooling: also compute the embed task's vector of each sequence ("cls" or "mean"; "max" has no packed form)."""
        from bert.model import (BertForMultiTask, BertForQuestionAnswering, BertForSequenceClassification,
                                BertForTokenClassification)

        config = model.config
        self.attention = attention
        self.heads, self.head_size = config.num_attention_heads, config.head_size
        self.hidden = config.hidden_size
        self.eps = config.layer_norm_eps
        self.act = activation(config.hidden_act)
        tanh_gelu = config.hidden_act in ("gelu_new", "gelu_pytorch_tanh")
        self.gelu_epilogue = (tanh_gelu if gelu_epilogue is None else gelu_epilogue) and (
            tanh_gelu or config.hidden_act == "gelu")
        encoder = model.encoder_module()
        emb = encoder.embeddings
        self.word, self.position, self.segment = (emb.word_embeddings.weight, emb.position_embeddings.weight,
                                                  emb.token_type_embeddings.weight)
        self.emb_ln = (emb.LayerNorm.weight, emb.LayerNorm.bias)
        self.max_positions = self.position.shape[0]
        self.layers = []
        with torch.no_grad():
            for block in encoder.encoder.layer:
                sa, so = block.attention.self, block.attention.output
                self.layers.append(_Layer(
                    torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]),
                    torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]),
                    so.dense.weight, so.dense.bias, (so.LayerNorm.weight, so.LayerNorm.bias),
                    block.intermediate.dense.weight, block.intermediate.dense.bias,
                    block.output.dense.weight, block.output.dense.bias,
                    (block.output.LayerNorm.weight, block.output.LayerNorm.bias)))

        # Heads: name -> linear over tokens, and the one sequence-level head.
        token_heads: list[tuple[str, torch.nn.Linear]] = []
        self.pooler = self.classifier = None
        if isinstance(model, BertForMultiTask):
            if hasattr(model, "token_classifier"):
                token_heads.append(("ner", model.token_classifier))
            if hasattr(model, "qa_outputs"):
                token_heads.append(("qa", model.qa_outputs))
            if hasattr(model, "classifier"):
                self.pooler, self.classifier = model.bert.pooler.dense, model.classifier
        elif isinstance(model, BertForTokenClassification):
            token_heads.append(("ner", model.classifier))
        elif isinstance(model, BertForQuestionAnswering):
            token_heads.append(("qa", model.qa_outputs))
        elif isinstance(model, BertForSequenceClassification):
            self.pooler, self.classifier = model.bert.pooler.dense, model.classifier
        elif pooling is None:  # a bare encoder is served packed only for its embeddings
            raise TypeError(f"no packed path for {type(model).__name__}")
        if pooling not in (None, "cls", "mean"):
            raise TypeError(f"no packed path for {pooling} pooling")
        self.pooling = pooling
        # Per-sequence outputs side by side in one (S, width) array: the classifier's logits, then the embedding.
        self.sequence_columns: dict[str, slice] = {}
        if self.classifier is not None:
            self.sequence_columns["classify"] = slice(0, self.classifier.out_features)
        if pooling is not None:
            start = self.classifier.out_features if self.classifier is not None else 0
            self.sequence_columns["embed"] = slice(start, start + self.hidden)
        self.sequence_width = max((c.stop for c in self.sequence_columns.values()), default=0)
        self.token_columns: dict[str, slice] = {}
        start = 0
        for name, linear in token_heads:
            width = linear.out_features
            if name == "qa":  # start and end logits: columns of one (H, 2) head
                self.token_columns["qa_start"] = slice(start, start + 1)
                self.token_columns["qa_end"] = slice(start + 1, start + 2)
            else:
                self.token_columns[name] = slice(start, start + width)
            start += width
        self.token_width = start
        with torch.no_grad():
            self.token_w = torch.cat([lin.weight for _, lin in token_heads]) if token_heads else None
            self.token_b = torch.cat([lin.bias for _, lin in token_heads]) if token_heads else None

    def forward(self, ids, types, positions, cu, cls_rows, max_len: int, cu_host=None):
        """ids, types, positions: (N,) int; cu: (S+1,) int32; cls_rows: (S,) int -> (per-token (N, L) float32
        or None, per-sequence (S, L) float32 or None)."""
        n = ids.shape[0]
        x = F.embedding(ids, self.word) + F.embedding(types, self.segment) + F.embedding(positions, self.position)
        x = F.layer_norm(x, (self.hidden,), *self.emb_ln, self.eps)  # (N, H)
        for layer in self.layers:
            q, k, v = F.linear(x, layer.qkv_w, layer.qkv_b).view(n, 3, self.heads, self.head_size).unbind(1)
            y = self.attention(q, k, v, cu, max_len, cu_host).reshape(n, self.hidden)  # (N, nh, hs) -> (N, H)
            x = F.layer_norm(F.linear(y, layer.out_w, layer.out_b) + x, (self.hidden,), *layer.ln1, self.eps)
            if self.gelu_epilogue:
                h = torch._addmm_activation(layer.inter_b, x, layer.inter_w.t(), use_gelu=True)
            else:
                h = self.act(F.linear(x, layer.inter_w, layer.inter_b))
            x = F.layer_norm(F.linear(h, layer.ffn_w, layer.ffn_b) + x, (self.hidden,), *layer.ln2, self.eps)
        tokens = F.linear(x, self.token_w, self.token_b).float() if self.token_w is not None else None
        parts = []
        if self.classifier is not None:
            pooled = torch.tanh(self.pooler(x.index_select(0, cls_rows)))  # the [CLS] states
            parts.append(self.classifier(pooled).float())
        if self.pooling == "cls":
            parts.append(x.index_select(0, cls_rows).float())
        elif self.pooling == "mean":
            # Per-sequence sums as differences of one running sum: static shapes, so it is graph-capturable. In
            # float64, because the difference of two sums over thousands of tokens would cancel float32 digits.
            running = F.pad(x.double().cumsum(dim=0), (0, 0, 1, 0))  # (N + 1, H)
            bounds = cu.long()
            counts = (bounds[1:] - bounds[:-1]).clamp(min=1).unsqueeze(1)
            sums = running.index_select(0, bounds[1:]) - running.index_select(0, bounds[:-1])
            parts.append((sums / counts).float())
        sequences = torch.cat(parts, dim=1) if parts else None
        return tokens, sequences

    def named(self, tokens: np.ndarray | None, sequences: np.ndarray | None, where: np.ndarray) -> dict:
        """The backend's task-named outputs, per-token ones back in the padded (B, T) layout."""
        out = {}
        if sequences is not None:
            for name, cols in self.sequence_columns.items():
                out[name] = sequences[:, cols]
        if tokens is not None:
            padded = unpack_tokens(tokens, where)
            for name, cols in self.token_columns.items():
                out[name] = padded[..., cols.start] if name in ("qa_start", "qa_end") else padded[..., cols]
        return out


# ----------------------------------------------------------------------------- static buckets and CUDA graphs


class _Bucket:
    """Static device buffers for one (sequences, tokens) bucket, and on CUDA the graph captured over them."""

    def __init__(self, encoder: PackedEncoder, device: torch.device, sequences: int, tokens: int, *,
                 graph: bool, pool=None):
        self.sequences, self.tokens = sequences, tokens
        self.max_len = min(tokens, encoder.max_positions)
        cuda = device.type == "cuda"
        size = 3 * tokens + (sequences + 1) + sequences  # ids | types | positions | cu_seqlens | cls rows
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=cuda)
        self.device_in = torch.zeros(size, dtype=torch.int32, device=device)
        d = self.device_in
        t, s = tokens, sequences
        self.views = (d[:t], d[t:2 * t], d[2 * t:3 * t], d[3 * t:3 * t + s + 1], d[3 * t + s + 1:])
        self.cu_host: list[int] | None = None  # read by the reference attention (CPU); graphs never need it
        self.encoder = encoder
        self.graph = None
        self.outputs = (None, None)
        if graph:
            self._capture(pool)
        self.host_tokens = (torch.empty((tokens, encoder.token_width), dtype=torch.float32, pin_memory=cuda)
                            if encoder.token_w is not None else None)
        self.host_sequences = (torch.empty((sequences, encoder.sequence_width), dtype=torch.float32,
                                           pin_memory=cuda) if encoder.sequence_width else None)

    def _run(self):
        ids, types, positions, cu, cls_rows = self.views
        return self.encoder.forward(ids, types, positions, cu, cls_rows, self.max_len, self.cu_host)

    def _capture(self, pool) -> None:
        # Valid inputs for the warm-up runs: one sequence over every token.
        self._fill(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32),
                   np.array([0, 1], np.int32))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # cuBLAS handles, workspaces and lazy kernels before capture
            for _ in range(2):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: a capture must not fail because another thread (a padded run) touches CUDA meanwhile
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.outputs = self._run()

    def _fill(self, ids, types, positions, cu) -> None:
        t, s = self.tokens, self.sequences
        n, b = len(ids), len(cu) - 1
        host = self.host.numpy()
        host[:] = 0  # filler tokens: id 0, no sequence covers them
        host[:n], host[t:t + n], host[2 * t:2 * t + n] = ids, types, positions
        cu_all = host[3 * t:3 * t + s + 1]
        cu_all[:b + 1] = cu
        cu_all[b + 1:] = cu[-1]  # empty sequences up to the bucket's count
        host[3 * t + s + 1:3 * t + s + 1 + b] = cu[:-1]  # each sequence's [CLS] row
        self.cu_host = cu_all.tolist()
        self.device_in.copy_(self.host, non_blocking=True)

    def run(self, packed: Packed) -> tuple[np.ndarray | None, np.ndarray | None]:
        self._fill(packed.ids, packed.types, packed.positions, packed.cu_seqlens)
        if self.graph is not None:
            self.graph.replay()
            tokens, sequences = self.outputs
        else:
            tokens, sequences = self._run()
        for host, dev in ((self.host_tokens, tokens), (self.host_sequences, sequences)):
            if host is not None:
                host.copy_(dev, non_blocking=True)
        if self.device_in.is_cuda:
            torch.cuda.current_stream().synchronize()
        n, b = packed.tokens, packed.batch
        return (self.host_tokens.numpy()[:n].copy() if self.host_tokens is not None else None,
                self.host_sequences.numpy()[:b].copy() if self.host_sequences is not None else None)


class PackedRunner:
    """Runs a PackedEncoder on bucketed static buffers: one bucket per (sequences, tokens) shape class,
    made on first use (on CUDA with `graphs`, a CUDA graph captured then), the least recently used
    dropped beyond `max_buckets`. All graphs share one memory pool: safe because one lock serialises
    the runs and each run copies its outputs out before the next replay can overwrite them."""

    def __init__(self, encoder: PackedEncoder, device: torch.device, *, graphs: bool, max_buckets: int = 64):
        if graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.encoder, self.device, self.graphs = encoder, device, graphs
        self.max_buckets = max_buckets
        self.buckets: OrderedDict[tuple[int, int], _Bucket] = OrderedDict()
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        self.lock = threading.Lock()
        self.captures = 0
        self.capture_failures: list[str] = []

    def _bucket(self, key: tuple[int, int]) -> _Bucket:
        if self.graphs:
            try:
                bucket = _Bucket(self.encoder, self.device, *key, graph=True, pool=self.pool)
                self.captures += 1
                return bucket
            except Exception as e:  # noqa: BLE001 - e.g. out of memory while capturing: this shape runs eagerly
                self.capture_failures.append(f"{key}: {type(e).__name__}: {str(e)[:160]}")
                log.warning("CUDA graph capture for bucket %s failed (%s); running it without a graph", key, e)
        return _Bucket(self.encoder, self.device, *key, graph=False)

    def key(self, packed: Packed) -> tuple[int, int]:
        return batch_bucket(packed.batch), token_bucket(packed.tokens)

    @torch.inference_mode()
    def run(self, packed: Packed) -> dict[str, np.ndarray]:
        key = self.key(packed)
        with self.lock:
            bucket = self.buckets.get(key)
            if bucket is None:
                bucket = self._bucket(key)
                self.buckets[key] = bucket
                while len(self.buckets) > self.max_buckets:
                    self.buckets.popitem(last=False)
            self.buckets.move_to_end(key)
            tokens, sequences = bucket.run(packed)
        return self.encoder.named(tokens, sequences, packed.where)
