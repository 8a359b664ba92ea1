"""The server knows no task by name: a task object registered at run time (`registry.register`), with a Route
and schemas made here, is served by a real server with nothing else changed; and an unknown task anywhere at
startup is one error line and exit 2."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field
from test_serving_support import PYTHON, REPO, Server, build_checkpoint

from bert.tasks.base import Route, Task, check_texts

MAX_ITEMS = 4


class CountRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    texts: list[str] = Field(..., description="texts to count the tokens of")
    plus: int = Field(0, description="added to each count")


class Count(BaseModel):
    text: str
    tokens: int
    width: int


class CountResponse(BaseModel):
    model: str
    tokens: int
    counts: list[Count]


def _check(body, info) -> None:
    check_texts(body.texts, "texts[{}]")
    if body.plus < 0:
        raise ValueError("plus: must not be negative")


class CountTask(Task):
    """Per text: its model input tokens (plus `plus`) and the width of the vector the encoder gave it."""

    name = "count"
    order = 99
    outputs, output_ranks, per_token = ("embed",), (2,), False
    head = None  # served by any encoder, beside its heads
    graph_outputs = single_graph_outputs = {"embedding": "embed"}
    routes = (
        Route(
            "/count",
            CountRequest,
            CountResponse,
            "Count tokens",
            to_items=lambda body: (list(body.texts), {"plus": body.plus}),
            shape=lambda answers, body, info: {"model": info.model_name, "tokens": info.tokens, "counts": answers},
            check=_check,
            batch_field="texts",
        ),
    )

    def encode_request(self, tokenizer, items, limits, **options):
        from bert.tasks import classify

        return [[f] for f in classify.encode(tokenizer, items, max_length=limits.max_length)]

    def decode_request(self, items, features, outputs, facts, *, plus=0, **options):
        return [
            {"text": text, "tokens": len(f[0]) + plus, "width": len(sequences[0]["embed"])}
            for text, f, sequences in zip(items, features, outputs)
        ]


def register() -> None:
    """Called in the server's process before it imports anything of serving."""
    from bert.tasks import registry

    registry.register(CountTask())


SERVE_WITH_COUNT = (
    "-c",
    "import sys, test_serving_generic; test_serving_generic.register(); "
    "from serving.__main__ import exit_now, main; exit_now(main(sys.argv[1:]))",
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("generic") / "multi")


def test_a_task_registered_at_run_time_is_served_from_its_declaration_alone(checkpoint):
    with Server(
        "--model", str(checkpoint), "--max-client-batch-size", str(MAX_ITEMS), python_args=SERVE_WITH_COUNT
    ) as server:
        texts = ["one two three", "four"]
        r = httpx.post(server.url + "/count", json={"texts": texts, "plus": 1}, timeout=30)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert [c["text"] for c in answer["counts"]] == texts
        assert all(c["width"] == 32 for c in answer["counts"])  # the tiny encoder's hidden size
        assert answer["tokens"] == sum(c["tokens"] - 1 for c in answer["counts"])  # the request's input tokens
        assert answer["counts"][0]["tokens"] - 1 == 5  # [CLS] one two three [SEP]
        assert "x-queue-time-ms" in r.headers

        def refused(body):
            r = httpx.post(server.url + "/count", json=body, timeout=30)
            return r.status_code, r.json()["error"]

        assert refused({"texts": []}) == (400, "texts is empty")
        assert refused({"texts": ["a", " "]}) == (400, "texts[1] is empty")
        status, message = refused({"texts": ["a"] * (MAX_ITEMS + 1)})
        assert status == 413 and message.startswith("texts: 5 inputs") and f"limit is {MAX_ITEMS}" in message
        assert refused({"texts": ["a"], "plus": -1}) == (422, "plus: must not be negative")
        assert refused({"texts": ["a"], "minus": 1})[0] == 422  # the schema made here validates

        schema = httpx.get(server.url + "/openapi.json", timeout=10).json()
        operation = schema["paths"]["/count"]["post"]
        assert operation["summary"] == "Count tokens"
        texts_field = schema["components"]["schemas"]["CountRequest"]["properties"]["texts"]
        assert texts_field["maxItems"] == MAX_ITEMS and texts_field["minItems"] == 1
        assert "count" in httpx.get(server.url + "/info", timeout=10).json()["tasks"]
        # the built-in tasks still answer beside it
        assert httpx.post(server.url + "/classify", json={"inputs": "fine"}, timeout=30).status_code == 200


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "serving", "--port", "0", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("key, value", [("task_labels", {"classify": ["a", "b"], "nope": ["x"]}), ("task", "nope")])
def test_a_checkpoint_that_names_an_unknown_task_is_one_error_line(checkpoint, tmp_path, key, value):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in checkpoint.iterdir():
        (bad / f.name).symlink_to(f)
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("task_labels", None)
    (bad / "config.json").unlink()
    (bad / "config.json").write_text(json.dumps({**config, key: value}))
    line = _one_error_line(_serve("--model", str(bad)))
    assert "nope" in line and "classify" in line  # names the stranger and the tasks there are


def test_a_model_flag_for_a_task_that_is_not_one_is_one_error_line():
    line = _one_error_line(_serve("--nope-model", "x"))
    assert "--nope-model" in line
