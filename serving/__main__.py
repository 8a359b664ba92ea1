"""`python -m serving`: run the bertserve HTTP server (uvicorn).

Every setting is a flag and an env var (BERTSERVE_<NAME>); flags win. With no model given it serves
the built-in demo model (serving/demo_model/). It takes its port before loading the model (a busy port:
one line, exit 2); while it loads, /health answers and /ready is 503. On SIGTERM/SIGINT /ready turns 503
while requests are still served for --drain-delay-s (load balancers take the replica out), then it stops
admitting requests (503), answers every admitted one (those still running after --shutdown-timeout-s get a
JSON 503), then exits 0; a second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import warnings

import uvicorn
from pydantic import ValidationError

from bert import options
from bert.tasks import registry
from serving.settings import Settings

log = logging.getLogger("bertserve")


def _hint(message: str) -> str:
    if "-model" in message:  # e.g. --nope-model: a --TASK-model flag exists for each task
        message += f" (a --TASK-model flag is there for each task: {', '.join(registry.names())})"
    return message


def build_parser() -> argparse.ArgumentParser:
    """The server's flags: one per Settings field, help from its description (bert/options.py, as every command)."""
    return options.build_parser(
        Settings,
        prog="python -m serving",
        hint=_hint,
        description=f"Serve BERT models' tasks ({', '.join(registry.names())}) over HTTP with dynamic batching. "
        "Each flag can also be set with the env var shown; flags win.",
    )


class GracefulServer(uvicorn.Server):
    """uvicorn, with a shutdown that is right under every orchestrator.

    First SIGTERM/SIGINT: /ready turns 503 while requests are still served for `drain_delay_s`, then stop
    admitting (new requests get a JSON 503), give admitted requests up to `timeout_s` to finish, answer any
    still running with a JSON 503, then stop: exit 0 within about drain_delay_s + timeout_s + 2 s. A second
    signal: every admitted request gets its JSON 503 at once and the process exits within a second (exit
    128 + signal). A model that fails warm-up stops the server (exit 2).
    """

    def __init__(self, config: uvicorn.Config, app, timeout_s: float, drain_delay_s: float = 0.0):
        super().__init__(config)
        self.app_state = app.state.server
        self.timeout_s = timeout_s
        self.drain_delay_s = drain_delay_s
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0
        self.app_state.on_fatal = self._fatal

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        # Not uvicorn's handler: it re-raises the signal after shutdown (exit 143, not 0), and its second
        # SIGTERM waits for connections all over again.
        self._signals += 1
        if self._loop is None:
            self.should_exit = True
        elif self._signals == 1:
            if self.drain_delay_s > 0:
                self.app_state.leaving = True
            else:
                self.app_state.draining = True
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))
        else:
            self.exit_code = 128 + sig
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._abort(grace_s=0.5)))

    async def _drain(self) -> None:
        if self.drain_delay_s > 0:
            # Load balancers see /ready fail and stop sending here; whatever they send until then is served.
            log.info("shutting down: not ready, still serving for %gs (drain delay)", self.drain_delay_s)
            await asyncio.sleep(self.drain_delay_s)
            self.app_state.draining = True
        log.info(
            "shutting down: answering %d admitted requests first (at most %gs)",
            self.app_state.in_flight,
            self.timeout_s,
        )
        from serving.middleware import wait_for_idle  # imported with the app by now

        if not await wait_for_idle(self.app_state, self.timeout_s):
            log.warning(
                "shutdown timeout (%gs): %d requests unfinished get a 503", self.timeout_s, self.app_state.in_flight
            )
            await self._abort(grace_s=1.0)
        self.should_exit = True

    async def _abort(self, grace_s: float) -> None:
        """Answer every admitted request with a JSON 503 now, give the answers `grace_s` to be written, stop."""
        from serving.middleware import wait_for_idle

        self.app_state.abort()
        await wait_for_idle(self.app_state, grace_s)
        self.should_exit = True
        if self.exit_code:
            self.force_exit = True  # second signal: no more waiting for connections or the lifespan

    def _fatal(self, reason: str) -> None:
        from bert.errors import one_line

        print(f"error: {one_line(reason)}", file=sys.stderr, flush=True)
        self.exit_code = 2
        self.should_exit = True


GC_YOUNG_THRESHOLD = 5000


def main(argv: list[str] | None = None) -> int:
    values = options.read(Settings, argv, parser=build_parser())
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", FutureWarning)
            settings = Settings(**{name: v for name, v in values.items() if values.sources[name] != "default"})
        for w in warned:  # a deprecated setting: one line, before any work
            print(f"warning: {w.message}", file=sys.stderr)
    except ValidationError as e:
        for error in e.errors():
            name = ".".join(str(x) for x in error["loc"])
            where = values.sources.get(name, "--" + name.replace("_", "-")) if name else "settings"
            message = str(error["msg"]).removeprefix("Value error, ")
            print(f"error: {where}: {message}", file=sys.stderr)
        return 2
    if settings.otlp_endpoint:
        from serving.tracing import missing

        problem = missing()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    from serving.logs import configure as configure_logs
    from serving.startup import LoadingResponder, PortError, is_loopback, listen

    log_config = configure_logs(settings.log_level, settings.log_format)
    try:  # the port first: a busy one is one line at once, not after loading and warming the model
        sock = listen(settings.host, settings.port)
    except PortError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    loading = LoadingResponder(sock)  # /health 200, /ready and the rest 503 "loading" meanwhile
    engine = _load(settings)
    loading.stop()
    if engine is None:
        sock.close()
        return 2
    log.info("listening on http://%s:%d", settings.host, sock.getsockname()[1])  # uvicorn's line needs its own bind
    if not settings.api_key and not is_loopback(settings.host):
        log.warning(
            "listening on %s with no API key: anyone who reaches this address can use the model "
            "(set BERTSERVE_API_KEY, or keep the port on a private network)",
            settings.host,
        )
    from serving.app import create_app
    from serving.protocol import http_protocol

    app = create_app(settings, engine=engine)
    # What is left after the drain (responses being written, idle keep-alive connections) gets 2 s more.
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        http=http_protocol(settings.header_timeout_s),
        timeout_graceful_shutdown=2,
        access_log=False,
        log_config=log_config,
    )
    server = GracefulServer(config, app, settings.shutdown_timeout_s, settings.drain_delay_s)
    # The garbage collector's youngest generation is collected every 700 new objects by default, and each pass
    # walks the live objects of every request in flight again: every GC_YOUNG_THRESHOLD instead (docs/serving.md,
    # "Why it is built this way"). Reference counting still frees everything that is not a cycle at once.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    server.run(sockets=[sock])
    return server.exit_code if server.started else 3


def _load(settings: Settings):
    """The engine, loaded; or None after one clear `error:` line (a bad model, never a traceback)."""
    from bert.errors import one_line
    from runtime.backends.base import ModelError
    from serving.engine import Engine
    from serving.metrics import Metrics

    engine = Engine(settings, Metrics())
    try:
        engine.load()
    except (ModelError, OSError, ValueError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return None
    except Exception as e:  # noqa: BLE001 - e.g. a checkpoint whose weights do not fit its config
        print(f"error: cannot load the model: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        return None
    return engine


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown. Tearing down torch, onnxruntime and the inference threads
    takes seconds after the server has already stopped (docs/serving.md, "Why it is built this way"): time
    that counts against an orchestrator's grace period, and against "a second signal exits at once".
    Nothing is left to flush but the logs and stdio; a batch still running in a thread has nobody waiting
    for it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
