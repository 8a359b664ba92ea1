"""Answers are rendered by orjson (serving.routes.api.AnswerResponse): the same JSON as starlette's
JSONResponse, and a number JSON cannot hold is refused as starlette refuses it, never written as null."""

import json
import math

import pytest
from starlette.responses import JSONResponse

from serving.routes.api import AnswerResponse

ANSWERS = [
    [{"label": "positive", "score": 0.9998}, {"label": "negative", "score": 0.0002}],
    [[0.1, -0.25, 1e-7, 3.4028234663852886e38, 0.0]],
    {"answer": "Berlin — Zoë's café", "score": 0.5, "start": 0, "end": 6},
    [{"entity_group": "PER", "word": "Elon Musk", "start": 0, "end": 9, "score": 0.99}],
    {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": "AAAAAA=="}],
        "model": "m",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    },
    [],
    {"nothing": None},
]


@pytest.mark.parametrize("content", ANSWERS)
def test_same_json_as_starlette(content):
    ours, theirs = AnswerResponse(content).body, JSONResponse(content).body
    assert json.loads(ours) == json.loads(theirs) == content  # every float round-trips exactly
    if b"e-0" not in theirs:  # byte for byte but for the exponent's spelling (1e-7 vs 1e-07)
        assert ours == theirs
    assert AnswerResponse(content).headers["content-type"] == "application/json"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_not_finite_is_refused_not_null(bad):
    for content in ([{"label": "x", "score": bad}], [[0.5, bad]], {"a": {"b": [bad]}}):
        with pytest.raises(ValueError, match="not JSON compliant"):
            AnswerResponse(content)
        with pytest.raises(ValueError):
            JSONResponse(content)
