"""Token-budget batches: which sequences run together. One rule (`fill_batch`) for the server's batcher, which
picks a batch from its queue around the oldest request, and for offline jobs, which cut a window of
length-sorted sequences into runs (`plan_batches`)."""

from __future__ import annotations

from dataclasses import dataclass

# The row length up to which a batch is bounded by its tokens alone (fill_batch): BERT's 512 positions.
QUADRATIC_WIDTH = 512


def fill_batch(
    lengths: list[int],
    *,
    max_batch_tokens: int,
    max_batch_requests: int,
    max_padding: float | None = None,
    pad_to_multiple_of: int | None = None,
) -> list[int]:
    """One batch from sequences of these `lengths`, in order of preference (the first always joins): the
    positions of those that join while the padded batch (padded length x count) stays within
    `max_batch_tokens`, `max_batch_requests` and `max_padding`, and its attention scores (count x padded
    length squared, per head) within what `max_batch_tokens` of QUADRATIC_WIDTH-token rows hold: rows of a
    long-context model (ModernBERT: 8,192 positions, whose exported attention is not fused) join fewer to a
    batch, and one longer than sqrt(QUADRATIC_WIDTH x max_batch_tokens) runs alone, so a batch of them needs
    no more memory than one such row; models of at most QUADRATIC_WIDTH positions batch as by tokens alone.
    The server's batcher and offline batch jobs (python -m batch, over length-sorted windows of rows) batch by
    this one rule."""
    chosen: list[int] = []
    width = real = 0
    cells = max_batch_tokens * QUADRATIC_WIDTH
    for position, length in enumerate(lengths):
        if len(chosen) >= max_batch_requests:
            break
        new_width = max(width, length)
        if pad_to_multiple_of:
            new_width = -(-new_width // pad_to_multiple_of) * pad_to_multiple_of
        padded = new_width * (len(chosen) + 1)
        if chosen and (padded > max_batch_tokens or padded * new_width > cells):
            continue
        if chosen and max_padding is not None and real + length < (1 - max_padding) * padded:
            continue  # too different in length: it waits for a batch of its own size
        chosen.append(position)
        width, real = new_width, real + length
    return chosen


@dataclass(frozen=True)
class BatchShape:
    """How big a batch may be: padded tokens (padded length x count), sequences, and the share of padding."""

    max_batch_tokens: int = 16384
    max_batch_size: int = 64
    max_padding: float | None = 0.25
    pad_to_multiple_of: int | None = None


def plan_batches(lengths: list[int], shape: BatchShape) -> list[list[int]]:
    """Sequences of these `lengths` sorted by length and cut into batches by fill_batch: each batch as the
    positions of its sequences, shortest first. Sorted, a batch is a run of neighbours: what does not join one is
    longer than what did, so it starts the next."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches, at = [], 0
    while at < len(order):
        ahead = order[at : at + shape.max_batch_size]
        picked = fill_batch(
            [lengths[k] for k in ahead],
            max_batch_tokens=shape.max_batch_tokens,
            max_batch_requests=shape.max_batch_size,
            max_padding=shape.max_padding,
            pad_to_multiple_of=shape.pad_to_multiple_of,
        )
        batch = ahead[: len(picked)]
        at += len(batch)
        batches.append(batch)
    return batches
