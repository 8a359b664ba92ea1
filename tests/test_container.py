"""The CPU image, built from the Dockerfile and run in a real Docker engine with no arguments: healthy,
non-root with a matching group, no torch inside, the README's examples answered by the built-in demo model,
/docs offline, the health check following a `--port` flag, one clear line for a wrong model, and a stop
under load (32 long requests in flight, `docker stop -t 45`) that loses no request and exits 0.

Skips, saying why, where no Docker engine answers or the base image is absent and cannot be pulled.
The build may use the cache. Environment (all optional):
  BERTSERVE_DOCKER             the docker CLI (default: docker on PATH)
  BERTSERVE_TEST_IMAGE         the tag to build and test (default: bertserve:cpu-test)
  BERTSERVE_DOCKER_CONTEXT     the checkout to build (default: this one), e.g. a `git archive HEAD` of a tree
                               that others are editing
  BERTSERVE_DOCKER_BUILD_ARGS  more `docker build` arguments, e.g. "--build-arg PIP_INDEX_URL=https://mirror/simple"
  BERTSERVE_DOCKER_WHEELS      a directory holding the CPU torch wheel, served to the build over HTTP on
                               127.0.0.1 (`--network host`), for machines that cannot reach PyTorch's CPU index
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="pip install httpx")

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
DOCKER = os.environ.get("BERTSERVE_DOCKER", "docker")
IMAGE = os.environ.get("BERTSERVE_TEST_IMAGE", "bertserve:cpu-test")
UID = "10001"
STOP_TIMEOUT_S = 45  # the documented `docker run --stop-timeout`
DRAIN_DELAY_S = 5  # the server's default --drain-delay-s (serving/settings.py)
PYTHON_IMAGE = re.search(r"^ARG PYTHON_IMAGE=(\S+)", (REPO / "Dockerfile").read_text(), re.M).group(1)


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


def _skip_reason() -> str | None:
    if shutil.which(DOCKER) is None:
        return f"no Docker CLI ({DOCKER!r} not on PATH)"
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "no Docker engine answers (`docker info` timed out)"
    if info.returncode != 0:
        return f"no Docker engine answers (`docker info`: {info.stderr.strip().splitlines()[-1:]})"
    given = re.search(r"PYTHON_IMAGE=(\S+)", os.environ.get("BERTSERVE_DOCKER_BUILD_ARGS", ""))
    base = given.group(1) if given else PYTHON_IMAGE
    if docker("image", "inspect", base, check=False).returncode != 0:
        pulled = docker("pull", base, timeout=600, check=False)
        if pulled.returncode != 0:
            return (
                f"base image {base} is absent and cannot be pulled ({pulled.stderr.strip()[-200:]}); "
                "without a registry, build a stand-in: ../shared/tools/docker-python-base.sh"
            )
    return _torch_source_problem()


def _torch_source_problem() -> str | None:
    """The demo stage needs CPU torch: from BERTSERVE_DOCKER_WHEELS, a TORCH_PIP_ARGS build argument, or the
    Dockerfile's default index, which must then answer from here."""
    given = os.environ.get("BERTSERVE_DOCKER_BUILD_ARGS", "")
    if os.environ.get("BERTSERVE_DOCKER_WHEELS") or "TORCH_PIP_ARGS" in given:
        return None
    url = re.search(r'^ARG TORCH_PIP_ARGS="--index-url (\S+)"', (REPO / "Dockerfile").read_text(), re.M).group(1)
    try:
        urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/torch/", method="HEAD"), timeout=15)
    except (OSError, ValueError) as error:
        return (
            f"the demo stage cannot get torch: {url} does not answer ({error}); set BERTSERVE_DOCKER_WHEELS to a "
            "directory holding the CPU torch wheel, or pass --build-arg TORCH_PIP_ARGS=... in "
            "BERTSERVE_DOCKER_BUILD_ARGS"
        )
    return None


class _Wheels:
    """Serves a wheel directory on 127.0.0.1 for the build's pip (`--find-links`)."""

    PORT = 18765  # fixed: the URL is a build argument, and a new one would miss the build cache

    def __init__(self, directory: str):
        handler = functools.partial(_QuietHandler, directory=directory)
        try:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.PORT), handler)
        except OSError:  # taken: any port works, the demo stage is just rebuilt
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    args = shlex.split(os.environ.get("BERTSERVE_DOCKER_BUILD_ARGS", ""))
    wheels = _Wheels(os.environ["BERTSERVE_DOCKER_WHEELS"]) if os.environ.get("BERTSERVE_DOCKER_WHEELS") else None
    if wheels:
        args += ["--network", "host", "--build-arg", f"TORCH_PIP_ARGS=--find-links {wheels.url}"]
    started = time.monotonic()
    try:
        context = os.environ.get("BERTSERVE_DOCKER_CONTEXT", str(REPO))
        build = docker("build", "--target", "cpu", "-t", IMAGE, *args, context, timeout=3600, check=False)
    finally:
        if wheels:
            wheels.close()
    assert build.returncode == 0, f"docker build failed:\n{(build.stdout + build.stderr)[-5000:]}"
    size = docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip()
    print(f"\nbuilt {IMAGE} in {time.monotonic() - started:.0f} s (cache allowed), {int(size) / 1e6:.0f} MB")
    return IMAGE


