"""The torch backend's fast path: packed sequences, fused QKV, varlen flash attention, CUDA graphs.

Part of the torch backend (runtime/backends/torch_backend.py is its only user). Why each piece:

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

The packed forward itself is the model's (bert/model.py): a `Packing` passed in place of the attention mask
makes the same embeddings, layers and heads run over (N, H) tokens, attention as the "varlen"
implementation with the kernel chosen here. This module holds what is serving's: packing the batcher's
sequences as they come (and, for a caller holding one, a padded batch) and splitting the outputs per sequence,
shape buckets, CUDA graphs, and the attention kernels to choose from.

Every piece except the flash kernel and the graph capture itself runs on CPU too (attention by a
per-sequence reference, graphs replaced by eager calls on the same static buffers), which is how the
tests prove the packing, the bucket padding and the heads equal the padded model.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bert.model import Packing
from bert.tasks.registry import TASKS

log = logging.getLogger("bertserve")

# ----------------------------------------------------------------------------- packing (host side, numpy)


@dataclass
class Packed:
    """A batch's sequences as their real tokens, one after the other."""

    ids: np.ndarray  # (N,) int32
    types: np.ndarray  # (N,) int32
    positions: np.ndarray  # (N,) int32: 0..len-1 within each sequence
    cu_seqlens: np.ndarray  # (B + 1,) int32: where each sequence starts in the N tokens
    where: np.ndarray | None  # (B, T) bool: the real tokens' places, for a batch packed from a padded one
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
    return Packed(
        ids=np.asarray(batch["input_ids"])[where].astype(np.int32),
        types=np.asarray(batch["token_type_ids"])[where].astype(np.int32),
        positions=positions,
        cu_seqlens=cu,
        where=where,
        max_len=int(lengths.max()),
    )


def pack_sequences(sequences: list) -> Packed:
    """Unpadded sequences (Features: input_ids, token_type_ids) as one run of tokens: nothing to strip."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    cu = np.zeros(len(sequences) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    tokens = int(cu[-1])
    return Packed(
        ids=np.fromiter((i for s in sequences for i in s.input_ids), dtype=np.int32, count=tokens),
        types=np.fromiter((t for s in sequences for t in s.token_type_ids), dtype=np.int32, count=tokens),
        positions=(np.arange(tokens, dtype=np.int64) - np.repeat(cu[:-1], lengths)).astype(np.int32),
        cu_seqlens=cu,
        where=None,
        max_len=int(lengths.max()) if len(lengths) else 0,
    )


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

# attention(q, k, v, cu_seqlens, max_len, cu_host[, window=w]) -> (N, heads, head_size); q, k, v: (N, heads,
# head_size). window (a windowed layer's): each token attends to the tokens of its sequence at most w positions away.
Attention = Callable[..., torch.Tensor]


def attention_varlen(q, k, v, cu, max_len, cu_host=None, window=None):
    """torch.nn.attention.varlen.varlen_attn: PyTorch's public FlashAttention varlen entry (CUDA)."""
    from torch.nn.attention.varlen import varlen_attn

    if window is not None:
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, window_size=(window, window))
    return varlen_attn(q, k, v, cu, cu, max_len, max_len)


def attention_aten_flash(q, k, v, cu, max_len, cu_host=None, window=None):
    """The aten op behind varlen_attn and nested-tensor SDPA (present since torch 2.1; CUDA)."""
    if window is not None:
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, False, False, window_size_left=window, window_size_right=window
        )[0]
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, False, False)[0]


def attention_reference(q, k, v, cu, max_len, cu_host=None, window=None):
    """Each sequence through plain SDPA: the definition the fast kernels must match (and the CPU path).
    Tokens after the last sequence (bucket filler) get zeros."""
    out = torch.zeros_like(q)
    bounds = cu_host if cu_host is not None else cu.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if stop > start:
            # (1, heads, len, head_size) for SDPA, back to (len, heads, head_size)
            qs, ks, vs = (t[start:stop].transpose(0, 1)[None] for t in (q, k, v))
            mask = None
            if window is not None:  # the window stays inside the sequence: positions count from its start
                position = torch.arange(stop - start, device=q.device)
                mask = (position[None, :] - position[:, None]).abs() <= window
            out[start:stop] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)[0].transpose(0, 1)
    return out


