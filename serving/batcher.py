"""Token-budget dynamic batching (text-embeddings-inference's queue, Ray Serve's failure semantics).

Requests are tokenised before they get here; every model input sequence (a text, a text pair, one
window of a QA context) is one queue entry with its own future. Each inference worker (a thread;
`workers` of them when the backend allows concurrent runs: on CPU two single-threaded runs do more than
one two-threaded run) takes its own next batch from the queue the moment it is free: it starts from the
oldest sequence, adds the queued sequences closest to it in length while the padded batch stays within
`max_batch_tokens` (padded length x count), `max_batch_requests` and `max_padding` (the share of padding
in the batch: on CPU a pad token costs as much as a real one), and hands the backend its sequences as they
are (padding or packing them is the backend's business: serving/backends/base.py) to get each one's outputs. It waits at most
`max_wait_ms` (from the oldest sequence's arrival) for a batch to fill while it is idle; while every worker
is busy the queue keeps growing, so the next batch is as full as the load allows when a worker frees up.
The event loop only queues sequences and hands results to their callers: a worker never waits for the
loop between two batches (it did when one owner task on the loop dispatched every batch, while the loop
also served HTTP: docs/serving.md, "Why it is built this way").
Callers that have gone are dropped before their sequences are batched.
A batch that fails fails every sequence in it and nothing else; a backend that returns outputs for a number of
sequences other than the batch's is a failure too, never a silent mismatch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from bert.tasks import Features
from serving.errors import BackendFailure

log = logging.getLogger("bertserve")


class Ticket:
    """Shared by the sequences of one request: lets the batcher skip a caller that has gone."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


@dataclass(eq=False)
class Entry:
    features: Features
    ticket: Ticket
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)

    @property
    def length(self) -> int:
        return len(self.features)


@dataclass
class SequenceResult:
    outputs: dict[str, np.ndarray]  # this sequence's rows: (L,) for classify, (T, L) / (T,) per token, unpadded
    queue_s: float
    inference_s: float
    batch_size: int


