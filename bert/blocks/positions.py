"""Positions beside the absolute table of the embeddings: rotary (queries and keys rotated by their positions'
angles, per layer), windows (each query sees keys at most w positions away), and DeBERTa's relative positions
(log-bucketed distances indexing a table that disentangled attention projects). Any family may use any of them;
the config says which a model has (rope_theta, layer_types, relative_attention)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .basics import Packing, additive_padding_mask


def rotary_tables(positions: torch.Tensor, head_size: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position tables (cos, sin), (..., head_size) for positions (...): the frequencies and float32
    arithmetic of transformers' default RoPE, so that rotated queries and keys equal theirs. Computed per call,
    not stored: a buffer would follow the model to fp16 and lose the frequencies' digits."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float, device=positions.device) / head_size))
    freqs = positions[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (B, nh, T, hs) or (N, nh, hs) rotated by its positions' angles (tables (1, T, hs) or (N, hs))."""
    cos, sin = (t.unsqueeze(1) for t in rope)
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def windowed_mask(mask: torch.Tensor | None, length: int, window: int, dtype, device) -> torch.Tensor:
    """The additive (B, 1, 1, T) padding mask (or none) -> (B|1, 1, T, T) that also masks keys more than `window`
    positions from the query. masked_fill, not a sum: two most-negative values would add to -inf, and a query
    row of -inf only (a padded query whose window is all padding) would turn into NaN."""
    position = torch.arange(length, device=device)
    outside = (position[None, :] - position[:, None]).abs() > window  # (T, T)
    base = mask if mask is not None else torch.zeros(1, 1, 1, length, dtype=dtype, device=device)
    return base.masked_fill(outside, torch.finfo(dtype).min)


def log_bucket(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Relative distances (long) -> DeBERTa's buckets: exact within buckets // 2 either way, logarithmic beyond up to
    max_position; the arithmetic of transformers' make_log_bucket_position, so every bucket equals theirs."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    distance = torch.where(near, torch.tensor(mid - 1).type_as(relative), torch.abs(relative))
    scale = torch.log(torch.tensor((max_position - 1) / mid))
    logarithmic = torch.ceil(torch.log(distance / mid) / scale * (mid - 1)) + mid
    return torch.where(distance <= mid, relative.type_as(logarithmic), logarithmic * sign).long()


def relative_index(length: int, span: int, buckets: int, max_position: int, device) -> torch.Tensor:
    """(T, T) long: row i, column j holds where query i's distance to key j (i - j, bucketed when buckets > 0)
    sits in a table of 2 * span relative-position embeddings. Depends on the length only."""
    position = torch.arange(length, device=device)
    return distance_index(position[:, None] - position[None, :], span, buckets, max_position)


def distance_index(relative: torch.Tensor, span: int, buckets: int, max_position: int) -> torch.Tensor:
    if buckets > 0:
        relative = log_bucket(relative, buckets, max_position)
    return torch.clamp(relative + span, 0, 2 * span - 1)


@dataclass
class RelativePositions:
    """What disentangled attention reads in every layer, made once per forward (BertEncoder.relative_inputs)."""

    index: torch.Tensor  # (T, T) long: relative_index for the (padded or per-sequence) length T
    embeddings: torch.Tensor  # (2 * span, H): the relative-position embeddings, normalised if the config says so
    # A packed batch: each token's slot in an (S + 1, T) padded layout (the last row takes tokens of no sequence)
    # and the additive key mask of that layout, (S + 1, 1, 1, T)
    slots: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None


def relative_positions(
    table: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | Packing | None
) -> RelativePositions:
    """What every disentangled layer reads, once per forward: `table` the relative-position embeddings, `rows`
    every distance's row in it (BertEncoder.relative_rows). A packed batch gets each token's slot in a padded
    (S + 1, max_len) layout (tokens of no sequence go to the last row) and that layout's key mask."""
    if not isinstance(mask, Packing):
        return RelativePositions(_lookup(rows, x.shape[1], x.device), table)
    length, count = mask.max_len, mask.cu_seqlens.shape[0]  # S + 1 rows
    tokens = torch.arange(x.shape[0], device=x.device)
    sequence = torch.searchsorted(mask.cu_seqlens[1:].long(), tokens, right=True)
    slots = sequence * length + mask.positions.long()
    valid = torch.zeros(count * length, dtype=x.dtype, device=x.device).index_fill(0, slots, 1.0)
    key_mask = additive_padding_mask(valid.view(count, length), x.dtype)
    return RelativePositions(_lookup(rows, length, x.device), table, slots, key_mask)


def _lookup(rows: torch.Tensor, length: int, device) -> torch.Tensor:
    """relative_index for this length, looked up in `rows` (lengths up to max_position_embeddings)."""
    position = torch.arange(length, device=device)
    reach = (rows.shape[0] - 1) // 2
    return rows[position[:, None] - position[None, :] + reach]