def contiguous(attention: Attention) -> Attention:
    """The same kernel fed contiguous q, k, v (for a kernel that refuses the strided views of one QKV tensor)."""

    def call(q, k, v, cu, max_len, cu_host=None, **window):
        return attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, max_len, cu_host, **window)

    call.__name__ = f"{attention.__name__}_contiguous"
    return call


CUDA_ATTENTIONS: list[Attention] = [
    attention_varlen,
    attention_aten_flash,
    contiguous(attention_varlen),
    contiguous(attention_aten_flash),
]


# ----------------------------------------------------------------------------- the model over packed tokens


class PackedEncoder:
    """A loaded BertForMultiTask (eval, on its device and dtype) run over packed tokens: its own modules, with a
    Packing in place of the attention mask (bert/model.py's varlen attention implementation), so it computes
    what the padded forward computes: per-token heads on every token, sequence heads on each sequence's [CLS]
    row, the pooled embedding. It holds no weights; the model's attention modules keep a fused QKV copy.

    gelu_epilogue: the feed-forward GELU inside the GEMM (cuBLASLt's GELU_BIAS epilogue on CUDA: one pass over
    the 4H-wide activations fewer). That epilogue is the tanh approximation, so by default only for models
    trained with it (gelu_new / gelu_pytorch_tanh); True applies it to exact-GELU models too (differences far
    below fp16 rounding; an opt-in, measured as its own piece by the GPU kit)."""

    def __init__(self, model, attention: Attention = attention_reference, gelu_epilogue: bool | None = None):
        from bert.model import BertForMultiTask
        from bert.pooling import PACKED_POOLINGS

        if not isinstance(model, BertForMultiTask):
            raise TypeError(f"no packed path for {type(model).__name__} (load checkpoints with load_for_inference)")
        pooling = model.encoder_module().pooling
        if not model.heads and pooling is None:
            raise TypeError("no packed path for a model with neither heads nor pooling")
        if pooling is not None and pooling not in PACKED_POOLINGS:
            raise TypeError(f"no packed path for {pooling} pooling")
        config = model.config
        self.model = model
        self.attention = attention
        tanh_gelu = config.hidden_act in ("gelu_new", "gelu_pytorch_tanh")
        self.gelu_epilogue = (tanh_gelu if gelu_epilogue is None else gelu_epilogue) and (
            tanh_gelu or config.hidden_act == "gelu"
        )
        self.max_positions = config.max_position_embeddings
        model.fuse_qkv()
        # The model's outputs with a row per token (unpacked into the padded layout); the others have one per
        # sequence. From the tasks' declarations: which of their outputs are per token.
        self.per_token = {name for task in TASKS.values() if task.per_token for name in task.graph_outputs}

    def forward(self, ids, types, positions, cu, cls_rows, max_len: int, cu_host=None) -> dict[str, torch.Tensor]:
        """ids, types, positions: (N,) int; cu: (S+1,) int32; cls_rows: (S,) int -> the model's output table:
        per-token outputs (N, ...), per-sequence ones (S, ...); floating ones in float32."""
        packing = Packing(positions, cu, cls_rows, max_len, self.attention, cu_host, self.gelu_epilogue)
        table = self.model(ids, packing, types).outputs
        return {name: value.float() if value.is_floating_point() else value for name, value in table.items()}

    def unpack(self, outputs: dict[str, np.ndarray], where: np.ndarray) -> dict[str, np.ndarray]:
        """Per-token outputs back in the padded (B, T, ...) layout; per-sequence ones as they are."""
        return {
            name: unpack_tokens(value, where) if name in self.per_token else value for name, value in outputs.items()
        }


