"""The fleet (deploy/fleet): three replicas of the CPU image behind haproxy lose no request while one replica is
SIGKILLed and restarted and the other two are restarted one after the other with `docker stop` / `docker start`.

Two runs of 16 closed-loop clients on /classify, /qa and /embed, each at least 60 s and until the restarts are
over:
  plain   plain HTTP clients (httpx, no retries) through the shipped load balancer (haproxy.cfg: health checks on
          /ready and retries on another replica): every request must get its 200 and a well-formed answer;
  sdk     our SDK (clients/, its default retries) through a balancer without retries (the same haproxy.cfg with
          its retry lines taken out: health checks only): no call may raise.

Skips, saying why, where no Docker engine answers or the base image is absent (see tests/test_container.py,
whose image build it shares: BERTSERVE_DOCKER_WHEELS, BERTSERVE_DOCKER_BUILD_ARGS, BERTSERVE_DOCKER_CONTEXT).
More environment (optional):
  BERTSERVE_COMPOSE      the Compose command (default: `docker compose` where it answers, else `docker-compose`)
  BERTSERVE_LB_IMAGE     a haproxy image to use instead of building deploy/fleet/haproxy.Dockerfile
  BERTSERVE_FLEET_SECONDS  the least duration of each run (default 60)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from test_container import DOCKER, PYTHON_IMAGE, _skip_reason, docker, image  # noqa: F401 - image is a fixture
from test_serving_support import free_port

httpx = pytest.importorskip("httpx", reason="pip install httpx")

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
FLEET = REPO / "deploy" / "fleet"
CLIENTS = 16
SECONDS = float(os.environ.get("BERTSERVE_FLEET_SECONDS", "60"))
REPLICAS = ("bertserve-1", "bertserve-2", "bertserve-3")

CONTEXT = (
    "The Amazon rainforest covers much of the Amazon basin of South America. The basin covers seven million "
    "square kilometres, of which five and a half million are covered by the rainforest. The region includes "
    "territory belonging to nine nations; the majority of the forest lies within Brazil."
)
QUESTIONS = (
    "How much of the basin is covered by the rainforest?",
    "Where does most of the forest lie?",
    "How many nations does the region include?",
)
TEXTS = (
    "a thoroughly enjoyable film with a clever script",
    "dull, slow and far too long",
    "the actors do what they can with a thin story",
    "one of the best films of the year",
)


def _compose_command() -> list[str]:
    if os.environ.get("BERTSERVE_COMPOSE"):
        return shlex.split(os.environ["BERTSERVE_COMPOSE"])
    for command in ([DOCKER, "compose"], ["docker-compose"]):
        try:
            if subprocess.run([*command, "version"], capture_output=True, timeout=30).returncode == 0:
                return command
        except (OSError, subprocess.TimeoutExpired):
            continue
    pytest.skip("no Docker Compose (`docker compose` or `docker-compose`; Debian: apt-get install docker-compose)")


@pytest.fixture(scope="module")
def lb_image():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if os.environ.get("BERTSERVE_LB_IMAGE"):
        return os.environ["BERTSERVE_LB_IMAGE"]
    given = re.search(r"PYTHON_IMAGE=(\S+)", os.environ.get("BERTSERVE_DOCKER_BUILD_ARGS", ""))
    tag = "bertserve-lb:test"
    docker(
        "build",
        "-t",
        tag,
        "-f",
        str(FLEET / "haproxy.Dockerfile"),
        "--build-arg",
        f"BASE_IMAGE={given.group(1) if given else PYTHON_IMAGE}",
        str(FLEET),
        timeout=900,
    )
    return tag


def without_retries(config: str) -> str:
    """haproxy.cfg with health checks only: no retry of a request, on any replica."""
    kept = [line for line in config.splitlines() if not re.match(r"\s*(retry-on|option redispatch|retries)\b", line)]
    return "\n".join(kept) + "\n"


def test_without_retries_takes_out_every_retry():
    shipped = (FLEET / "haproxy.cfg").read_text()
    assert re.search(r"^\s+retry-on conn-failure empty-response .*\b502 503 504\b", shipped, re.M)
    assert re.search(r"^\s+option redispatch\b", shipped, re.M) and re.search(r"^\s+retries [1-9]", shipped, re.M)
    # what makes the retries work: the whole request held (haproxy retries nothing else), and no kept-alive
    # connection to a replica (a dead one's would close the client's connection instead of a retry)
    assert re.search(r"^\s+option http-buffer-request\b", shipped, re.M)
    assert re.search(r"^\s+option http-server-close\b", shipped, re.M)
    stripped = without_retries(shipped)
    assert not re.search(r"^\s*(retry-on|retries|option redispatch)\b", stripped, re.M)
    assert "option httpchk GET /ready" in stripped


class Fleet:
    """`docker compose up` of deploy/fleet under a project name of its own; down (with volumes) at the end."""

    def __init__(self, server_image: str, lb_image: str, lb_config: Path):
        self.compose = _compose_command()
        self.project = f"bsfleet{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("BERTSERVE_")},
            "BERTSERVE_IMAGE": server_image,
            "BERTSERVE_LB_IMAGE": lb_image,
            "BERTSERVE_LB_CONFIG": str(lb_config),
            "BERTSERVE_FLEET_PORT": str(self.port),
        }
        self.url = f"http://127.0.0.1:{self.port}"

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [*self.compose, "-p", self.project, "-f", str(FLEET / "docker-compose.yml"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )
        assert result.returncode == 0, f"compose {' '.join(args)}: {result.stderr[-3000:]}"
        return result

    def up(self) -> None:
        self.run("up", "-d", "--no-build")
        for name in REPLICAS:
            self.wait_ready(name, timeout=240)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the balancer has every replica up (rise 2 x 1 s)
            served = Counter()
            for _ in range(12):
                try:
                    served[httpx.get(self.url + "/ready", timeout=5).headers.get("x-served-by")] += 1
                except httpx.HTTPError:
                    pass
            if set(served) == set(REPLICAS):
                return
            time.sleep(0.5)
        raise AssertionError(f"the balancer does not reach every replica: {served}\n{self.logs()}")

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def address(self, service: str) -> str | None:
        networks = json.loads(
            docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", self.container(service)).stdout
        )
        return next((n["IPAddress"] for n in networks.values() if n.get("IPAddress")), None)

    def wait_ready(self, service: str, timeout: float = 120) -> float:
        """Polls the replica's own /ready on its address in the fleet's network; seconds until 200."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            address = self.address(service)
            if address:
                try:
                    if httpx.get(f"http://{address}:8000/ready", timeout=2).status_code == 200:
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise AssertionError(f"{service} not ready within {timeout} s\n{self.logs()}")

    def logs(self) -> str:
        result = subprocess.run(
            [
                *self.compose,
                "-p",
                self.project,
                "-f",
                str(FLEET / "docker-compose.yml"),
                "logs",
                "--no-color",
                "--tail",
                "40",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        )
        return result.stdout[-6000:]

    def down(self) -> None:
        subprocess.run(
            [
                *self.compose,
                "-p",
                self.project,
                "-f",
                str(FLEET / "docker-compose.yml"),
                "down",
                "-v",
                "--timeout",
                "5",
            ],
            capture_output=True,
            timeout=300,
            env=self.env,
        )


def restarts(fleet: Fleet, log: list[str]) -> None:
    """One replica SIGKILLed and started again, then a rolling stop/start of the other two, each after the
    one before is serving again (and the balancer has seen it: 2 good checks a second apart)."""

    def note(what: str) -> None:
        log.append(f"{time.monotonic() - started:5.1f}s {what}")

    started = time.monotonic()
    time.sleep(5)
    first, *rest = REPLICAS
    docker("kill", "--signal", "KILL", fleet.container(first))
    note(f"SIGKILL {first}")
    time.sleep(1)
    docker("start", fleet.container(first))
    note(f"started {first}; ready after {fleet.wait_ready(first):.1f} s")
    time.sleep(3)
    for name in rest:
        docker("stop", fleet.container(name), timeout=120)  # the container's stop timeout: stop_grace_period
        note(f"stopped {name}")
        docker("start", fleet.container(name))
        note(f"started {name}; ready after {fleet.wait_ready(name):.1f} s")
        time.sleep(3)
    note("restarts done")


def check_answer(route: str, body) -> None:
    if route == "/classify":
        assert isinstance(body, list) and {"label", "score"} <= body[0].keys()
    elif route == "/qa":
        assert {"answer", "score", "start", "end"} <= body.keys()
    else:
        assert isinstance(body, list) and len(body) == 1 and len(body[0]) > 8


FAILED_IDS: list[str] = []  # the request ids of plain requests that got no HTTP answer, for the balancer's log


def plain_client(url: str, index: int, stop: threading.Event, outcomes: Counter, lock: threading.Lock) -> None:
    routes = ("/classify", "/qa", "/embed")
    with httpx.Client(base_url=url, timeout=120) as client:
        n = index
        while not stop.is_set():
            route = routes[n % 3]
            body = (
                {"inputs": TEXTS[n % len(TEXTS)]}
                if route != "/qa"
                else {"question": QUESTIONS[n % len(QUESTIONS)], "context": CONTEXT}
            )
            try:
                response = client.post(route, json=body, headers={"x-request-id": f"plain-{index}-{n}"})
                if response.status_code == 200:
                    check_answer(route, response.json())
                    outcome = "ok"
                else:
                    outcome = f"{route} {response.status_code} {response.text[:120]}"
            except httpx.HTTPError as e:
                outcome = f"{route} {type(e).__name__}: {str(e)[:80]}"
                with lock:
                    FAILED_IDS.append(f"plain-{index}-{n}")
            except (AssertionError, ValueError) as e:
                outcome = f"{route} malformed answer: {e!r}"[:160]
            with lock:
                outcomes[outcome] += 1
            n += 1


def sdk_client(url: str, index: int, stop: threading.Event, outcomes: Counter, lock: threading.Lock) -> None:
    sys.path.insert(0, str(REPO / "clients"))
    from bertserve_client import Client

    with Client(url, timeout=120) as client:  # its default retries
        n = index
        while not stop.is_set():
            kind = n % 3
            try:
                if kind == 0:
                    result = client.classify(TEXTS[n % len(TEXTS)])
                    assert result and result[0].label
                elif kind == 1:
                    result = client.qa(QUESTIONS[n % len(QUESTIONS)], CONTEXT)
                    assert isinstance(result.answer, str)
                else:
                    result = client.embed(TEXTS[n % len(TEXTS)])
                    assert len(result) > 8
                outcome = "ok"
            except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
                outcome = f"{('classify', 'qa', 'embed')[kind]} {type(e).__name__}: {str(e)[:120]}"
            with lock:
                outcomes[outcome] += 1
            n += 1


def run_under_restarts(fleet: Fleet, client) -> tuple[Counter, list[str], float]:
    outcomes, lock, stop = Counter(), threading.Lock(), threading.Event()
    threads = [
        threading.Thread(target=client, args=(fleet.url, i, stop, outcomes, lock), daemon=True) for i in range(CLIENTS)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    log: list[str] = []
    try:
        restarts(fleet, log)
        time.sleep(max(0.0, SECONDS - (time.monotonic() - started)))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)
    return outcomes, log, time.monotonic() - started


@pytest.mark.parametrize("kind", ["plain", "sdk"])
def test_fleet_loses_no_request_while_replicas_restart(kind, image, lb_image, tmp_path):  # noqa: F811
    config = tmp_path / "haproxy.cfg"
    shipped = (FLEET / "haproxy.cfg").read_text()
    config.write_text(shipped if kind == "plain" else without_retries(shipped))
    config.chmod(0o644)
    fleet = Fleet(image, lb_image, config)
    FAILED_IDS.clear()
    try:
        fleet.up()
        outcomes, log, seconds = run_under_restarts(fleet, plain_client if kind == "plain" else sdk_client)
        lb_log = docker("logs", fleet.container("lb"), check=False)
        replica_logs = [docker("logs", fleet.container(name), check=False).stderr for name in REPLICAS]
    finally:
        fleet.down()
    total = sum(outcomes.values())
    failures = {k: v for k, v in outcomes.items() if k != "ok"}
    print(
        f"\nbar 3 ({kind}: {'plain HTTP, shipped balancer' if kind == 'plain' else 'SDK, balancer without retries'})"
        f": {total} requests in {seconds:.0f} s by {CLIENTS} clients, {sum(failures.values())} failed"
        f"{': ' + json.dumps(failures, indent=1) if failures else ''}\n  " + "\n  ".join(log)
    )
    assert log and log[-1].endswith("restarts done"), log
    assert total >= 100, outcomes
    # The balancer's line for each request that got no answer: its termination state says which side closed
    # (none at all: haproxy closed the client's connection before reading the request).
    (tmp_path / "haproxy.log").write_text(lb_log.stdout + lb_log.stderr)
    traced = [line for line in lb_log.stdout.splitlines() if any("{" + i + "}" in line for i in FAILED_IDS)]
    assert not failures, (failures, FAILED_IDS, traced, f"the whole log: {tmp_path / 'haproxy.log'}")
    # The replicas log JSON, one object a line, with the balancer's request ids.
    access = [json.loads(line) for logs in replica_logs for line in logs.splitlines() if line.startswith("{")]
    ids = {r.get("request_id") for r in access if r.get("logger") == "bertserve.access"}
    if kind == "plain":  # the callers' own ids, forwarded
        assert any(i and i.startswith("plain-") for i in ids), sorted(ids, key=str)[:5]
    else:  # none sent: the balancer's
        assert any(i and re.fullmatch(r"[0-9a-f-]{36}", i) for i in ids), sorted(ids, key=str)[:5]
    assert lb_log.returncode == 0
