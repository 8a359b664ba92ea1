"""The token-budget batcher in-process with a fake backend (fast; no model, no server)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from bert.tasks import TASKS, Features
from runtime.backends.base import Backend
from serving.batcher import Batcher, Ticket
from serving.errors import BackendFailure


class RecordingBackend(Backend):
    """A padded backend (the base class pads the batcher's sequences for run()) that echoes each row's length as
    its 'classify' output; records the batch shapes it saw."""

    def __init__(self, fail_when=None, rows_off=0):
        self.shapes: list[tuple[int, int]] = []
        self.fail_when = fail_when
        self.rows_off = rows_off

    def run(self, batch):
        ids = batch["input_ids"]
        self.shapes.append(ids.shape)
        if self.fail_when is not None and np.any(ids == self.fail_when):
            raise RuntimeError("boom")
        lengths = batch["attention_mask"].sum(axis=1).astype(np.float32)
        rows = len(ids) + self.rows_off
        return {
            "classify": np.repeat(lengths[:, None], 2, axis=1)[:rows],
            "ner": np.zeros((rows, ids.shape[1], 3), np.float32),
        }


class SlowBackend(RecordingBackend):
    def run(self, batch):
        time.sleep(0.02)  # a batch takes a while, as a model's does
        return super().run(batch)


def seq(length: int, token: int = 5) -> Features:
    return Features([token] * length, [0] * length)


async def submit_all(batcher, lengths, token=5):
    futures = [batcher.submit([seq(n, token)], Ticket())[0] for n in lengths]
    return await asyncio.gather(*futures, return_exceptions=True)


def run(coro_fn, backend, **kw):
    async def main():
        batcher = Batcher(backend, **{"max_batch_tokens": 64, "max_batch_requests": 4, "max_wait_ms": 20, **kw})
        batcher.start()
        try:
            return await coro_fn(batcher)
        finally:
            await batcher.stop()

    return asyncio.run(main())


def test_budget_and_request_cap_are_respected():
    backend = RecordingBackend()
    lengths = [3, 30, 4, 31, 5, 29, 2, 6, 28, 7]
    results = run(lambda b: submit_all(b, lengths), backend)
    assert [r.outputs["classify"][0] for r in results] == lengths  # every caller gets its own row back
    assert sum(rows for rows, _ in backend.shapes) == len(lengths)
    for rows, width in backend.shapes:
        assert rows <= 4 and rows * width <= 64
    # similar lengths were grouped: no batch mixes a 2-7 token sequence with a 28-31 token one
    assert all(width <= 7 or rows * width > 4 * 7 for rows, width in backend.shapes)


def test_per_token_outputs_are_unpadded():
    results = run(lambda b: submit_all(b, [3, 9]), RecordingBackend())
    assert [r.outputs["ner"].shape for r in results] == [(3, 3), (9, 3)]


def test_failing_batch_fails_exactly_its_sequences():
    backend = RecordingBackend(fail_when=7)

    async def scenario(batcher):
        first = await submit_all(batcher, [4, 4], token=7)  # one batch, poisoned
        second = await submit_all(batcher, [4, 4])
        return first, second

    first, second = run(scenario, backend)
    assert all(isinstance(r, BackendFailure) and "boom" in str(r) for r in first)
    assert all(not isinstance(r, Exception) for r in second)


def test_row_mismatch_is_an_error_not_silence():
    results = run(lambda b: submit_all(b, [4, 4, 4]), RecordingBackend(rows_off=-1))
    assert all(isinstance(r, BackendFailure) and "rows" in str(r) for r in results)


def test_cancelled_callers_are_skipped():
    backend = RecordingBackend()

    async def scenario(batcher):
        gone = Ticket()
        gone_future = batcher.submit([seq(10), seq(10)], gone)
        gone.cancelled = True
        kept = await submit_all(batcher, [10])
        return gone_future, kept

    gone_future, kept = run(scenario, backend, max_wait_ms=50)
    assert all(f.cancelled() for f in gone_future)
    assert sum(rows for rows, _ in backend.shapes) == 1 and kept[0].outputs["classify"][0] == 10


def test_waits_at_most_max_wait_for_a_batch_to_fill():
    import time

    async def scenario(batcher):
        started = time.monotonic()
        await submit_all(batcher, [5])
        return time.monotonic() - started

    elapsed = run(scenario, RecordingBackend(), max_wait_ms=100)
    assert 0.09 <= elapsed < 1.0


def test_one_batch_is_prepared_while_the_previous_runs():
    import threading
    import time

    class SlowBackend(RecordingBackend):
        def __init__(self):
            super().__init__()
            self.concurrent = 0
            self.max_concurrent = 0
            self.lock = threading.Lock()

        def run(self, batch):
            with self.lock:
                self.concurrent += 1
                self.max_concurrent = max(self.max_concurrent, self.concurrent)
            time.sleep(0.05)
            with self.lock:
                self.concurrent -= 1
            return super().run(batch)

    backend = SlowBackend()
    results = run(lambda b: submit_all(b, [5] * 12), backend, max_wait_ms=0)
    assert len(results) == 12 and backend.max_concurrent == 1  # one model call at a time
    assert len(backend.shapes) <= 5  # while one ran, the rest queued into full batches


def test_workers_run_that_many_batches_at_once_and_no_more():
    import threading

    class OverlapBackend(RecordingBackend):
        """Each run waits (up to 5 s) for a second run to be inside run() at the same time."""

        def __init__(self):
            super().__init__()
            self.barrier = threading.Barrier(2, timeout=5)
            self.inside = self.most_inside = 0
            self.lock = threading.Lock()

        def run(self, batch):
            with self.lock:
                self.inside += 1
                self.most_inside = max(self.most_inside, self.inside)
            try:
                self.barrier.wait()  # BrokenBarrierError (a failed batch) unless two runs overlap
            finally:
                with self.lock:
                    self.inside -= 1
            return super().run(batch)

    backend = OverlapBackend()
    results = run(lambda b: submit_all(b, [5] * 16), backend, max_wait_ms=0, workers=2)
    assert all(not isinstance(r, BaseException) for r in results), results
    assert [r.outputs["classify"][0] for r in results] == [5] * 16
    assert backend.most_inside == 2 and len(backend.shapes) % 2 == 0


@pytest.mark.parametrize("args", [["--help"]])
def test_help_names_every_setting_and_env_var(args, capsys):
    from serving.__main__ import build_parser
    from serving.settings import Settings

    text = build_parser().format_help()
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in text and f"BERTSERVE_{name.upper()}" in text


def test_settings_from_env(monkeypatch):
    from serving.settings import Settings

    monkeypatch.setenv("BERTSERVE_MAX_BATCH_TOKENS", "999")
    monkeypatch.setenv("BERTSERVE_BACKEND", "onnxruntime")
    settings = Settings(max_wait_ms=1)
    assert settings.max_batch_tokens == 999 and settings.backend == "onnxruntime" and settings.max_wait_ms == 1
    with pytest.raises(ValueError):
        Settings(backend="bogus")


def test_batch_request_cap_defaults_by_device():
    from serving.settings import Settings

    assert Settings().effective_max_batch_requests() == 4  # cpu: bigger batches of short texts mostly add padding
    assert Settings().effective_max_batch_requests(32) == 32  # the torch backend's: it pays per batch
    assert Settings(device="cuda").effective_max_batch_requests() == 32
    assert Settings(max_batch_requests=16).effective_max_batch_requests(32) == 16
    # tokens: the torch backend's own budget on a CPU, unless the flag is given (even at its default)
    assert Settings().effective_max_batch_tokens() == Settings().effective_max_batch_tokens(None) == 16384
    assert Settings().effective_max_batch_tokens(3072) == 3072
    assert Settings(device="cuda").effective_max_batch_tokens(3072) == 16384
    assert Settings(max_batch_tokens=16384).effective_max_batch_tokens(3072) == 16384
    assert Settings(max_batch_tokens=1000).effective_max_batch_tokens(3072) == 1000


def test_one_multitask_model_mixes_tasks_in_a_batch(tmp_path):
    """classify, ner and qa requests arriving together share forward passes of the multi-task model."""
    from test_serving_support import QA_ITEMS, TEXTS, build_checkpoint

    from serving.engine import Engine, Timing
    from serving.metrics import Metrics
    from serving.settings import Settings

    checkpoint = build_checkpoint(tmp_path / "multi")
    # max_padding=1: any lengths may share a batch (the QA window is much longer than the texts)
    engine = Engine(
        Settings(model=str(checkpoint), max_wait_ms=50, threads=1, max_padding=1.0, max_batch_requests=32), Metrics()
    )
    engine.load()
    assert len(engine.units) == 1
    backend = engine.units[0].backend
    seen: list[int] = []
    original = backend.run

    def recording_run(batch):
        seen.append(len(batch["input_ids"]))
        return original(batch)

    backend.run = recording_run

    async def scenario():
        engine.start()
        try:
            return await asyncio.gather(
                engine.infer(
                    engine.unit("classify"),
                    TASKS["classify"],
                    TEXTS[:2],
                    {"top_k": 1},
                    ticket=Ticket(),
                    timing=Timing(),
                ),
                engine.infer(
                    engine.unit("ner"),
                    TASKS["ner"],
                    TEXTS[2:4],
                    {"aggregation": "simple"},
                    ticket=Ticket(),
                    timing=Timing(),
                ),
                engine.infer(
                    engine.unit("qa"),
                    TASKS["qa"],
                    [{**QA_ITEMS[1], "top_k": 1, "max_answer_len": 30, "doc_stride": 128}],
                    {},
                    ticket=Ticket(),
                    timing=Timing(),
                ),
                engine.infer(
                    engine.unit("embed"),
                    TASKS["embed"],
                    TEXTS[4:5],
                    {"normalize": True},
                    ticket=Ticket(),
                    timing=Timing(),
                ),
            )
        finally:
            await engine.stop()

    classified, entities, answers, vectors = asyncio.run(scenario())
    assert len(classified) == 2 and len(entities) == 2 and len(answers) == 1 and len(vectors) == 1
    assert seen == [6], seen  # 2 classify + 2 ner + 1 qa window + 1 embed: one forward pass


def test_max_padding_keeps_very_different_lengths_apart():
    backend = RecordingBackend()
    lengths = [10, 40, 11, 39, 12, 41, 10, 40]
    results = run(
        lambda b: submit_all(b, lengths), backend, max_batch_tokens=1000, max_batch_requests=8, max_padding=0.25
    )
    assert [r.outputs["classify"][0] for r in results] == lengths
    assert sorted(rows for rows, _ in backend.shapes) == [4, 4]  # the short ones together, the long ones together
    assert sorted(width for _, width in backend.shapes) == [12, 41]
    unlimited = RecordingBackend()
    run(lambda b: submit_all(b, lengths), unlimited, max_batch_tokens=1000, max_batch_requests=8)
    assert unlimited.shapes == [(8, 41)]


# ---- every path fails every entry of a batch it cannot run (issue 11) -------------------------------------
def test_a_batch_that_cannot_be_padded_fails_its_callers(monkeypatch):
    import runtime.backends.base as batcher_module  # where a padded backend's batch is padded

    real_pad = batcher_module.pad_batch

    def pad_or_fail(features, *args):
        if any(f.input_ids[0] == 9 for f in features):
            raise MemoryError("cannot allocate the batch")
        return real_pad(features, *args)

    monkeypatch.setattr(batcher_module, "pad_batch", pad_or_fail)

    async def scenario(batcher):
        poisoned = await asyncio.wait_for(submit_all(batcher, [4, 4], token=9), 5)  # would hang before
        fine = await asyncio.wait_for(submit_all(batcher, [4]), 5)
        return poisoned, fine

    poisoned, fine = run(scenario, RecordingBackend())
    assert all(isinstance(r, BackendFailure) and "MemoryError" in str(r) for r in poisoned), poisoned
    assert not isinstance(fine[0], Exception)


class BlockingBackend(Backend):
    """run() waits for `release` (a threading.Event), so batches stay running as long as a test wants."""

    def __init__(self):
        import threading

        self.release = threading.Event()
        self.started = threading.Event()

    def run(self, batch):
        self.started.set()
        self.release.wait(10)
        rows = len(batch["input_ids"])
        return {"classify": np.zeros((rows, 2), np.float32)}


def test_stop_fails_queued_and_running_batches():
    backend = BlockingBackend()

    async def main():
        batcher = Batcher(backend, max_batch_tokens=64, max_batch_requests=1, max_wait_ms=0, workers=1)
        batcher.start()
        futures = [batcher.submit([seq(4)], Ticket())[0] for _ in range(3)]
        # one running (the worker blocks), two queued
        while not backend.started.is_set() or len(batcher.queue) > 2:
            await asyncio.sleep(0.01)
        finished = await batcher.stop(timeout_s=0.2)
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
        backend.release.set()
        return finished, results

    finished, results = asyncio.run(main())
    assert finished is False  # the running batch outlived the timeout
    assert all(isinstance(r, BackendFailure) and "stopped" in str(r) for r in results), results


def test_wrongly_shaped_outputs_fail_the_batch():
    class FlatNer(RecordingBackend):
        def run(self, batch):
            out = super().run(batch)
            out["ner"] = np.zeros(len(batch["input_ids"]), np.float32)  # per-token output without a token axis
            return out

    results = run(lambda b: submit_all(b, [4, 4]), FlatNer())
    assert all(isinstance(r, BackendFailure) and "'ner'" in str(r) for r in results), results


def test_one_future_is_awaited_as_gather_would():
    """The engine awaits a one-sequence request's future without gather: the same outcomes (a result, an
    exception handed back, a future cancelled alone handed back as CancelledError), and the awaiting task's own
    cancellation still raised."""
    from serving.engine import _outcome

    async def both(settle):
        results = []
        for wait in (lambda f: _outcome(f), lambda f: asyncio.gather(f, return_exceptions=True)):
            future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(settle, future)
            got = await wait(future)
            results.append(got[0] if isinstance(got, list) else got)
        return results

    def fail(future):
        future.set_exception(BackendFailure("boom"))

    ours, gathered = asyncio.run(both(lambda f: f.set_result(7)))
    assert ours == gathered == 7
    ours, gathered = asyncio.run(both(fail))
    assert type(ours) is type(gathered) is BackendFailure
    ours, gathered = asyncio.run(both(lambda f: f.cancel()))
    assert type(ours) is type(gathered) is asyncio.CancelledError

    async def cancelled_waiter():
        future = asyncio.get_running_loop().create_future()
        waiter = asyncio.ensure_future(_outcome(future))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return future.cancelled()

    assert asyncio.run(cancelled_waiter())


def test_a_request_of_many_sequences_takes_turns_with_the_requests_behind_it():
    """A long text's 40 windows queued first, then a one-sequence request: the short one runs in one of the next
    batches, not after every window (the windows' request has had batches; the short one none)."""

    backend = SlowBackend()
    order = []

    async def scenario(batcher):
        long_ticket = Ticket()
        windows = batcher.submit([seq(12, 5) for _ in range(40)], long_ticket)
        await asyncio.sleep(0.05)  # the first batches are under way
        short = batcher.submit([seq(3, 9)], Ticket())[0]
        for future in windows:
            future.add_done_callback(lambda _: order.append("window"))
        short.add_done_callback(lambda _: order.append("short"))
        await asyncio.gather(short, *windows)

    run(scenario, backend, max_wait_ms=0, max_batch_requests=4, workers=1)
    assert len(order) == 41 and sum(rows for rows, _ in backend.shapes) == 41
    assert order.index("short") <= 16, order  # at most a few batches of windows ran before it (was: all 40)


def test_requests_of_equal_size_finish_one_after_another():
    """Four /rerank-like requests of 8 sequences queued together, batches of 4: the first request is answered after
    two batches, the last after eight (was: all four after the fifth to the eighth batch, every request waiting for
    the others, so that under 32 clients a request's time ranged from 1 to 7 s instead of 1.2-1.4 s)."""
    backend = SlowBackend()
    done = []

    async def scenario(batcher):
        requests = [batcher.submit([seq(10, 5 + r) for _ in range(8)], Ticket()) for r in range(4)]

        async def whole(r, futures):
            await asyncio.gather(*futures)
            done.append((r, len(backend.shapes)))

        await asyncio.gather(*(whole(r, f) for r, f in enumerate(requests)))

    run(scenario, backend, max_wait_ms=0, max_batch_requests=4, workers=1)
    assert [r for r, _ in done] == [0, 1, 2, 3]
    assert [batches for _, batches in done] == [2, 4, 6, 8], done


def test_a_long_request_is_not_starved_by_a_stream_of_short_ones():
    """A text of 40 windows, then short requests that keep the queue full for 1.5 s: the windows are answered while
    the stream goes on (a request's turn comes by when it came, less what is left of it), not after it stops."""
    backend = SlowBackend()
    finished = {}

    async def scenario(batcher):
        loop = asyncio.get_running_loop()
        started = loop.time()
        windows = batcher.submit([seq(12, 5) for _ in range(40)], Ticket())

        async def feeder():
            while loop.time() - started < 1.5:
                await batcher.submit([seq(3, 9)], Ticket())[0]

        async def long_request():
            await asyncio.gather(*windows)
            finished["windows"] = loop.time() - started

        await asyncio.gather(long_request(), *(feeder() for _ in range(8)))
        finished["stream"] = loop.time() - started

    run(scenario, backend, max_wait_ms=0, max_batch_requests=4, workers=1)
    assert finished["windows"] < 1.4 < finished["stream"], finished


def test_long_rows_batch_by_their_attention_scores_not_by_tokens_alone():
    """A batch's attention (rows x width^2) stays within what max_batch_tokens of 512-token rows hold: two
    8,192-token rows of a long-context model (15 GB of scores in an unfused ONNX graph at 12 heads) no longer
    share a batch; rows of at most 512 tokens batch as before."""
    from runtime.batching import QUADRATIC_WIDTH, fill_batch

    def size(length: int, count: int = 300, budget: int = 16384) -> int:
        return len(fill_batch([length] * count, max_batch_tokens=budget, max_batch_requests=256))

    assert QUADRATIC_WIDTH == 512
    assert size(128) == 128 and size(512) == 32  # by tokens, as before
    assert size(1024) == 8 and size(2048) == 2  # 16 and 8 by tokens alone
    assert size(2896) == 1 and size(8192) == 1 and size(8192, budget=65536) == 1 and size(8192, budget=262144) == 2
    # the first row always joins, however long; a short row after a long one is bounded by the long width
    assert fill_batch([8192, 16], max_batch_tokens=16384, max_batch_requests=256) == [0]
    assert fill_batch([300, 2000], max_batch_tokens=16384, max_batch_requests=256) == [0, 1]