# ----------------------------------------------------------------------------- static buckets and CUDA graphs


class _Bucket:
    """Static device buffers for one (sequences, tokens) bucket, and on CUDA the graph captured over them."""

    def __init__(
        self, encoder: PackedEncoder, device: torch.device, sequences: int, tokens: int, *, graph: bool, pool=None
    ):
        self.sequences, self.tokens = sequences, tokens
        self.max_len = min(tokens, encoder.max_positions)
        cuda = device.type == "cuda"
        size = 3 * tokens + (sequences + 1) + sequences  # ids | types | positions | cu_seqlens | cls rows
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=cuda)
        self.device_in = torch.zeros(size, dtype=torch.int32, device=device)
        d = self.device_in
        t, s = tokens, sequences
        self.views = (d[:t], d[t : 2 * t], d[2 * t : 3 * t], d[3 * t : 3 * t + s + 1], d[3 * t + s + 1 :])
        self.cu_host: list[int] | None = None  # read by the reference attention (CPU); graphs never need it
        self.encoder = encoder
        self.graph = None
        self.outputs: dict[str, torch.Tensor] = {}
        self.pinned = cuda
        self.host_outputs: dict[str, torch.Tensor] | None = None  # made on the first run, shaped like the outputs
        if graph:
            self._capture(pool)

    def _run(self) -> dict[str, torch.Tensor]:
        ids, types, positions, cu, cls_rows = self.views
        return self.encoder.forward(ids, types, positions, cu, cls_rows, self.max_len, self.cu_host)

    def _capture(self, pool) -> None:
        # Valid inputs for the warm-up runs: one sequence over every token.
        self._fill(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), np.array([0, 1], np.int32))
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
        host[:n], host[t : t + n], host[2 * t : 2 * t + n] = ids, types, positions
        cu_all = host[3 * t : 3 * t + s + 1]
        cu_all[: b + 1] = cu
        cu_all[b + 1 :] = cu[-1]  # empty sequences up to the bucket's count
        host[3 * t + s + 1 : 3 * t + s + 1 + b] = cu[:-1]  # each sequence's [CLS] row
        self.cu_host = cu_all.tolist()
        self.device_in.copy_(self.host, non_blocking=True)

    def run(self, packed: Packed) -> dict[str, np.ndarray]:
        """The model's output table for these packed sequences: per-token outputs (N, ...), per-sequence (B, ...)."""
        self._fill(packed.ids, packed.types, packed.positions, packed.cu_seqlens)
        if self.graph is not None:
            self.graph.replay()
            outputs = self.outputs
        else:
            outputs = self._run()
        if self.host_outputs is None:
            self.host_outputs = {
                name: torch.empty(value.shape, dtype=value.dtype, pin_memory=self.pinned)
                for name, value in outputs.items()
            }
        for name, host in self.host_outputs.items():
            host.copy_(outputs[name], non_blocking=True)
        if self.device_in.is_cuda:
            torch.cuda.current_stream().synchronize()
        n, b = packed.tokens, packed.batch
        return {
            name: host.numpy()[: n if name in self.encoder.per_token else b].copy()
            for name, host in self.host_outputs.items()
        }


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

    def run(self, packed: Packed) -> dict[str, np.ndarray]:
        """The model's output table (graph-output names), per-token outputs in the padded (B, T, ...) layout of
        the batch `packed` was packed from."""
        return self.encoder.unpack(self.run_packed(packed), packed.where)

    @torch.inference_mode()
    def run_packed(self, packed: Packed) -> dict[str, np.ndarray]:
        """The model's output table (graph-output names): per-token outputs (N, ...), per-sequence ones (B, ...)."""
        key = self.key(packed)
        with self.lock:
            bucket = self.buckets.get(key)
            if bucket is None:
                bucket = self._bucket(key)
                self.buckets[key] = bucket
                while len(self.buckets) > self.max_buckets:
                    self.buckets.popitem(last=False)
            self.buckets.move_to_end(key)
            return bucket.run(packed)
