"""Token-budget dynamic batching (text-embeddings-inference's queue, Ray Serve's failure semantics).

Requests are tokenised before they get here; every model input sequence (a text, a text pair, one
window of a QA context) is one queue entry with its own future. ONE owner task builds batches:
it starts from the oldest sequence, adds the queued sequences closest to it in length while the
padded batch stays within `max_batch_tokens` (padded length x count), `max_batch_requests` and
`max_padding` (the share of padding in the batch: on CPU a pad token costs as much as a real one), and
waits at most `max_wait_ms` (from the oldest sequence's arrival) for a batch to fill — longer only while
the model is busy anyway, so the batch keeps growing until it can run. Inference runs in a thread
(`workers` batches at once, each in its own thread, when the backend allows it: on CPU two
single-threaded runs do more than one two-threaded run); while they run the owner already builds and
pads the next batch (as soon as the queue can fill one), so a batch is ready when a worker frees up.
Callers that have gone are dropped before their sequences are batched.
A batch that fails fails every sequence in it and nothing else; a backend that returns a number of
rows other than the number of sequences is a failure too, never a silent mismatch.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from bert.tasks import Features, pad_batch, registry
from serving.errors import BackendFailure

log = logging.getLogger("bertserve")
PER_TOKEN_OUTPUTS = registry.per_token_outputs()  # sliced to each sequence's own length


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
    def __init__(self, backend, *, max_batch_tokens: int, max_batch_requests: int, max_wait_ms: float,
                 workers: int = 1, max_padding: float | None = None, pad_token_id: int = 0,
                 pad_to_multiple_of: int | None = None, metrics=None, name: str = "model"):
        self.backend = backend
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_wait_s = max_wait_ms / 1000.0
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.metrics = metrics
        self.queue: list[Entry] = []
        self._wakeup = asyncio.Event()
        self.workers = workers
        self.max_padding = max_padding  # most padding a batch may carry, as a share of its padded tokens
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"infer-{name}")
        self._owner: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()  # batches running now, at most `workers`
        self._running: dict[asyncio.Task, list[Entry]] = {}  # each running batch's entries, for stop()
        self.batches_run = 0
        self._depth_reported = 0

    # ---- public ---------------------------------------------------------------------------
    def start(self) -> None:
        self._owner = asyncio.get_running_loop().create_task(self._run_forever(), name="batcher")

    async def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop batching; every sequence not answered yet gets a failure. Running batches get `timeout_s`
        to finish. Returns False when some were still running (their threads are left behind)."""
        if self._owner is not None:
            self._owner.cancel()
            try:
                await self._owner
            except asyncio.CancelledError:
                pass
        finished = True
        if self._inflight:
            _, running = await asyncio.wait(self._inflight, timeout=timeout_s)
            finished = not running
        stopped = BackendFailure("the server stopped before this input ran")
        for entry in [*self.queue, *self._running_entries()]:
            _fail(entry, stopped)
        self.queue.clear()
        self._set_depth()
        self._executor.shutdown(wait=False, cancel_futures=True)
        return finished

    def submit(self, features: list[Features], ticket: Ticket) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        entries = [Entry(f, ticket, loop.create_future()) for f in features]
        self.queue.extend(entries)
        self._set_depth()
        self._wakeup.set()
        return [e.future for e in entries]

    # ---- the owner task -------------------------------------------------------------------
    async def _run_forever(self) -> None:
        while True:
            batch: list[Entry] = []
            try:
                batch = await self._next_batch()
                arrays = pad_batch([e.features for e in batch], self.pad_token_id, self.pad_to_multiple_of)
                while self._busy():  # wait for a free worker
                    await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
                task = asyncio.get_running_loop().create_task(self._execute(batch, arrays))
                self._running[task] = batch
                self._inflight.add(task)
                task.add_done_callback(self._finished)
            except asyncio.CancelledError:  # stop(): a batch taken from the queue but not started fails too
                for entry in batch:
                    _fail(entry, BackendFailure("the server stopped before this input ran"))
                raise
            except Exception as exc:  # the owner must never die: fail the batch in hand, log, keep serving
                log.exception("batcher loop error")
                for entry in batch:
                    _fail(entry, BackendFailure(f"could not run the batch: {type(exc).__name__}"))
                await asyncio.sleep(0.01)

    def _finished(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        self._running.pop(task, None)

    def _running_entries(self) -> list[Entry]:
        return [entry for batch in self._running.values() for entry in batch]

    async def _next_batch(self) -> list[Entry]:
        while True:
            self._drop_gone()
            if not self.queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            wait = self.queue[0].enqueued + self.max_wait_s - time.monotonic()
            if self._can_fill() or (wait <= 0 and not self._busy()):
                batch = self._take()
                if batch:
                    return batch
                continue
            self._wakeup.clear()
            if wait > 0:
                try:
                    await asyncio.wait_for(self._wakeup.wait(), wait)
                except asyncio.TimeoutError:
                    pass
            else:  # past the deadline but every worker is busy anyway: grow the batch until one frees up
                woken = asyncio.ensure_future(self._wakeup.wait())
                await asyncio.wait({woken, *self._inflight}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()

    def _busy(self) -> bool:
        return sum(not t.done() for t in self._inflight) >= self.workers

    def _can_fill(self) -> bool:
        if len(self.queue) >= self.max_batch_requests:
            return True
        return sum(e.length for e in self.queue) >= self.max_batch_tokens

    def _drop_gone(self) -> None:
        if any(e.ticket.cancelled for e in self.queue):
            for e in self.queue:
                if e.ticket.cancelled and not e.future.done():
                    e.future.cancel()
            self.queue = [e for e in self.queue if not e.ticket.cancelled]
            self._set_depth()

    def _take(self) -> list[Entry]:
        """The oldest sequence plus those nearest to it in length that fit the budget."""
        anchor = self.queue[0]
        window = self.queue[: max(4 * self.max_batch_requests, 64)]  # bounded search keeps order roughly FIFO
        candidates = sorted(window, key=lambda e: (abs(e.length - anchor.length), e.enqueued))
        chosen: list[Entry] = []
        width = real = 0
        for entry in candidates:
            if len(chosen) >= self.max_batch_requests:
                break
            new_width = self._padded(max(width, entry.length))
            padded = new_width * (len(chosen) + 1)
            if chosen and padded > self.max_batch_tokens:
                continue
            if chosen and self.max_padding is not None and real + entry.length < (1 - self.max_padding) * padded:
                continue  # too different in length: it waits for a batch of its own size
            chosen.append(entry)
            width, real = new_width, real + entry.length
        taken = set(map(id, chosen))
        self.queue = [e for e in self.queue if id(e) not in taken]
        self._set_depth()
        return chosen

    def _padded(self, width: int) -> int:
        m = self.pad_to_multiple_of
        return -(-width // m) * m if m else width

    async def _execute(self, batch: list[Entry], arrays: dict[str, np.ndarray]) -> None:
        started = time.monotonic()
        rows, width = arrays["input_ids"].shape
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self.backend.run, arrays)
            elapsed = time.monotonic() - started
            results = self._split(outputs, batch, rows)
        except Exception as exc:  # noqa: BLE001 - every error fails exactly this batch
            log.error("batch of %d sequences failed: %s: %s", rows, type(exc).__name__, exc)
            failure = exc if isinstance(exc, BackendFailure) else BackendFailure(
                f"inference failed: {type(exc).__name__}: {str(exc)[:200]}")
            for entry in batch:
                _fail(entry, failure)
            return
        finally:
            self.batches_run += 1
        if self.metrics is not None:
            self.metrics.inference_duration.observe(elapsed)
            self.metrics.batch_size.observe(rows)
            self.metrics.batch_tokens.observe(rows * width)
        for entry, result in zip(batch, results):
            if entry.future.done():  # cancelled meanwhile
                continue
            queue_s = started - entry.enqueued
            if self.metrics is not None:
                self.metrics.queue_duration.observe(queue_s)
            entry.future.set_result(SequenceResult(result, queue_s, elapsed, rows))

    @staticmethod
    def _split(outputs: dict[str, np.ndarray], batch: list[Entry], rows: int) -> list[dict[str, np.ndarray]]:
        """Each sequence's rows of every output; a backend that returns other shapes fails the batch."""
        for key, value in outputs.items():
            per_token = key in PER_TOKEN_OUTPUTS
            if np.ndim(value) < (2 if per_token else 1) or len(value) != rows:
                raise BackendFailure(f"backend returned {len(value) if np.ndim(value) else 0} rows of {key!r} (shape "
                                     f"{np.shape(value)}) for {rows} sequences")
        return [{k: (v[i, : entry.length] if k in PER_TOKEN_OUTPUTS else v[i]) for k, v in outputs.items()}
                for i, entry in enumerate(batch)]

    def _set_depth(self) -> None:
        # inc/dec, not set: several batchers (one per model) share the gauge
        if self.metrics is not None and len(self.queue) != self._depth_reported:
            self.metrics.queue_depth.inc(len(self.queue) - self._depth_reported)
            self._depth_reported = len(self.queue)


def _fail(entry: Entry, error: Exception) -> None:
    if not entry.future.done():
        entry.future.set_exception(error)
