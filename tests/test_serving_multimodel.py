"""Several models per task in one server (--TASK-model NAME=DIR, repeated): three classifiers and two embedding
models in one server answer each request as a server holding that model alone does; a request's "model" picks
one (the first by default); an unknown name is a JSON 404 that lists the names; a directory given under two names
is loaded once; bad or duplicate names stop the server at startup with one line."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from test_serving_support import TEXTS, Server, build_checkpoint

from serving.errors import error_message

CLASSIFIERS = ("sentiment", "topic", "toxicity")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("multimodel")
    return {name: build_checkpoint(root / name, "classify", seed=seed) for seed, name in enumerate(CLASSIFIERS)}


@pytest.fixture(scope="module")
def servers(checkpoints, minilm_dir):
    """One server holding all five models, and one per model holding it alone (all started at once)."""
    alone_args = {
        ("classify", "sentiment"): ("--model", str(checkpoints["sentiment"])),  # its classify and embed ("tiny")
        ("classify", "topic"): ("--classify-model", str(checkpoints["topic"])),
        ("classify", "toxicity"): ("--classify-model", str(checkpoints["toxicity"])),
        ("embed", "minilm"): ("--embed-model", str(minilm_dir)),
    }
    together = [
        *[a for name, path in checkpoints.items() for a in ("--classify-model", f"{name}={path}")],
        *("--embed-model", f"minilm={minilm_dir}", "--embed-model", f"tiny={checkpoints['sentiment']}"),
    ]
    started = {"together": Server(*together), **{key: Server(*args) for key, args in alone_args.items()}}
    try:
        for server in started.values():
            server.wait_ready(120)
        yield started
    finally:
        for server in started.values():
            server.stop()


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def _labels(answer: list) -> list:
    return [[(x["label"], x["score"]) for x in per_text] for per_text in answer]


def test_each_model_answers_as_a_server_holding_it_alone(servers):
    together = servers["together"].url
    by_model = {}
    for name in CLASSIFIERS:
        body = {"inputs": TEXTS, "top_k": None}
        mine = _post(together, "/classify", {**body, "model": name})
        alone = _post(servers[("classify", name)].url, "/classify", body)
        assert mine.status_code == alone.status_code == 200, mine.text
        got, want = _labels(mine.json()), _labels(alone.json())
        assert [[label for label, _ in x] for x in got] == [[label for label, _ in x] for x in want]
        np.testing.assert_allclose([[s for _, s in x] for x in got], [[s for _, s in x] for x in want], atol=1e-6)
        by_model[name] = got
    assert len({json.dumps(v) for v in by_model.values()}) == 3  # three different models, three different answers
    default = _post(together, "/classify", {"inputs": TEXTS, "top_k": None})
    # no "model": the first given (to float rounding: the batches its texts ran in may differ)
    got = _labels(default.json())
    assert [[label for label, _ in x] for x in got] == [[label for label, _ in x] for x in by_model["sentiment"]]
    np.testing.assert_allclose(
        [[s for _, s in x] for x in got], [[s for _, s in x] for x in by_model["sentiment"]], atol=1e-6
    )

    for name in ("minilm", "tiny"):
        mine = np.asarray(_post(together, "/embed", {"inputs": TEXTS, "model": name}).json())
        server = servers[("embed", "minilm") if name == "minilm" else ("classify", "sentiment")]
        alone = np.asarray(_post(server.url, "/embed", {"inputs": TEXTS}).json())
        assert mine.shape == alone.shape
        np.testing.assert_allclose(mine, alone, atol=1e-6)
        openai = _post(together, "/v1/embeddings", {"input": TEXTS[:2], "model": name, "encoding_format": "float"})
        assert openai.status_code == 200 and openai.json()["model"] == name
        np.testing.assert_allclose([d["embedding"] for d in openai.json()["data"]], alone[:2], atol=1e-6)
    assert mine.shape[1] == 32  # tiny: the last one; minilm's were 384 wide


def test_an_unknown_model_is_a_json_404_listing_the_names(servers):
    together = servers["together"].url
    for path, body in (
        ("/classify", {"inputs": "fine", "model": "nope"}),
        ("/embed", {"inputs": "fine", "model": "sentiment"}),  # a classifier's name, not an embedding model's
        ("/v1/embeddings", {"input": "fine", "model": "text-embedding-3-small"}),
    ):
        response = _post(together, path, body)
        assert response.status_code == 404, (path, response.text)
        error = response.json()
        message = error_message(error)  # OpenAI's error object on /v1/embeddings, a string elsewhere
        assert error["error_type"] == "not_found" and repr(body["model"]) in message, error
        assert isinstance(error["error"], dict) == path.startswith("/v1/"), error
        names = CLASSIFIERS if path == "/classify" else ("minilm", "tiny")
        assert all(name in message for name in names), error
    # One model given without a name answers whatever a request names, as before (OpenAI's clients send one).
    alone = _post(servers[("embed", "minilm")].url, "/v1/embeddings", {"input": "fine", "model": "anything"})
    assert alone.status_code == 200 and alone.json()["model"] == "anything"


def test_info_the_sdk_and_metrics_name_each_model(servers, checkpoints):
    from bertserve_client import Client, NotFoundError

    together = servers["together"].url
    info = httpx.get(together + "/info").json()
    assert [m["name"] for m in info["models"]["classify"]] == list(CLASSIFIERS)
    assert [m["name"] for m in info["models"]["embed"]] == ["minilm", "tiny"]
    assert info["models"]["classify"][1]["labels"] == ["negative", "positive"]
    with Client(together, max_retries=0) as client:
        assert client.info().model_names("classify") == list(CLASSIFIERS)
        direct = _post(together, "/classify", {"inputs": TEXTS[:3], "model": "topic", "top_k": None}).json()
        through_sdk = client.classify(TEXTS[:3], model="topic", top_k=None)
        assert [[(x.label, x.score) for x in per_text] for per_text in through_sdk] == _labels(direct)
        assert len(client.embed("fine", model="minilm")) == 384 and len(client.embed("fine", model="tiny")) == 32
        with pytest.raises(NotFoundError, match="sentiment, topic, toxicity"):
            client.classify("fine", model="nope")
    metrics = httpx.get(together + "/metrics").text
    for name in CLASSIFIERS:
        assert f'bertserve_model_queue_duration_seconds_count{{model="{name}",task="classify"}}' in metrics, name
    assert 'bertserve_model_queue_depth{model="tiny",task="embed"}' in metrics


def test_info_gives_each_model_its_own_max_input_length(checkpoints, tmp_path):
    """Two classifiers of 512 and 128 positions in one server: /info's models say 512 and 128 (each enforced as
    said: an input of 200 tokens is answered by the one, refused by the other); the top-level max_input_length
    is the one every model takes."""
    short = build_checkpoint(tmp_path / "short", "classify", seed=7, max_position_embeddings=128)
    server = Server("--classify-model", f"long={checkpoints['sentiment']}", "--classify-model", f"short={short}")
    try:
        server.wait_ready(120)
        info = httpx.get(server.url + "/info").json()
        models = {m["name"]: m for m in info["models"]["classify"]}
        assert [m["name"] for m in info["models"]["classify"]] == ["long", "short"]
        assert models["long"]["max_input_length"] == 512 and models["short"]["max_input_length"] == 128, models
        assert models["short"]["labels"] == ["negative", "positive"]
        assert info["max_input_length"] == 128
        from bertserve_client import Client

        with Client(server.url, max_retries=0) as client:
            assert [m.max_input_length for m in client.info().models["classify"]] == [512, 128]
        text = "word " * 200
        assert _post(server.url, "/classify", {"inputs": text, "model": "long"}).status_code == 200
        refused = _post(server.url, "/classify", {"inputs": text, "model": "short"})
        assert refused.status_code == 422 and "128" in refused.text, refused.text
    finally:
        server.stop()


def test_a_directory_under_two_names_is_loaded_once_with_a_queue_each(checkpoints):
    from serving.engine import Engine
    from serving.metrics import Metrics
    from serving.settings import Settings

    path = str(checkpoints["topic"])
    engine = Engine(
        Settings(classify_model=[f"a={path}", f"b={path}"], embed_model=[f"a={path}"], threads=1), Metrics()
    )
    engine.load()
    a, b = engine.models["classify"]["a"], engine.models["classify"]["b"]
    assert a is not b and a.backend is b.backend and a.tokenizer is b.tokenizer
    assert engine.models["embed"]["a"] is a  # one name, one directory, several tasks: one model
    assert len(engine._backend_owners()) == 1


def test_model_and_a_task_flag_naming_the_same_directory_serve_every_task_of_it(checkpoints):
    """`--model DIR --embed-model DIR`: DIR serves embed by the task flag and every other task it has by --model (the
    task flag named the same directory under the same name, and used to leave it serving embed alone); a task flag
    naming another directory still takes that task from --model."""
    from serving.engine import Engine
    from serving.metrics import Metrics
    from serving.settings import Settings

    path, other = str(checkpoints["topic"]), str(checkpoints["toxicity"])
    engine = Engine(Settings(model=path, embed_model=[path], threads=1), Metrics())
    engine.load()
    assert sorted(engine.models) == ["classify", "embed"]
    assert engine.models["classify"] == engine.models["embed"] and len(engine._backend_owners()) == 1
    engine = Engine(Settings(model=path, classify_model=[other], threads=1), Metrics())
    engine.load()
    assert str(engine.by_task["classify"].spec.path) == str(checkpoints["toxicity"].resolve())
    assert str(engine.by_task["embed"].spec.path) == str(checkpoints["topic"].resolve())


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--classify-model", "a={0}", "--classify-model", "a={1}"], {}, "the model name 'a' is given twice"),
        (["--classify-model", "{0}", "--classify-model", "{0}"], {}, "name each model with NAME=DIR"),
        (["--classify-model", "=x"], {}, "NAME=DIR needs a name"),
        (["--classify-model", "bad name={0}"], {}, "got 'bad name'"),
        ([], {"BERTSERVE_EMBED_MODEL": "m={0},m={1}"}, "BERTSERVE_EMBED_MODEL: the model name 'm' is given twice"),
        (["--ner-model", "a="], {}, "needs a directory after the '='"),
    ],
)
def test_bad_model_flags_are_one_line_and_exit_2(argv, env, message, checkpoints, capsys, monkeypatch):
    from serving.__main__ import main

    for key, value in env.items():
        monkeypatch.setenv(key, value.format(checkpoints["sentiment"], checkpoints["topic"]))
    argv = [a.format(checkpoints["sentiment"], checkpoints["topic"]) for a in argv]
    code = main([*argv, "--port", "0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_the_flag_repeats_and_the_env_var_takes_a_list(monkeypatch):
    from bert import options
    from serving.__main__ import build_parser
    from serving.settings import Settings

    values = options.read(Settings, ["--classify-model", "a=x", "--classify-model", "b=y,z"], parser=build_parser())
    assert values["classify_model"] == ["a=x", "b=y", "z"]
    monkeypatch.setenv("BERTSERVE_CLASSIFY_MODEL", "a=x,b=y")
    assert [m.name for m in Settings().task_models()["classify"]] == ["a", "b"]
    assert Settings(classify_model="some/dir").task_models()["classify"][0].name == "some/dir"


class _Overlap:
    running = most = 0


def one_run_at_a_time_backend(spec, settings):
    """The torch backend, declared unable to run two batches at once, counting the runs that overlap."""
    import threading
    import time

    from runtime.backends.torch_backend import TorchBackend

    lock = threading.Lock()

    class OneRunAtATime(TorchBackend):
        concurrent_runs = False

        def run_batch(self, sequences):
            with lock:
                _Overlap.running += 1
                _Overlap.most = max(_Overlap.most, _Overlap.running)
            try:
                time.sleep(0.01)  # long enough for another batcher's run to start, were it let in
                return super().run_batch(sequences)
            finally:
                with lock:
                    _Overlap.running -= 1

    return OneRunAtATime(spec, settings)


def test_batchers_sharing_a_backend_that_cannot_overlap_take_turns(checkpoints):
    import asyncio

    from bert.tasks import TASKS
    from serving.batcher import Ticket
    from serving.engine import Engine, Timing
    from serving.metrics import Metrics
    from serving.settings import Settings

    path = str(checkpoints["topic"])
    settings = Settings(
        classify_model=[f"a={path}", f"b={path}"],
        backend="test_serving_multimodel:one_run_at_a_time_backend",
        threads=1,
        max_batch_requests=1,
    )
    engine = Engine(settings, Metrics())
    engine.load()

    async def scenario():
        engine.start()
        try:
            return await asyncio.gather(
                *(
                    engine.infer(
                        engine.unit("classify", model), TASKS["classify"], [text], {}, ticket=Ticket(), timing=Timing()
                    )
                    for text in TEXTS
                    for model in ("a", "b")
                )
            )
        finally:
            await engine.stop()

    answers = asyncio.run(scenario())
    assert len(answers) == 2 * len(TEXTS) and _Overlap.most == 1
    assert answers[0::2] == answers[1::2]  # one directory under two names: the same answers


def test_a_list_body_names_one_model_for_all_its_items():
    from serving.routes.api import requested_model
    from serving.routes.schemas import QARequest

    def item(model=None):
        return QARequest(question="q", context="c", **({"model": model} if model else {}))

    assert requested_model([item("a"), item("a")]) == "a" and requested_model([]) is None
    assert requested_model(item()) is None
    with pytest.raises(ValueError, match=r"model: the items of one request name different models \(None, a\)"):
        requested_model([item("a"), item()])


class _Runs:
    """What the recording backends saw: ("start" | "end", model directory name, sequences), in order."""

    log: list = []
    running = most = 0
    lock = None
    started = release = None  # the first run of the blocked directory signals, then waits for the test


def recording_backend(spec, settings):
    """The torch backend, recording each run; the first run of the directory named "topic" waits for the test."""
    from runtime.backends.torch_backend import TorchBackend

    class Recording(TorchBackend):
        def run_batch(self, sequences):
            name = self.spec.path.name
            with _Runs.lock:
                first = name == "topic" and not _Runs.started.is_set()
                _Runs.log.append(("start", name, len(sequences)))
                _Runs.running += 1
                _Runs.most = max(_Runs.most, _Runs.running)
            if first:
                _Runs.started.set()
                _Runs.release.wait(30)
            try:
                return super().run_batch(sequences)
            finally:
                with _Runs.lock:
                    _Runs.running -= 1
                    _Runs.log.append(("end", name, len(sequences)))

    return Recording(spec, settings)


def test_a_quiet_models_request_runs_before_the_busy_models_backlog(checkpoints):
    """With one slot on the device, a request to a quiet model that arrives while a busy model runs a batch and has
    more queued runs next (not after the backlog, not beside the running batch on the same cores), and the busy
    model's batches stay small while the quiet model is active."""
    import asyncio
    import threading

    from bert.tasks import TASKS
    from serving.batcher import Ticket
    from serving.engine import Engine, Timing
    from serving.metrics import Metrics
    from serving.settings import Settings

    _Runs.log, _Runs.running, _Runs.most = [], 0, 0
    _Runs.lock, _Runs.started, _Runs.release = threading.Lock(), threading.Event(), threading.Event()
    settings = Settings(
        classify_model=[f"busy={checkpoints['topic']}", f"quiet={checkpoints['toxicity']}"],
        backend="test_serving_multimodel:recording_backend",
        threads=1,
        inference_workers=1,
        max_batch_requests=8,
        max_padding=1.0,  # batches of any lengths: only the budgets bound them
    )
    engine = Engine(settings, Metrics())
    engine.load()
    engine.gate.linger_s = 3600.0  # the quiet model counts as active for the rest of the test, however slow it runs
    busy_texts = [text for text in TEXTS for _ in range(2)]

    def ask(model: str, text: str):
        return engine.infer(
            engine.unit("classify", model), TASKS["classify"], [text], {}, ticket=Ticket(), timing=Timing()
        )

    async def until(condition):
        for _ in range(3000):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out waiting")

    async def scenario():
        engine.start()
        try:
            busy = [asyncio.ensure_future(ask("busy", text)) for text in busy_texts]
            await until(_Runs.started.is_set)  # the busy model's first batch runs (and waits); the rest is queued
            first = _Runs.log[0][2]
            await until(lambda: len(engine.models["classify"]["busy"].batcher.queue) == len(busy_texts) - first)
            quiet = asyncio.ensure_future(ask("quiet", TEXTS[0]))
            # the quiet model's worker waits for the one slot (or, were there no gate, runs at once)
            await until(lambda: engine.gate.waiting() == 1 or any(name == "toxicity" for _, name, _ in _Runs.log))
            _Runs.release.set()
            return await asyncio.gather(*busy), await quiet
        finally:
            _Runs.release.set()
            await engine.stop()

    busy_answers, quiet_answer = asyncio.run(scenario())
    assert len(busy_answers) == len(busy_texts) and len(quiet_answer) == 1
    starts = [(name, n) for event, name, n in _Runs.log if event == "start"]
    assert _Runs.most == 1, _Runs.log  # one batch at a time on the one slot, whichever model
    assert starts[0][0] == "topic" and starts[1] == ("toxicity", 1), starts  # quiet next, before the busy backlog
    after = [n for name, n in starts[2:] if name == "topic"]
    assert sum(after) == len(busy_texts) - starts[0][1] and max(after) == 2, starts  # contended: small batches