class Container:
    def __init__(self, image: str, *args: str, port: int = 8000, stop_timeout: int = STOP_TIMEOUT_S):
        self.name = f"bertserve-test-{uuid.uuid4().hex[:8]}"
        docker(
            "run",
            "-d",
            "--name",
            self.name,
            "-p",
            f"127.0.0.1::{port}",
            "--stop-timeout",
            str(stop_timeout),
            image,
            *args,
        )
        mapping = docker("port", self.name, f"{port}/tcp").stdout.split()[0]
        self.url = "http://" + mapping.replace("0.0.0.0", "127.0.0.1")
        self.ready_after = self.healthy_after = None

    def state(self) -> dict:
        return json.loads(docker("inspect", "--format", "{{json .State}}", self.name).stdout)

    def wait_healthy(self, timeout: float = 240) -> None:
        """Polls /ready and Docker's health status, recording when each turned good."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            state = self.state()
            if not state["Running"]:
                raise AssertionError(f"container exited {state['ExitCode']}: {self.logs()[-3000:]}")
            if self.ready_after is None:
                try:
                    if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                        self.ready_after = time.monotonic() - started
                except httpx.HTTPError:
                    pass
            if state.get("Health", {}).get("Status") == "healthy":
                self.healthy_after = time.monotonic() - started
                if self.ready_after is not None:
                    return
            time.sleep(0.25)
        raise AssertionError(f"not healthy within {timeout} s: {self.state().get('Health')}\n{self.logs()[-3000:]}")

    def exec(self, *command: str) -> subprocess.CompletedProcess:
        return docker("exec", self.name, *command, check=False)

    def logs(self) -> str:
        result = docker("logs", self.name, check=False)
        return result.stdout + result.stderr

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


@pytest.fixture(scope="module")
def server(image):
    container = Container(image)  # no arguments: the built-in demo model
    try:
        container.wait_healthy()
        yield container
    finally:
        print(container.logs()[-2000:])
        container.remove()


def test_runs_as_uid_10001_with_its_own_group(server, image):
    assert docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == f"{UID}:{UID}"
    ids = server.exec("sh", "-c", "id -u; id -g; id -gn; stat -c %u:%g /cache")
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.split() == [UID, UID, "bertserve", f"{UID}:{UID}"]


def test_image_has_no_torch(server):
    result = server.exec("python3", "-c", "import torch")
    assert result.returncode != 0 and "No module named 'torch'" in result.stderr
    assert server.exec("python3", "-c", "import onnxruntime, serving").returncode == 0


def test_healthy_follows_readiness_promptly(server):
    # HEALTHCHECK every 5 s: Docker's "healthy" trails /ready by at most one interval plus the check.
    assert server.ready_after is not None and server.healthy_after is not None
    print(f"\n/ready 200 after {server.ready_after:.1f} s, Docker healthy after {server.healthy_after:.1f} s")
    assert server.healthy_after - server.ready_after <= 8, (server.ready_after, server.healthy_after)


def test_readme_examples_answered_by_the_demo_model(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    info = client.get("/info").json()
    assert info["backend"] == "onnxruntime" and info["tasks"] == ["classify", "ner", "qa", "embed"]
    # curl -s localhost:8000/embed -d '{"inputs": "What is the capital of France?"}'
    (vector,) = client.post("/embed", content=b'{"inputs": "What is the capital of France?"}').json()
    assert len(vector) == 384 and abs(sum(x * x for x in vector) - 1) < 1e-4
    openai = client.post("/v1/embeddings", json={"input": ["a", "b"], "model": "demo"}).json()
    assert [d["index"] for d in openai["data"]] == [0, 1] and openai["usage"]["prompt_tokens"] > 0
    # curl -s localhost:8000/classify -d '{"inputs": "I loved this film."}'  (a body without content type)
    (label,) = client.post("/classify", content=b'{"inputs": "I loved this film."}').json()
    assert label["label"] == "positive" and label["score"] > 0.9
    great, pair = client.post(
        "/classify", json={"inputs": ["great", ["A man eats.", "Someone eats."]], "top_k": None}
    ).json()
    assert great[0]["label"] == "positive" and len(great) == len(pair) == 2
    entities = client.post(
        "/ner", json={"inputs": "My name is Wolfgang and I live in Berlin.", "aggregation": "simple"}
    ).json()
    assert [(e["entity_group"], e["word"]) for e in entities] == [("PER", "Wolfgang"), ("LOC", "Berlin")]
    answer = client.post(
        "/qa", json={"question": "Where do I live?", "context": "My name is Wolfgang and I live in Berlin."}
    ).json()
    assert answer["answer"] == "Berlin" and (answer["start"], answer["end"]) == (34, 40)
    # The SDK examples' sentences.
    (merkel,) = client.post("/ner", json={"inputs": ["Angela Merkel met Emmanuel Macron in Paris."]}).json()
    assert {(e["entity_group"], e["word"].lower()) for e in merkel} == {
        ("PER", "angela merkel"),
        ("PER", "emmanuel macron"),
        ("LOC", "paris"),
    }
    context = (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
        "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
    )
    assert (
        client.post("/qa", json={"question": "Who is the tower named after?", "context": context}).json()["answer"]
        == "Gustave Eiffel"
    )
    (negative,) = client.post("/classify", json={"inputs": "a dull, lifeless script"}).json()
    assert negative["label"] == "negative"


def test_docs_work_offline_and_root_leads_there(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "docs"
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        assert not re.search(r"(https?:)?//[A-Za-z0-9]", html.replace("window.location.origin", "")), html
        for asset in re.findall(r'(?:src|href)="(docs/assets/[^"]+)"', html):
            assert client.get("/" + asset).status_code == 200, asset
    assert "swagger-ui-bundle.js" in client.get("/docs").text


def test_healthcheck_follows_a_port_flag(image):
    container = Container(image, "--port", "9000", port=9000)  # BERTSERVE_PORT stays 8000
    try:
        container.wait_healthy(timeout=180)
    finally:
        container.remove()


def test_wrong_model_is_one_line_and_exit_2(image):
    result = docker("run", "--rm", "-e", "BERTSERVE_MODEL=/models/missing", image, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and "/models/missing" in errors[0], result.stderr


def _long_qa_body() -> dict:
    filler = (
        "The server admits a bounded number of requests, tokenises each off the event loop and queues it; one "
        "owner task builds batches up to the token budget and the request cap, grouping similar lengths. "
    )
    return {
        "question": "Where do I live?",
        "context": filler * 12 + "My name is Wolfgang and I live in Berlin. " + filler * 12,
    }


def test_stop_under_load_loses_no_request(image):
    """32 long requests in flight, then `docker stop -t 45`: each gets its answer (or, past the server's
    shutdown deadline, a JSON 503), a request arriving during the drain delay its answer, one arriving after
    it (during the drain) a JSON 503, and the exit code is 0."""
    container = Container(image)
    try:
        container.wait_healthy()
        body = _long_qa_body()
        results: list = [None] * 32

        def send(i: int) -> None:
            try:
                results[i] = httpx.post(container.url + "/qa", json=body, timeout=120)
            except httpx.HTTPError as error:  # a lost request: reset, refused, timed out
                results[i] = error

        threads = [threading.Thread(target=send, args=(i,)) for i in range(32)]
        for thread in threads:
            thread.start()
        time.sleep(1)  # all 32 admitted and queued before the stop
        in_flight = sum(r is None for r in results)
        stop_started = time.monotonic()
        stopper = threading.Thread(
            target=docker,
            args=("stop", "-t", str(STOP_TIMEOUT_S), container.name),
            kwargs={"timeout": STOP_TIMEOUT_S + 30},
        )
        stopper.start()
        time.sleep(0.5)
        early = httpx.post(
            container.url + "/qa", json={"question": "Where?", "context": "He lives in Berlin."}, timeout=60
        )  # in the drain delay: still served
        time.sleep(max(0.0, DRAIN_DELAY_S + 0.5 - (time.monotonic() - stop_started)))
        late = None
        if any(r is None for r in results):  # still draining: a newcomer is refused, in JSON
            try:
                late = httpx.post(container.url + "/qa", json=body, timeout=30)
            except httpx.HTTPError as error:
                late = error
        stopper.join()
        stopped_in = time.monotonic() - stop_started
        for thread in threads:
            thread.join(timeout=60)
        state = container.state()
        logs = container.logs()
    finally:
        container.remove()

    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results]
    print(
        f"\n{in_flight} of 32 in flight at `docker stop`; stopped in {stopped_in:.1f} s; exit {state['ExitCode']}; "
        f"answers {dict(sorted(Counter(map(str, statuses)).items()))}; late request: "
        f"{late.status_code if isinstance(late, httpx.Response) else late!r}"
    )
    assert in_flight >= 24, f"the load finished too soon to test a drain ({in_flight} in flight)"
    assert early.status_code == 200 and early.json()["answer"] == "Berlin", early.text
    for r in results:
        assert isinstance(r, httpx.Response), f"lost request: {r!r}\n{logs[-3000:]}"
        if r.status_code == 200:
            assert r.json()["answer"] == "Berlin"
        else:
            assert r.status_code == 503 and r.json()["error_type"] == "unavailable", r.text
    if late is not None:
        assert isinstance(late, httpx.Response) and late.status_code == 503, late
        assert set(late.json()) == {"error", "error_type"}
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, logs[-3000:])
    assert stopped_in < STOP_TIMEOUT_S, "Docker had to kill it"
