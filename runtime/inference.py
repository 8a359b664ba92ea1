"""One task on one loaded model, the way the server and batch jobs both run it:

    items -> encode (the task's codec: each item's sequences) -> the sequences run in token-budget batches
          -> each item's sequence outputs (regroup) -> decode (the task's codec: one answer per item)

`Inference` holds the task and the model and does the codec's two ends; `run_batch` runs one batch on a backend
and checks its answer; `run_planned` runs a set of sequences in the batches `plan_batches` cuts (what a batch
job does with a window of rows). The server's batcher runs each batch with the same `run_batch`, but picks its
batches from a queue shared by every request (serving/batcher.py), so it awaits the outputs of a request's
sequences instead of calling `run_planned`. Nothing here names a task: what differs between tasks is the task
object's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bert.tasks.base import Task
from bert.tasks.common import Features, Limits
from runtime.backends.base import Backend, BackendError, BatchOutputs, SequenceOutputs
from runtime.batching import BatchShape, plan_batches
from runtime.loading import LoadedModel


@dataclass
class Encoded:
    """Items and the sequences their codec made: `features[i]` is item i's (one, or a QA context's windows)."""

    items: list
    features: list[list[Features]]

    @property
    def sequences(self) -> list[Features]:
        """Every item's sequences in order: what runs."""
        return [f for item in self.features for f in item]

    def subset(self, indices: list[int]) -> Encoded:
        """Those items (in that order) with their sequences."""
        return Encoded([self.items[i] for i in indices], [self.features[i] for i in indices])

    def per_item(self, outputs: list) -> list[list]:
        """Outputs in the order of `sequences` -> one list per item (what the codec decodes)."""
        grouped, at = [], 0
        for item in self.features:
            grouped.append(outputs[at : at + len(item)])
            at += len(item)
        return grouped


class Inference:
    """`task` on `model`: its requests encoded and decoded with the model's tokenizer and facts (labels, pooling)."""

    def __init__(self, model: LoadedModel, task: Task):
        self.model, self.task = model, task
        self.facts = model.facts(task.name)

    def encode(
        self, items: list, limits: Limits, options: dict, cancelled: Callable[[], bool] | None = None
    ) -> Encoded:
        """Items -> their sequences; the codec's refusals (InputTooLong, TooMuchWork, ValueError) raised."""
        extra = {} if cancelled is None else {"cancelled": cancelled}
        features = self.task.encode_request(self.model.tokenizer, items, limits, **extra, **options)
        return Encoded(items, features)

    def decode(self, encoded: Encoded, outputs: list[list], options: dict) -> list:
        """One answer per item from its sequences' outputs (`outputs[i]`: item i's, one mapping per sequence)."""
        return self.task.decode_request(encoded.items, encoded.features, outputs, self.facts, **options)

    def margins(self, encoded: Encoded, outputs: list[list], options: dict) -> list[float] | None:
        """How sure each item's answer is (None: the task has no such notion)."""
        return self.task.margins(encoded.items, encoded.features, outputs, self.facts, **options)

    def unsure(self, encoded: Encoded, outputs: list[list], options: dict, margin: float) -> list[int]:
        """The items whose margins are under `margin`: those an exact model answers again (server, batch jobs,
        export's measure of an int8 graph with its fp32 graph)."""
        margins = self.margins(encoded, outputs, options)
        return [] if margins is None else [i for i, m in enumerate(margins) if m < margin]


def run_batch(backend: Backend, sequences: list[Features]) -> BatchOutputs:
    """One batch on `backend`: its outputs whole; a backend that answers another number of sequences fails it."""
    outputs = backend.run_batch(sequences)
    if len(outputs) != len(sequences):
        raise BackendError(f"backend returned outputs for {len(outputs)} sequences of {len(sequences)}")
    return outputs


@dataclass
class Planned:
    """What `run_planned` gives: per sequence its outputs (None where its batch failed or was another share's),
    per failed batch its sequences and error, and the counts of what ran."""

    outputs: list[SequenceOutputs | None]
    failures: list[tuple[list[int], Exception]]
    tokens: int = 0
    sequences: int = 0
    padded: int = 0


def run_planned(
    backend: Backend,
    sequences: list[Features],
    shape: BatchShape,
    *,
    share: tuple[int, int] | None = None,
    mapper: Callable[[Callable, Iterable], Iterable] = map,
) -> Planned:
    """`sequences` run in length-sorted token-budget batches (plan_batches). `share` (k, n): only every n-th batch
    from the k-th runs. `mapper`: how the batches are run (map: one after the other; a pool's map: several at
    once; the batches are cut before any runs, so that changes nothing but the time). A failed batch fails its
    sequences only."""
    lengths = [len(s) for s in sequences]
    batches = plan_batches(lengths, shape)
    if share is not None:
        batches = batches[share[0] :: share[1]]

    def run(batch: list[int]):
        try:
            return run_batch(backend, [sequences[k] for k in batch])
        except Exception as e:  # noqa: BLE001 - a failed batch fails its sequences, not the others
            return e

    planned = Planned([None] * len(sequences), [])
    for batch, result in zip(batches, mapper(run, batches)):
        planned.tokens += sum(lengths[k] for k in batch)
        planned.sequences += len(batch)
        planned.padded += max(lengths[k] for k in batch) * len(batch)
        if isinstance(result, Exception):
            planned.failures.append((batch, result))
            continue
        for row, k in enumerate(batch):
            planned.outputs[k] = result.sequence(row)
    return planned


def run_encoded(backend: Backend, encoded: Encoded, shape: BatchShape | None = None) -> list[list]:
    """Every sequence of `encoded` run in `shape`'s length-sorted batches (run_planned), all in this thread: per
    item its sequences' outputs, as `Inference.decode` takes them. A failed batch raises its error."""
    planned = run_planned(backend, encoded.sequences, shape or BatchShape())
    if planned.failures:
        raise planned.failures[0][1]
    return encoded.per_item(planned.outputs)
