"""`python -m serving`: run the bertserve HTTP server (uvicorn).

Every setting is a flag and an env var (BERTSERVE_<NAME>); flags win. With no model given it serves
the built-in demo model (serving/demo_model/). On SIGTERM/SIGINT it stops admitting requests (503),
answers every admitted one, then exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import typing

import uvicorn
from pydantic import ValidationError

from serving.settings import Settings

log = logging.getLogger("bertserve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving",
        description="Serve BERT classify / ner / qa models over HTTP with dynamic batching. "
                    "Each flag can also be set with the env var shown; flags win.",
)
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        annotation = field.annotation
        choices = None
        for arg in (annotation, *typing.get_args(annotation)):
            if typing.get_origin(arg) is typing.Literal:
                choices = list(typing.get_args(arg))
        default = field.default
        help_text = f"{field.description} [env BERTSERVE_{name.upper()}]"
        if default is not None:
            help_text += f" (default: {default})"
        parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, choices=choices, help=help_text,
                            metavar=None if choices else name.upper())
    return parser


class GracefulServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains: new requests get 503, admitted ones finish,
    then the server stops (and the process exits 0). A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, app, timeout_s: float):
        super().__init__(config)
        self.app_state = app.state.server
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self._draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        self.app_state.draining = True
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))

    async def _drain(self) -> None:
        from serving.middleware import wait_for_idle

        log.info("shutting down: answering %d admitted requests first", self.app_state.in_flight)
        idle = await wait_for_idle(self.app_state, self.timeout_s)
        if not idle:
            log.warning("shutdown timeout: %d requests still running", self.app_state.in_flight)
        self.should_exit = True


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings(**vars(args))
    except ValidationError as e:
        for error in e.errors():
            where = ".".join(str(x) for x in error["loc"]) or "settings"
            print(f"error: --{where.replace('_', '-')}: {error['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from serving.app import create_app
    from serving.backends.base import ModelError
    from serving.engine import Engine
    from serving.metrics import Metrics

    engine = Engine(settings, Metrics())
    try:  # load before uvicorn starts, so a bad model is one clear line and exit 2, not a traceback
        engine.load()
    except (ModelError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - e.g. a checkpoint whose weights do not fit its config
        print(f"error: cannot load the model: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    app = create_app(settings, engine=engine)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=max(1, int(settings.shutdown_timeout_s)), access_log=False)
    server = GracefulServer(config, app, settings.shutdown_timeout_s)
    server.run()
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
