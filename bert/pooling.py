"""Pooling: an encoder's token states -> one vector per sequence, with sentence-transformers' arithmetic (so
vectors match its `encode`): the [CLS] state, or the mean or the max over the real tokens.

The one place the modes and their arithmetic are written, for each form the states come in: numpy arrays (a
server pooling an encoder graph's `last_hidden_state`, without torch), torch tensors (the model's forward,
bert/model.py), and packed torch states (serving's fast path: (N, H) tokens, sequence after sequence). How a
model directory declares its pooling is the embed task's to read (bert/tasks/embed.py, `read_pooling`).
numpy at import; torch only inside the packed form, which only a torch caller reaches.
"""

from __future__ import annotations

import numpy as np

POOLINGS = ("cls", "mean", "max")
DEFAULT_POOLING = "mean"  # sentence-transformers' choice for a plain encoder
PACKED_POOLINGS = ("cls", "mean")  # max has no packed form with static shapes


def check_mode(mode: str, modes: tuple[str, ...] = POOLINGS) -> None:
    if mode not in modes:
        raise ValueError(f"pooling must be one of {', '.join(modes)}, got {mode!r}")


def pool(hidden, attention_mask, mode: str):
    """Token states (B, T, H) -> (B, H). `attention_mask`: (B, T) 1 for a real token, 0 for padding; None when
    every token is real; or a packing (bert/model.py's Packing: `cu_seqlens`, `cls_rows`) for packed (N, H)
    states, which give (S, H). numpy states come back float32 (float16 graphs included); tensors keep their dtype."""
    check_mode(mode)
    if getattr(attention_mask, "cu_seqlens", None) is not None:
        return pool_packed(hidden, attention_mask.cu_seqlens, attention_mask.cls_rows, mode)
    numpy = not hasattr(hidden, "masked_fill")  # anything else is a torch tensor
    if numpy:
        hidden = np.asarray(hidden, dtype=np.float32)
    if mode == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden.mean(1) if mode == "mean" else _max_over_tokens(hidden, None, numpy)
    # (B, T, 1) in the states' dtype
    weights = (
        np.asarray(attention_mask)[..., None].astype(hidden.dtype)
        if numpy
        else attention_mask[..., None].to(hidden.dtype)
    )
    if mode == "mean":
        return (hidden * weights).sum(1) / weights.sum(1).clip(1e-9)
    return _max_over_tokens(hidden, weights, numpy)


def _max_over_tokens(hidden, weights, numpy: bool):
    """The largest value of each feature over the real tokens: padding is set to the dtype's lowest value first
    (not -inf, so that an all-padding row stays finite; not -1e9, which overflows fp16)."""
    if numpy:
        if weights is not None:
            hidden = np.where(weights > 0, hidden, np.finfo(hidden.dtype).min)
        return hidden.max(axis=1)
    if weights is not None:
        import torch

        hidden = hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min)
    return hidden.amax(dim=1)


def pool_packed(hidden, cu_seqlens, cls_rows, mode: str):
    """pool() over packed torch states (N, H) -> (S, H): `cu_seqlens` (S + 1,) where each sequence starts,
    `cls_rows` (S,) each sequence's first token."""
    check_mode(mode)
    if mode not in PACKED_POOLINGS:
        raise ValueError(f"{mode} pooling has no packed form (packed: {', '.join(PACKED_POOLINGS)})")
    if mode == "cls":
        return hidden.index_select(0, cls_rows)
    import torch

    # Per-sequence sums by scattering each token's row into its sequence's: one pass over the states, static
    # shapes (graph-capturable), float32 accumulation. Tokens past the last sequence (a bucket's filler) land in
    # an extra row that is dropped. (A running sum along the tokens, differenced at the bounds, ran as a
    # column-serial scan kernel on CUDA, milliseconds for a batch of long sequences.)
    bounds = cu_seqlens.long()
    sequences = bounds.numel() - 1
    token = torch.arange(hidden.shape[0], device=hidden.device)
    owner = torch.searchsorted(bounds[1:], token, right=True)  # (N,) in [0, S]
    sums = hidden.new_zeros((sequences + 1, hidden.shape[1]), dtype=torch.float32)
    sums = sums.index_add_(0, owner, hidden.float())[:sequences]
    counts = (bounds[1:] - bounds[:-1]).clamp(min=1).unsqueeze(1)
    return (sums / counts).to(hidden.dtype)
