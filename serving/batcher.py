"""Token-budget dynamic batching (text-embeddings-inference's queue, Ray Serve's failure semantics).

Requests are tokenised before they get here; every model input sequence (a text, a text pair, one
window of a QA context) is one queue entry with its own future. Each inference worker (a thread;
`workers` of them when the backend allows concurrent runs: on CPU two single-threaded runs do more than
one two-threaded run) takes its own next batch from the queue the moment it is free: it starts from the
oldest sequence of the requests least served so far (the oldest, when every request is one sequence; a request of
many windows or pairs takes turns with those behind it), adds the queued sequences closest to it in length while
the padded batch stays within
`max_batch_tokens` (padded length x count), `max_batch_requests` and `max_padding` (the share of padding
in the batch: on CPU a pad token costs as much as a real one), and hands the backend its sequences as they
are (padding or packing them is the backend's business: runtime/backends/base.py) to get the batch's outputs. It waits at most
`max_wait_ms` (from the oldest sequence's arrival) for a batch to fill while it is idle; while every worker
is busy the queue keeps growing, so the next batch is as full as the load allows when a worker frees up.
The event loop only queues sequences and hands results to their callers: a worker never waits for the
loop between two batches (it did when one owner task on the loop dispatched every batch, while the loop
also served HTTP: docs/serving.md, "Why it is built this way").
Every batch runs under a slot of the device's ComputeGate, which the batchers of all the server's models share
(one queue per model, one device): the models never run more batches at once than the device has slots, a free
slot goes to the model served least recently, and while another model wants the device a loaded model holds all
slots but one, so that a model with one request finds a slot free (with a single slot the loaded model takes small
batches instead, `contended_budget`, and the other waits for about one of them).
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
from collections.abc import Callable
from dataclasses import dataclass, field

from bert.tasks import Features
from runtime.backends.base import BackendError, SequenceOutputs
from runtime.batching import fill_batch
from runtime.inference import run_batch
from serving.errors import BackendFailure

log = logging.getLogger("bertserve")


class Ticket:
    """Shared by the sequences of one request: lets the batcher skip a caller that has gone, and counts how many
    of them wait in a queue (what is left of a request sets its turn: Batcher._take)."""

    __slots__ = ("cancelled", "queued")

    def __init__(self) -> None:
        self.cancelled = False
        self.queued = 0


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
    outputs: SequenceOutputs  # this sequence's rows of its batch's outputs: (L,) per sequence, (T, ...) per token
    queue_s: float
    inference_s: float
    batch_size: int


class ComputeGate:
    """The compute of one device, shared by the batchers of every model on it: at most `slots` batches run at once
    (each on its share of the cores: runtime/backends/base.py threads_per_run), so that several models never
    oversubscribe the cores between them; a backend registered with `one_at_a_time` never runs two batches at
    once, whichever batchers share it. A free slot goes to the waiting model served least recently, not to the
    first that asked: a model with one request waits for one batch of a loaded model, not for its backlog.
    While another model wants the device (`contended`), a model holds at most all slots but one, so the other's
    next batch finds a slot free; with one slot it cannot, and the loaded model takes small batches instead."""

    def __init__(self, slots: int, linger_s: float = 0.25):
        self.slots = max(1, slots)
        # A model counts as wanting the device for this long after its last batch ended: a client that waits for
        # its answer before it sends the next request leaves its queue empty in between, and is still there.
        self.linger_s = linger_s
        self._changed = threading.Condition()
        self._running: dict[object, int] = {}  # owner -> its batches running now
        self._waiting: dict[object, int] = {}  # owner -> its workers waiting for a slot, in the order they came
        self._backend_of: dict[object, int] = {}  # owner -> id of its backend
        self._served: dict[object, int] = {}  # owner -> the number of its last grant (who was served least recently)
        self._ended: dict[object, float] = {}  # owner -> when its last batch ended
        self._one_at_a_time: set[int] = set()  # ids of backends whose runs cannot overlap
        self._passing: set[object] = set()  # owners that want the device only while they wait (no linger)
        self._busy: set[int] = set()  # those of them running now
        self._grants = itertools.count(1)

    def one_at_a_time(self, backend) -> None:
        """`backend` runs one batch at a time, whichever batchers share it."""
        self._one_at_a_time.add(id(backend))

    def passing(self, owner) -> None:
        """`owner` wants the device only while a batch of it waits or runs, not for `linger_s` after: a model that
        answers again another's unsure items (--TASK-verify-model) runs now and then, a few sequences at a time;
        lingering, it would hold the model it verifies to all slots but one nearly all the time."""
        with self._changed:
            self._passing.add(owner)

    def acquire(self, owner, backend, stopping: Callable[[], bool]) -> bool:
        """Wait until `owner` may run a batch on `backend`; False when `stopping()` comes true first."""
        with self._changed:
            self._backend_of[owner] = id(backend)
            self._waiting[owner] = self._waiting.get(owner, 0) + 1
            try:
                while not stopping():
                    if sum(self._running.values()) < self.slots and self._next(time.monotonic()) is owner:
                        break
                    self._changed.wait()
                else:
                    return False
            finally:
                self._waiting[owner] -= 1
                if not self._waiting[owner]:
                    del self._waiting[owner]
            self._running[owner] = self._running.get(owner, 0) + 1
            self._served[owner] = next(self._grants)
            if id(backend) in self._one_at_a_time:
                self._busy.add(id(backend))
            self._changed.notify_all()  # another free slot goes to the next in line
            return True

    def release(self, owner, backend) -> None:
        with self._changed:
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]
            self._busy.discard(id(backend))
            if owner not in self._passing:
                self._ended[owner] = time.monotonic()
            self._changed.notify_all()

    def contended(self, owner) -> bool:
        """Whether a model other than `owner` waits for a slot, runs a batch, or ran one within `linger_s`."""
        with self._changed:
            return self._contended(owner, time.monotonic())

    def small_batches(self, owner) -> bool:
        """Whether `owner` takes a small batch (Batcher.contended_budget): another model wants the device and no slot
        can be kept free for it (a gate of one slot), so that model's next batch waits for one of `owner`'s."""
        return self.slots == 1 and self.contended(owner)

    def _contended(self, owner, now: float) -> bool:
        if any(other is not owner for other in (*self._waiting, *self._running)):
            return True
        return any(other is not owner and now - ended < self.linger_s for other, ended in self._ended.items())

    def _limit(self, owner, now: float) -> int:
        """Slots `owner` may hold at once: all of them alone; while another model wants the device, all but one,
        so that the other's next batch finds a slot free instead of waiting for one of `owner`'s to end."""
        if self.slots > 1 and self._contended(owner, now):
            return self.slots - 1
        return self.slots

    def waiting(self) -> int:
        """How many workers (of all models) wait for a slot now."""
        with self._changed:
            return sum(self._waiting.values())

    def wake(self) -> None:
        """Let the waiting workers look again (their batcher is stopping)."""
        with self._changed:
            self._changed.notify_all()

    def _next(self, now: float):
        """The waiting owner served least recently (never: first come first), among those whose backend is free and
        that hold fewer slots than their limit."""
        ready = [
            o
            for o in self._waiting
            if self._backend_of[o] not in self._busy and self._running.get(o, 0) < self._limit(o, now)
        ]
        return min(ready, key=lambda o: self._served.get(o, 0), default=None)


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
        gate: ComputeGate | None = None,
    ):
        self.backend = backend
        # Shared with the other models' batchers on this device (the engine's); one of its own when alone.
        self.gate = gate if gate is not None else ComputeGate(workers)
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
        self._at_gate = False  # one worker at a time waits for the gate, so one waiting means one batch to run
        # Seconds of this batcher's time a sequence takes (a moving average over its batches, its workers together):
        # what a request's remaining sequences cost in the order _take gives (0 until a batch has run: oldest first).
        self._sequence_s = 0.0

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
        self.gate.wake()
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
            ticket.queued += len(entries)
            # A worker waits on a queue that was empty, or (with max_wait_ms) for the batch to fill; on a queue
            # that already held work with no wait to fill, a waiting worker only waits for its turn at the gate
            # (_take_batch wakes it), so waking it again costs a thread switch and changes nothing.
            wake = not self.queue or self.max_wait_s > 0
            self.queue.extend(entries)
            self._set_depth()
            if wake:
                self._changed.notify()
        return [e.future for e in entries]

    # ---- each worker thread ------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            try:
                if not self._wait_for_work():
                    return
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return
            if not self.gate.acquire(self, self.backend, lambda: self._stopping):
                return
            try:
                batch_id, batch = self._take_batch()
                if batch is None:
                    continue
                started = time.monotonic()
                result = self._run(batch)
                elapsed = time.monotonic() - started
                self._sequence_s += 0.2 * (elapsed / (len(batch) * self.workers) - self._sequence_s)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return
            finally:
                self.gate.release(self, self.backend)
            try:
                self._loop.call_soon_threadsafe(self._answer, batch_id, batch, result, started, elapsed)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return

    def _run(self, batch: list[Entry]):
        """The backend's outputs for `batch` and its (rows, padded width), or the failure every entry of it gets."""
        try:
            outputs = run_batch(self.backend, [e.features for e in batch])
            return outputs, (len(batch), self._padded(max(e.length for e in batch)))
        except Exception as exc:  # noqa: BLE001 - every error fails exactly this batch
            log.error("batch of %d sequences failed: %s: %s", len(batch), type(exc).__name__, exc)
            if isinstance(exc, BackendFailure):
                return exc
            if isinstance(exc, BackendError):  # the batch's answer does not fit the batch: said as it is
                return BackendFailure(str(exc))
            return BackendFailure(f"inference failed: {type(exc).__name__}: {str(exc)[:200]}")

    def _wait_for_work(self) -> bool:
        """Wait until a batch is ready to be taken and no other worker of this batcher waits for the gate (then
        this one goes): True; False when the batcher stops."""
        with self._changed:
            while True:
                if self._stopping:
                    return False
                gone = self._drop_gone()
                if gone:
                    self._loop.call_soon_threadsafe(_cancel, gone)
                if not self.queue or self._at_gate:
                    self._changed.wait()
                    continue
                wait = self.queue[0].enqueued + self.max_wait_s - time.monotonic()
                if wait > 0 and not self._can_fill():
                    self._changed.wait(wait)
                    continue
                self._at_gate = True
                return True

    def _take_batch(self) -> tuple[int, list[Entry] | None]:
        """With a slot of the gate: take the next batch (None: nothing left to take, or stopping)."""
        with self._changed:
            self._at_gate = False
            self._changed.notify()  # another worker may wait for the gate now
            gone = self._drop_gone()
            if gone:
                self._loop.call_soon_threadsafe(_cancel, gone)
            if self._stopping or not self.queue:
                return -1, None
            batch = self._take(self.gate.small_batches(self))
            batch_id = next(self._batch_ids)
            self._running[batch_id] = batch
            if len(self._running) == 1:
                self._loop.call_soon_threadsafe(self._idle.clear)
            return batch_id, batch

    def contended_budget(self) -> tuple[int, int]:
        """(tokens, requests) of a batch taken while another model wants a device of one slot: a quarter of the
        full budget, so that the other model's next batch waits for a small one (the first sequence always joins).
        The loaded model pays in throughput meanwhile; half the budget cost it less but the other model's wait
        more (docs/benchmarks.md, "Several models in one server")."""
        return max(1, self.max_batch_tokens // 4), max(1, self.max_batch_requests // 4)

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
        for entry in gone:
            entry.ticket.queued -= 1
        self._set_depth()
        return gone

    def _take(self, small: bool = False) -> list[Entry]:
        """The anchor plus the sequences nearest to it in length that fit the budget (contended_budget when
        `small`). The anchor is the sequence whose request would finish first if it had the device from when it
        came: the least of (when it was queued + its request's queued sequences x the time a sequence takes). With
        requests of one sequence each that is the oldest; a one-sequence request runs in the next batches, not
        behind the remaining windows of a long text or a /rerank's pairs queued before it; of requests of equal
        size the one furthest along goes on, so that they finish one after another rather than all together at
        the end (docs/serving.md, "How a request flows"); and no request waits for ever: every later request's
        turn is after the time it came."""
        max_tokens, max_requests = (
            self.contended_budget() if small else (self.max_batch_tokens, self.max_batch_requests)
        )
        anchor = self.queue[0]  # the oldest: the anchor when it is its request's last queued sequence
        if anchor.ticket.queued > 1:
            cost = self._sequence_s
            anchor = min(self.queue, key=lambda e: e.enqueued + e.ticket.queued * cost)
        window = self.queue[: max(4 * self.max_batch_requests, 64)]  # bounded search keeps order roughly FIFO
        others = sorted(
            (e for e in window if e is not anchor), key=lambda e: (abs(e.length - anchor.length), e.enqueued)
        )
        candidates = [anchor, *others]
        picked = fill_batch(
            [e.length for e in candidates],
            max_batch_tokens=max_tokens,
            max_batch_requests=max_requests,
            max_padding=self.max_padding,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        chosen = [candidates[i] for i in picked]
        for entry in chosen:
            entry.ticket.queued -= 1
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
        for row, entry in enumerate(batch):
            if entry.future.done():  # cancelled meanwhile, or failed by stop()
                continue
            queue_s = started - entry.enqueued
            if self.metrics is not None:
                self.metrics.queue_duration.observe(queue_s)
                if self._own is not None:
                    self._own.queue_duration.observe(queue_s)
            entry.future.set_result(SequenceResult(results.sequence(row), queue_s, elapsed, rows))


def _cancel(entries: list[Entry]) -> None:
    for entry in entries:
        if not entry.future.done():
            entry.future.cancel()


def _fail(entry: Entry, error: Exception) -> None:
    if not entry.future.done():
        entry.future.set_exception(error)
