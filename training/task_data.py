"""Fine-tuning data for any task: encoded features in length-grouped batches, collated with their targets.

What is task-specific (reading its files, encoding, targets, evaluation) is the task's own (bert/tasks); running
a model over features is bert.running, which training and every task's evaluation share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from bert.running import batch_tensors, eval_batches
from bert.tasks import registry

# ----------------------------------------------------------------------------- batching


def length_grouped_batches(
    lengths: np.ndarray,
    batch_size: int,
    rng: np.random.Generator,
    *,
    group_by_length: bool = True,
    chunk_batches: int = 50,
) -> list[list[int]]:
    """One epoch of full batches: a random permutation (its tail of len % batch_size dropped), then, when
    grouping, sorted by length within chunks of `chunk_batches` batches, and the batch order shuffled.
    Every example is equally likely to be in each epoch; padding shrinks to about the chunk's spread."""
    order = rng.permutation(len(lengths))
    order = order[: len(order) - len(order) % batch_size]
    if group_by_length:
        chunk = batch_size * chunk_batches
        order = (
            np.concatenate(
                [
                    part[np.argsort(-lengths[part], kind="stable")]
                    for part in np.split(order, range(chunk, len(order), chunk))
                ]
            )
            if len(order)
            else order
        )
    batches = [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    if group_by_length:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


@dataclass
class FeatureData:
    """Encoded training examples for one task; implements training.loop.TrainData."""

    features: list  # Features (or subclasses), one per example
    targets: list  # per example, what its task's collate_targets takes (a class id, token labels, a span ...)
    task: str  # the task (bert.tasks registry name) whose targets these are
    batch_size: int
    seed: int
    group_by_length: bool = True
    pad_token_id: int = 0
    group_size: int = 1  # consecutive features that share a batch (Task.train_group_size)
    lengths: np.ndarray = field(init=False)

    def __post_init__(self):
        self.lengths = np.array([len(f) for f in self.features])

    def __len__(self) -> int:
        return len(self.features)

    def batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch, 1])
        if self.group_size == 1:
            return length_grouped_batches(self.lengths, self.batch_size, rng, group_by_length=self.group_by_length)
        # Whole groups: batched as units by their longest member, then each unit expanded to its features.
        g = self.group_size
        longest = self.lengths[: len(self.lengths) - len(self.lengths) % g].reshape(-1, g).max(axis=1)
        units = length_grouped_batches(longest, max(1, self.batch_size // g), rng, group_by_length=self.group_by_length)
        return [[u * g + j for u in batch for j in range(g)] for batch in units]

    def collate(self, indices: list[int], rng=None) -> dict[str, torch.Tensor]:
        batch = batch_tensors([self.features[i] for i in indices], self.pad_token_id)
        batch.update(
            registry.get(self.task).collate_targets([self.targets[i] for i in indices], batch["input_ids"].shape[1])
        )
        return batch


@torch.no_grad()
def pooled_embeddings(model, features: list, mode: str, *, batch_size: int = 64, pad_token_id: int = 0) -> np.ndarray:
    """Each feature's sentence embedding, its encoder's token states pooled (`mode`: cls | mean | max) and not
    normalised: (N, H) float32, in deterministic length-sorted batches (the same bits on every call)."""
    from bert.model import pool

    was_training = model.training
    model.eval()
    encoder = model.encoder_module()
    device = next(model.parameters()).device
    vectors = np.zeros((len(features), encoder.config.hidden_size), dtype=np.float32)
    for indices in eval_batches([len(f) for f in features], batch_size):
        batch = {k: v.to(device) for k, v in batch_tensors([features[i] for i in indices], pad_token_id).items()}
        hidden = encoder(**batch).last_hidden_state
        vectors[indices] = pool(hidden.float(), batch["attention_mask"], mode).cpu().numpy()
    if was_training:
        model.train()
    return vectors