class Batcher:
    def __init__(
        self,
        backend,
        *,
        max_batch_tokens: int,
        max_batch_requests: int,
        max_wait_ms: float,
        workers: int = 1,
        max_padding: float | None = None,
        pad_to_multiple_of: int | None = None,
        metrics=None,
        name: str = "model",
        labels: dict[str, str] | None = None,
    ):
        self.backend = backend
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_wait_s = max_wait_ms / 1000.0
        self.pad_to_multiple_of = pad_to_multiple_of  # the backend's, for the padded length the budget counts
        self.metrics = metrics
        self.workers = workers
        self.max_padding = max_padding  # most padding a batch may carry, as a share of its padded tokens
        self.name = name
        # This queue's own series (bertserve_model_*{task, model}) beside the server's totals: one model's backlog
        # and waits are told apart from another's.
        self._own = metrics.for_model(**labels) if metrics is not None and labels is not None else None
        # The queue and the batches taken from it are shared by the loop (submit, stop) and the worker threads
        # (take, finish): every access holds the condition's lock. Futures are only ever touched on the loop.
        self.queue: list[Entry] = []
        self._changed = threading.Condition()
        self._running: dict[int, list[Entry]] = {}  # batches the workers have taken and not yet answered
        self._batch_ids = itertools.count()
        self._idle = asyncio.Event()  # set whenever no batch is running (for stop())
        self._idle.set()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._depth_reported = 0

    # ---- public (on the event loop) ----------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(target=self._work, name=f"infer-{self.name}_{i}", daemon=True) for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    async def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop batching; every sequence not answered yet gets a failure. Running batches get `timeout_s`
        to finish. Returns False when some were still running (their threads are left behind)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            finished = True
        except asyncio.TimeoutError:
            finished = False
        stopped = BackendFailure("the server stopped before this input ran")
        with self._changed:
            left = [*self.queue, *(entry for batch in self._running.values() for entry in batch)]
            self.queue.clear()
            self._set_depth()
        for entry in left:
            _fail(entry, stopped)
        return finished

    def submit(self, features: list[Features], ticket: Ticket) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        entries = [Entry(f, ticket, loop.create_future()) for f in features]
        with self._changed:
            if self._stopping:
                raise BackendFailure("the server is stopping")
            self.queue.extend(entries)
            self._set_depth()
            self._changed.notify()
        return [e.future for e in entries]

    # ---- each worker thread ------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            try:
                batch_id, batch = self._next_batch()
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return
            if batch is None:
                return
            started = time.monotonic()
            try:
                outputs = self.backend.run_sequences([e.features for e in batch])
                elapsed = time.monotonic() - started
                if len(outputs) != len(batch):
                    raise BackendFailure(f"backend returned outputs for {len(outputs)} sequences of {len(batch)}")
                result = (outputs, (len(batch), self._padded(max(e.length for e in batch))))
            except Exception as exc:  # noqa: BLE001 - every error fails exactly this batch
                log.error("batch of %d sequences failed: %s: %s", len(batch), type(exc).__name__, exc)
                elapsed, result = (
                    time.monotonic() - started,
                    (
                        exc
                        if isinstance(exc, BackendFailure)
                        else BackendFailure(f"inference failed: {type(exc).__name__}: {str(exc)[:200]}")
                    ),
                )
            try:
                self._loop.call_soon_threadsafe(self._answer, batch_id, batch, result, started, elapsed)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return

    def _next_batch(self) -> tuple[int, list[Entry] | None]:
        """Wait until a batch can be taken (or the batcher stops: None) and take it."""
        with self._changed:
            while True:
                if self._stopping:
                    return -1, None
                gone = self._drop_gone()
                if gone:
                    self._loop.call_soon_threadsafe(_cancel, gone)
                if not self.queue:
                    self._changed.wait()
                    continue
                wait = self.queue[0].enqueued + self.max_wait_s - time.monotonic()
                if wait > 0 and not self._can_fill():
                    self._changed.wait(wait)
                    continue
                batch = self._take()
                if self.queue:
                    self._changed.notify()  # another idle worker may take the rest
                batch_id = next(self._batch_ids)
                self._running[batch_id] = batch
                if len(self._running) == 1:
                    self._loop.call_soon_threadsafe(self._idle.clear)
                return batch_id, batch

    def _can_fill(self) -> bool:
        if len(self.queue) >= self.max_batch_requests:
            return True
        return sum(e.length for e in self.queue) >= self.max_batch_tokens

    def _drop_gone(self) -> list[Entry]:
        """Take the entries of callers that have gone out of the queue (their futures are cancelled on the loop)."""
        if not any(e.ticket.cancelled for e in self.queue):
            return []
        gone = [e for e in self.queue if e.ticket.cancelled]
        self.queue = [e for e in self.queue if not e.ticket.cancelled]
        self._set_depth()
        return gone

    def _take(self) -> list[Entry]:
        """The oldest sequence plus those nearest to it in length that fit the budget."""
        anchor = self.queue[0]
        window = self.queue[: max(4 * self.max_batch_requests, 64)]  # bounded search keeps order roughly FIFO
        candidates = sorted(window, key=lambda e: (abs(e.length - anchor.length), e.enqueued))
        picked = fill_batch(
            [e.length for e in candidates],
            max_batch_tokens=self.max_batch_tokens,
            max_batch_requests=self.max_batch_requests,
            max_padding=self.max_padding,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        chosen = [candidates[i] for i in picked]
        taken = set(map(id, chosen))
        self.queue = [e for e in self.queue if id(e) not in taken]
        self._set_depth()
        return chosen

    def _padded(self, width: int) -> int:
        m = self.pad_to_multiple_of
        return -(-width // m) * m if m else width

    def _set_depth(self) -> None:
        # inc/dec, not set: several batchers (one per model) share the gauge
        if self.metrics is not None and len(self.queue) != self._depth_reported:
            self.metrics.queue_depth.inc(len(self.queue) - self._depth_reported)
            if self._own is not None:
                self._own.queue_depth.set(len(self.queue))
            self._depth_reported = len(self.queue)

    # ---- back on the event loop ----------------------------------------------------------------
    def _answer(self, batch_id: int, batch: list[Entry], result, started: float, elapsed: float) -> None:
        """A worker's batch is done: its callers get their rows, or every one of them the batch's failure."""
        with self._changed:
            self._running.pop(batch_id, None)
            if not self._running:
                self._idle.set()
        if isinstance(result, Exception):
            for entry in batch:
                _fail(entry, result)
            return
        results, (rows, width) = result
        if self.metrics is not None:
            self.metrics.inference_duration.observe(elapsed)
            self.metrics.batch_size.observe(rows)
            self.metrics.batch_tokens.observe(rows * width)
            if self._own is not None:
                self._own.inference_duration.observe(elapsed)
        for entry, rows_of_entry in zip(batch, results):
            if entry.future.done():  # cancelled meanwhile, or failed by stop()
                continue
            queue_s = started - entry.enqueued
            if self.metrics is not None:
                self.metrics.queue_duration.observe(queue_s)
                if self._own is not None:
                    self._own.queue_duration.observe(queue_s)
            entry.future.set_result(SequenceResult(rows_of_entry, queue_s, elapsed, rows))


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
    `max_batch_tokens`, `max_batch_requests` and `max_padding`. The server's batcher and offline batch jobs
    (python -m batch, over length-sorted windows of rows) batch by this one rule."""
    chosen: list[int] = []
    width = real = 0
    for position, length in enumerate(lengths):
        if len(chosen) >= max_batch_requests:
            break
        new_width = max(width, length)
        if pad_to_multiple_of:
            new_width = -(-new_width // pad_to_multiple_of) * pad_to_multiple_of
        padded = new_width * (len(chosen) + 1)
        if chosen and padded > max_batch_tokens:
            continue
        if chosen and max_padding is not None and real + length < (1 - max_padding) * padded:
            continue  # too different in length: it waits for a batch of its own size
        chosen.append(position)
        width, real = new_width, real + length
    return chosen


def _cancel(entries: list[Entry]) -> None:
    for entry in entries:
        if not entry.future.done():
            entry.future.cancel()


def _fail(entry: Entry, error: Exception) -> None:
    if not entry.future.done():
        entry.future.set_exception(error)
