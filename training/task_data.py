"""Fine-tuning data for each task: encoded features, length-grouped batches, collation, and prediction.

Training and training.evaluate both go through `predict_*` and `evaluate_*` here, so the numbers a
fine-tuning run writes to metrics.json are the numbers evaluate prints for the same checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from bert.tasks import classify as classify_codec
from bert.tasks import ner as ner_codec
from bert.tasks import registry
from bert.tasks.common import Features, pad_batch
from training import metrics as M
from training.data.readers import TaggedSentence, TextExample

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


def eval_batches(lengths, batch_size: int) -> list[list[int]]:
    """Deterministic evaluation batches: sorted by length (less padding), independent of any seed."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


def _tensors(features: list[Features], pad_token_id: int) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in pad_batch(features, pad_token_id).items()}


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
    lengths: np.ndarray = field(init=False)

    def __post_init__(self):
        self.lengths = np.array([len(f) for f in self.features])

    def __len__(self) -> int:
        return len(self.features)

    def batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch, 1])
        return length_grouped_batches(self.lengths, self.batch_size, rng, group_by_length=self.group_by_length)

    def collate(self, indices: list[int], rng=None) -> dict[str, torch.Tensor]:
        batch = _tensors([self.features[i] for i in indices], self.pad_token_id)
        batch.update(
            registry.get(self.task).collate_targets([self.targets[i] for i in indices], batch["input_ids"].shape[1])
        )
        return batch


@torch.no_grad()
def run_model(model, features: list, *, batch_size: int = 64, pad_token_id: int = 0, outputs=("logits",)):
    """Forward `features` in deterministic length-sorted batches; per feature, a tuple of numpy arrays
    (unpadded along the sequence for token-level outputs)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    results: list = [None] * len(features)
    for indices in eval_batches([len(f) for f in features], batch_size):
        batch = {k: v.to(device) for k, v in _tensors([features[i] for i in indices], pad_token_id).items()}
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
        batch = {k: v.to(device) for k, v in _tensors([features[i] for i in indices], pad_token_id).items()}
        hidden = encoder(**batch).last_hidden_state
        vectors[indices] = pool(hidden.float(), batch["attention_mask"], mode).cpu().numpy()
    if was_training:
        model.train()
    return vectors


# ----------------------------------------------------------------------------- classification


def label_index(labels: list[str], value: str | None) -> int:
    """A label as written in the data -> its index among `labels` (or the integer itself if in range)."""
    if value in labels:
        return labels.index(value)
    if value is not None and value.lstrip("-").isdigit() and 0 <= int(value) < len(labels):
        return int(value)
    raise ValueError(f"label {value!r} is not one of {labels}")


def encode_classify(tokenizer, examples: list[TextExample], max_seq_length: int) -> list[Features]:
    inputs = [e.text if e.pair is None else (e.text, e.pair) for e in examples]
    return classify_codec.encode(tokenizer, inputs, max_length=max_seq_length, truncate=True)


def classify_targets(examples: list[TextExample], labels: list[str] | None) -> list:
    if labels is None:  # regression
        return [float(e.label) for e in examples]
    return [label_index(labels, e.label) for e in examples]


def evaluate_classify(
    model,
    tokenizer,
    examples: list[TextExample],
    *,
    labels: list[str] | None,
    max_seq_length: int,
    batch_size: int = 64,
) -> dict:
    features = encode_classify(tokenizer, examples, max_seq_length)
    logits = np.stack(
        [r[0] for r in run_model(model, features, batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)]
    )
    targets = classify_targets(examples, labels)
    if labels is None:
        metrics = M.regression_metrics(logits[:, 0], targets)
    else:
        metrics = M.classification_metrics(logits.argmax(-1).tolist(), targets)
    metrics["examples"] = len(examples)
    return metrics


# ----------------------------------------------------------------------------- NER


def encode_ner(
    tokenizer,
    sentences: list[TaggedSentence],
    labels: list[str],
    max_seq_length: int,
    label_all_subtokens: bool = False,
):
    features = ner_codec.encode_words(tokenizer, [s.words for s in sentences], max_length=max_seq_length, truncate=True)
    index = {label: i for i, label in enumerate(labels)}
    targets, continuation = [], ner_codec.continuation_labels(labels)
    for sentence, feature in zip(sentences, features):
        word_labels = [index[t] for t in sentence.tags]
        targets.append(
            ner_codec.align_labels(
                word_labels, feature.word_ids, label_all_subtokens=label_all_subtokens, continuation=continuation
            )
        )
    return features, targets


def word_predictions(feature, token_logits: np.ndarray, id2label: dict, n_words: int) -> list[str]:
    """The label of each word: the prediction at its first sub-token; words cut off by truncation get O."""
    tags = ["O"] * n_words
    seen = set()
    for token, word in enumerate(feature.word_ids):
        if word is not None and word not in seen:
            seen.add(word)
            tags[word] = id2label[int(token_logits[token].argmax())]
    return tags


def evaluate_ner(
    model, tokenizer, sentences: list[TaggedSentence], *, labels: list[str], max_seq_length: int, batch_size: int = 64
) -> dict:
    features = ner_codec.encode_words(tokenizer, [s.words for s in sentences], max_length=max_seq_length, truncate=True)
    outputs = run_model(model, features, batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)
    id2label = dict(enumerate(labels))
    predicted = [word_predictions(f, o[0], id2label, len(s.words)) for f, o, s in zip(features, outputs, sentences)]
    result = M.conlleval([s.tags for s in sentences], predicted)
    result["sentences"] = len(sentences)
    return result
