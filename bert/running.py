"""Running a model over encoded features outside the server: deterministic length-sorted batches, each
feature's outputs handed back unpadded. The tasks' evaluation hooks and training read their predictions here."""

from __future__ import annotations

import numpy as np
import torch

from bert.tasks.common import Features, pad_batch


def eval_batches(lengths, batch_size: int) -> list[list[int]]:
    """Deterministic evaluation batches: sorted by length (less padding), independent of any seed."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


def batch_tensors(features: list[Features], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Features right-padded into one batch of int64 tensors (input_ids, attention_mask, token_type_ids)."""
    return {k: torch.from_numpy(v) for k, v in pad_batch(features, pad_token_id).items()}


@torch.no_grad()
def run_model(model, features: list, *, batch_size: int = 64, pad_token_id: int = 0, outputs=("logits",)):
    """Forward `features` in deterministic length-sorted batches; per feature, a tuple of numpy arrays
    (unpadded along the sequence for token-level outputs)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    results: list = [None] * len(features)
    for indices in eval_batches([len(f) for f in features], batch_size):
        batch = {k: v.to(device) for k, v in batch_tensors([features[i] for i in indices], pad_token_id).items()}
        out = model(**batch)
        arrays = [getattr(out, name).float().cpu().numpy() for name in outputs]
        for row, i in enumerate(indices):
            results[i] = tuple(
                a[row] if a.ndim == 1 or a.shape[1] != batch["input_ids"].shape[1] else a[row, : len(features[i])]
                for a in arrays
            )
    if was_training:
        model.train()
    return results