def test_a_free_slot_goes_to_the_model_served_least_recently():
    import threading

    from serving.batcher import ComputeGate

    gate = ComputeGate(1)
    a, b, backend = object(), object(), object()
    order: list[str] = []

    def run(owner, name):
        assert gate.acquire(owner, backend, lambda: False)
        order.append(name)
        gate.release(owner, backend)

    assert gate.acquire(a, backend, lambda: False)  # a runs
    threads = [threading.Thread(target=run, args=(a, "a")), threading.Thread(target=run, args=(b, "b"))]
    threads[0].start()  # a asks again first...
    while gate.waiting() < 1:
        threading.Event().wait(0.001)
    threads[1].start()  # ...then b, which has not run yet
    while gate.waiting() < 2:
        threading.Event().wait(0.001)
    gate.release(a, backend)
    for thread in threads:
        thread.join(10)
    assert order == ["b", "a"]
    assert gate.contended(a) and gate.contended(b)  # each ran within linger_s of now


def test_while_another_model_wants_the_device_a_loaded_one_leaves_it_a_slot():
    """Two slots: alone, a model holds both; while another has run within linger_s, it holds one and waits for a
    second, and the other's batch takes the free slot at once instead of waiting for one of the loaded model's."""
    import threading

    from serving.batcher import ComputeGate

    gate = ComputeGate(2, linger_s=60)
    busy, quiet, backend = object(), object(), object()
    assert gate.acquire(busy, backend, lambda: False) and gate.acquire(busy, backend, lambda: False)  # alone: both
    assert not gate.small_batches(busy)
    gate.release(busy, backend)
    gate.release(busy, backend)
    assert gate.acquire(quiet, backend, lambda: False)
    gate.release(quiet, backend)  # the quiet model ran: it wants the device for linger_s
    assert gate.acquire(busy, backend, lambda: False)
    stop, second = threading.Event(), []
    waiter = threading.Thread(target=lambda: second.append(gate.acquire(busy, backend, stop.is_set)))
    waiter.start()
    for _ in range(2000):
        if gate.waiting() or not waiter.is_alive():
            break
        threading.Event().wait(0.001)
    waiter.join(0.2)
    assert waiter.is_alive() and not second  # the busy model's second batch waits, a slot stays free...
    took = []
    asker = threading.Thread(target=lambda: took.append(gate.acquire(quiet, backend, stop.is_set)))
    asker.start()
    asker.join(5)
    stop.set() if asker.is_alive() else None
    gate.wake()
    assert took == [True]  # ...and the quiet model's batch takes it at once
    gate.release(quiet, backend)
    gate.release(busy, backend)
    waiter.join(10)
    assert second == [True]  # with a slot of its own free again, the busy model's batch runs
    assert not gate.small_batches(busy)  # two slots: full batches, one kept free instead
    assert ComputeGate(1).small_batches(busy) is False
    one = ComputeGate(1, linger_s=60)
    assert one.acquire(quiet, backend, lambda: False)
    one.release(quiet, backend)
    assert one.small_batches(busy)  # one slot: none can be kept free, so the loaded model's batches are small


def test_a_verify_model_wants_the_device_only_while_its_batch_waits_or_runs():
    """A passing owner (--TASK-verify-model's batcher) does not linger: once its batch ends, the model it verifies
    holds every slot again; while its batch runs, that model holds all but one, as beside any other model."""
    from serving.batcher import ComputeGate

    gate = ComputeGate(2, linger_s=60)
    fast, verify, backend = object(), object(), object()
    gate.passing(verify)
    assert gate.acquire(verify, backend, lambda: False)
    assert gate.contended(fast)  # it runs now
    gate.release(verify, backend)
    assert not gate.contended(fast)  # ended: no linger
    assert gate.acquire(fast, backend, lambda: False) and gate.acquire(fast, backend, lambda: False)  # both slots
    gate.release(fast, backend)
    gate.release(fast, backend)
    other = object()  # an ordinary model lingers as before
    assert gate.acquire(other, backend, lambda: False)
    gate.release(other, backend)
    assert gate.contended(fast)
