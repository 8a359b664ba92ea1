"""`create_app(settings)`: the FastAPI app factory (vLLM style). The lifespan loads the engine (unless
one is handed in already loaded), starts its batchers, warms the models up in a thread and only
then reports /ready; shared state lives on `app.state`."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.applications import Starlette

from serving.docs import app_description, install_docs
from serving.engine import Engine, version
from serving.errors import install_error_handlers
from serving.metrics import Metrics
from serving.middleware import RequestMiddleware, ServerState
from serving.routes.api import build_router
from serving.routes.compat import router as compat_routes
from serving.routes.lean import LeanRoutes
from serving.routes.playground import router as playground_router
from serving.routes.schemas import declare_limits
from serving.settings import Settings

log = logging.getLogger("bertserve")


class ServingApp(FastAPI):
    """FastAPI, asking once, when the server has started, whether OpenTelemetry is configured, instead of on
    every request: FastAPI's native telemetry looks the global tracer, meter and logger providers up (three
    environment lookups when none is set) before each request. A provider configured before the server starts
    (by `opentelemetry-instrument`, the OTEL_* environment, or FastAPI's own FASTAPI_OTEL_AUTO_CONFIGURE, which
    acts at startup) is found as before; one configured later, while the server runs, is not seen."""

    _telemetry_off = False  # no provider was configured when the server started: FastAPI's check is skipped

    def check_telemetry(self) -> None:
        """Once the server has started: whether FastAPI's native telemetry has anything to report to."""
        native = getattr(self, "_native_telemetry", None)  # FastAPI's own (absent before its native telemetry)
        self._telemetry_off = native is not None and not native.enabled()

    async def __call__(self, scope, receive, send) -> None:
        if self._telemetry_off and scope["type"] == "http":
            # What FastAPI.__call__ does for an HTTP request when telemetry is not enabled.
            if self.root_path:
                scope["root_path"] = self.root_path
            await Starlette.__call__(self, scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, *, engine: Engine | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = engine.metrics if engine is not None and engine.metrics is not None else Metrics()
    state = ServerState()
    tracer = None
    if settings.otlp_endpoint:  # the OpenTelemetry SDK is imported only then
        from serving.tracing import Tracer, missing

        if missing():  # `uvicorn --factory` without the otlp extra (python -m serving says so before loading)
            raise RuntimeError(missing())
        tracer = Tracer(settings.otlp_endpoint, settings.otlp_service_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal engine
        if engine is None:
            engine = Engine(settings, metrics)
            await asyncio.to_thread(engine.load)
        app.state.engine = engine
        engine.traced = tracer is not None
        app.check_telemetry()  # FastAPI's startup (its telemetry's auto-configuration included) has run
        metrics.build_info.labels(engine.model_name, engine.backend_name, engine.precision).set(1)
        engine.start()

        async def warm_up():
            try:
                await asyncio.to_thread(engine.warmup)
                state.ready = True
                log.info("ready: %s on %s (%s)", engine.tasks, engine.backend_name, engine.precision)
            except Exception as e:  # noqa: BLE001 - a model that cannot run a batch cannot serve: the process exits
                state.fail(f"warm-up failed: {type(e).__name__}: {str(e)[:300]}")

        warming = asyncio.create_task(warm_up())
        try:
            yield
        finally:
            warming.cancel()
            await engine.stop()
            if tracer is not None:
                await asyncio.to_thread(tracer.flush)

    app = ServingApp(
        title="bertserve",
        version=version(),
        description=app_description(),
        lifespan=lifespan,
        docs_url=None,  # serving.docs serves /docs and /redoc without a CDN
        redoc_url=None,
        redirect_slashes=False,  # a redirect's Location would come from the client's Host header
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.server = state
    app.state.engine = engine
    install_error_handlers(app)
    routes = build_router()  # the tasks' routes as the registry holds them now
    app.include_router(compat_routes)  # first: other APIs' bodies on our paths (serving/routes/compat.py)
    app.include_router(routes)
    _declare_limits_in_openapi(app, settings)
    install_docs(app)
    app.include_router(playground_router)  # GET /playground: try the served tasks in a browser
    # The lean path runs inside RequestMiddleware (the last added is the outermost).
    app.add_middleware(LeanRoutes, routes=routes.routes)
    app.add_middleware(RequestMiddleware, settings=settings, state=state, metrics=metrics, tracer=tracer)
    return app


def _declare_limits_in_openapi(app: FastAPI, settings: Settings) -> None:
    """The schema FastAPI generates, plus the limits this server's settings enforce (see declare_limits)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = declare_limits(
                generate(), max_inputs=settings.max_client_batch_size, max_doc_stride=settings.max_doc_stride
            )
        return app.openapi_schema

    app.openapi = openapi
