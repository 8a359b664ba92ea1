"""`GET /playground`: one page where a person tries the served model in a browser. The page reads /info for the
served tasks and draws a form for each; it is a single file with its CSS and JavaScript inline, so it works on a
machine with no network, and every request it makes is relative to it (it stays under a proxy's path prefix)."""

from __future__ import annotations

import importlib.resources
from functools import cache

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

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
