"""Losses and label conventions the model's heads and the tasks' training hooks share.

Its own module so that bert/model.py (which reads the task declarations) and the tasks (whose loss hooks use
these) both import it, and neither imports the other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # label value that the losses skip (sub-tokens, padding, unmasked tokens)


def span_loss(start_logits, end_logits, start_positions, end_positions) -> torch.Tensor:
    # Positions outside the sequence (answer cut off by a window) are ignored, as in transformers.
    ignored = start_logits.shape[1]
    start = start_positions.clamp(0, ignored)
    end = end_positions.clamp(0, ignored)
    return (
        F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
        + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)
    ) / 2
