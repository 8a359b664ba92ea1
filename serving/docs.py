"""The interactive API docs, served offline: `/docs` (Swagger UI) and `/redoc` (ReDoc); `/` leads a machine client to
them (serving/routes/playground.py).

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on an air-gapped machine `/docs` is a blank
page. Here the JavaScript, CSS and favicon come from the `fastapi-offline` package (a dependency of the
`serve` extra, which vendors swagger-ui-dist 5 and the ReDoc 2 standalone bundle) and are served under
`/docs/assets/`. Every URL in the pages is relative, so they also work behind a proxy that serves the
API under a path prefix.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PREFIX = "/docs/assets"
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
# Every path the docs need, for the middleware to leave open when an API key is set.
DOCS_PATHS = frozenset(
    {"/", "/docs", "/redoc", "/openapi.json", OAUTH2_REDIRECT, *(f"{ASSETS_PREFIX}/{name}" for name in ASSETS)}
)
# Swagger UI's default validator badge calls validator.swagger.io; FastAPI's BaseLayout shows none,
# but say so explicitly so that no page element ever reaches outside.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None, "tryItOutEnabled": True, "displayRequestDuration": True}


def assets_dir() -> Path:
    """Where the vendored Swagger UI / ReDoc files lie (package data of fastapi-offline)."""
    try:
        directory = Path(str(importlib.resources.files("fastapi_offline") / "static"))
    except ModuleNotFoundError:
        raise RuntimeError(
            "the API docs need the fastapi-offline package: pip install 'fastapi-offline>=1.7,<2' "
            "(part of bertserve[serve])"
        ) from None
    missing = [name for name in ASSETS if not (directory / name).is_file()]
    if missing:
        raise RuntimeError(
            f"fastapi-offline at {directory} lacks {', '.join(missing)}: pip install 'fastapi-offline>=1.7,<2'"
        )
    return directory


def app_description() -> str:
    """The API's description in the OpenAPI document: every task the registry holds, with its routes."""
    from bert.tasks import registry

    tasks = "\n".join(
        f"- **{task.name}**: " + "; ".join(f"`POST {route.path}` {route.summary}" for route in task.routes)
        for task in registry.TASKS.values()
        if task.routes
    )
    return (
        "BERT-family encoders behind a dynamically batched HTTP API. The tasks (a server answers those its "
        f"model has heads for; `GET /info` lists them):\n\n{tasks}\n\nErrors are JSON {{error, error_type}}."
    )


def install_docs(app: FastAPI) -> None:
    """Serve /docs, /redoc, /docs/oauth2-redirect and the assets from this machine.
    The app must be created with docs_url=None and redoc_url=None so FastAPI's CDN pages stay off."""
    title = app.title
    # Relative URLs: the pages sit at the root next to openapi.json, so "docs/assets/x" resolves to
    # <prefix>/docs/assets/x whatever prefix a proxy serves the API under.
    assets = ASSETS_PREFIX.lstrip("/")
    openapi = app.openapi_url.lstrip("/")
    app.mount(ASSETS_PREFIX, StaticFiles(directory=assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        # Swagger UI builds the OAuth2 redirect from window.location.origin: it needs the full path.
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=openapi,
            title=f"{title} - API docs",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
            oauth2_redirect_url=root + OAUTH2_REDIRECT,
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), **SWAGGER_UI_PARAMETERS},
        )

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{assets}/redoc.standalone.js",
            redoc_favicon_url=f"{assets}/favicon.png",
            with_google_fonts=False,
        )
