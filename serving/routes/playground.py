"""`GET /playground` (and `GET /` from a browser): one page where a person tries the served model in a browser. The page reads /info for the
served tasks and draws a form for each; it is a single file with its CSS and JavaScript inline, so it works on a
machine with no network, and every request it makes is relative to it (it stays under a proxy's path prefix)."""

from __future__ import annotations

import importlib.resources
from functools import cache

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

PLAYGROUND_PATH = "/playground"

router = APIRouter()


@cache
def page() -> str:
    return (importlib.resources.files("serving") / "static" / "playground.html").read_text(encoding="utf-8")


# Out of the OpenAPI document, as /docs is: a page for people, not a route for clients. It is open when an API key
# is set (it holds no data); the calls it makes send the key typed into it.
@router.get(PLAYGROUND_PATH, include_in_schema=False, response_class=HTMLResponse)
async def playground() -> HTMLResponse:
    return HTMLResponse(page(), headers={"cache-control": "no-cache"})


# `GET /`: a browser (it asks for HTML) gets the playground, any other client a redirect to the API docs, as
# before; relative, so it stays under a proxy's path prefix. `POST /` is the Hugging Face Inference API.
@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root(request: Request) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(page(), headers={"cache-control": "no-cache", "vary": "accept"})
    return RedirectResponse("docs", status_code=307, headers={"vary": "accept"})
