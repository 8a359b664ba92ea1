"""The engine's codec lanes in-process (a small random checkpoint, torch backend): small sequence-level
requests are tokenised and decoded on the event loop, and answer exactly as they do through the codec
threads; everything else still goes to a thread."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from test_serving_support import TEXTS, build_checkpoint

import serving.engine as engine_module
from bert.tasks import TASKS
from serving.batcher import Ticket
from serving.engine import INLINE_REQUEST_CHARS, LIGHT_REQUEST_CHARS, Engine, Timing
from serving.errors import ValidationFailed
from serving.metrics import Metrics
from serving.settings import Settings


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("inline") / "multi")


def answers(checkpoint, requests, **settings):
    """Run (task, items, options) requests concurrently through a fresh engine; also how many threads each
    codec lane started."""
    engine = Engine(Settings(model=str(checkpoint), threads=1, **settings), Metrics())
    engine.load()

    async def scenario():
        engine.start()
        try:
            return await asyncio.gather(
                *(
                    engine.infer(engine.unit(task), TASKS[task], items, dict(options), ticket=Ticket(), timing=Timing())
                    for task, items, options in requests
                )
            )
        finally:
            await engine.stop()

    out = asyncio.run(scenario())
    return out, {"light": len(engine._light_lane._threads), "heavy": len(engine._heavy_lane._threads)}


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)
    else:
        assert a == b


SMALL = [
    ("classify", TEXTS[:3], {"top_k": 2}),
    ("embed", TEXTS[3:5], {"normalize": True}),
    ("classify", [[TEXTS[0], TEXTS[1]]], {"top_k": 1}),
]


def test_small_sequence_level_requests_run_on_the_loop_and_answer_as_in_a_thread(checkpoint, monkeypatch):
    inline, threads = answers(checkpoint, SMALL)
    assert threads == {"light": 0, "heavy": 0}  # no codec thread was ever started
    monkeypatch.setattr(engine_module, "INLINE_REQUEST_CHARS", -1)  # every request through the light lane
    threaded, threads = answers(checkpoint, SMALL)
    assert threads["light"] > 0
    assert_same(inline, threaded)
    assert len(inline[1]) == 2 and np.isclose(np.linalg.norm(inline[1][0]), 1.0)


@pytest.mark.parametrize(
    "task, items, options, lane",
    [
        ("classify", ["x" * INLINE_REQUEST_CHARS], {}, None),
        ("classify", ["x" * (INLINE_REQUEST_CHARS + 1)], {}, "light"),
        ("classify", ["short"], {"truncate": True}, "light"),  # truncation takes a lock a long request may hold
        ("embed", ["short"] * 4, {"normalize": True}, None),
        ("ner", ["short"], {}, "light"),  # per-token decoding costs ~20 us per token in Python
        ("qa", [{"question": "q", "context": "c"}], {}, "light"),
        ("embed", ["x" * (LIGHT_REQUEST_CHARS + 1)], {}, "heavy"),
        ("zero_shot", ["short text"], {"candidate_labels": ["a", "b"], "hypothesis_template": "It is {}."}, None),
        # each text is tokenised once per label: 300 characters x 8 labels is no small request
        ("zero_shot", ["x" * 300], {"candidate_labels": list("abcdefgh"), "hypothesis_template": "{}"}, "light"),
    ],
)
def test_lane_of_a_request(checkpoint, task, items, options, lane):
    engine = Engine(Settings(model=str(checkpoint)), Metrics())
    chosen = engine._lane(TASKS[task], TASKS[task].request_chars(items, options), options)
    assert chosen is {None: None, "light": engine._light_lane, "heavy": engine._heavy_lane}[lane]


def test_an_inline_request_refused_by_its_codec_is_a_422(checkpoint):
    with pytest.raises(ValidationFailed, match="tokens"):
        answers(checkpoint, [("classify", ["word " * 200], {})], max_input_length=64)
