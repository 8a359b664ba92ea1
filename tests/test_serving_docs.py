"""/docs and /redoc work offline: the pages name no other host, their assets come from this server, and
`/` leads to /docs, with or without an API key.

docs/img/docs-offline.png and redoc-offline.png are the pages as headless Chromium (Debian's `chromium`)
rendered them with no network: server and browser in a network namespace holding only loopback,
    unshare -n sh -c 'ip link set lo up; python -m serving --port 8123 & sleep 20;
      chromium --headless --no-sandbox --disable-gpu --user-data-dir=$(mktemp -d) --virtual-time-budget=10000 \
        --window-size=1280,1800 --screenshot=docs/img/docs-offline.png "http://127.0.0.1:8123/docs#/inference/qa_qa_post"'
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from serving.app import create_app
from serving.docs import DOCS_PATHS
from serving.settings import Settings

API_KEY = "docs-test-key"


@pytest.fixture(scope="module", params=[None, API_KEY], ids=["open", "api-key"])
def client(request):
    # No lifespan (not entered as a context manager): the docs need no model.
    return TestClient(create_app(Settings(api_key=request.param)), follow_redirects=False)


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [value for name, value in attrs if name in ("src", "href", "spec-url") and value]


def page_urls(html: str) -> list[str]:
    """Every URL the page will load: tag attributes and the url/oauth2 strings in its inline script."""
    parser = _Links()
    parser.feed(html)
    return parser.urls + re.findall(r"""url:\s*['"]([^'"]+)""", html)


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_docs_pages_reference_no_external_url(client, path):
    response = client.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    html = response.text
    assert not re.search(r"(https?:)?//[A-Za-z0-9]", html.replace("window.location.origin", "")), (
        "the page names another host: " + ", ".join(re.findall(r"(?:https?:)?//[^\s'\"<>]+", html))
    )
    urls = page_urls(html)
    assert urls, html
    for url in urls:
        assert not urlsplit(url).netloc and not urlsplit(url).scheme, url
        # Each asset the page loads is served by this app, without credentials.
        target = urlsplit(urljoin(f"http://testserver{path}", url)).path
        assert target in DOCS_PATHS, target
        assert client.get(target).status_code == 200, target


@pytest.mark.parametrize(
    "name,content_type",
    [
        ("swagger-ui-bundle.js", "javascript"),
        ("swagger-ui.css", "text/css"),
        ("redoc.standalone.js", "javascript"),
        ("favicon.png", "image/png"),
    ],
)
def test_assets_are_served_with_their_content_type(client, name, content_type):
    response = client.get(f"/docs/assets/{name}")
    assert response.status_code == 200 and content_type in response.headers["content-type"]
    assert len(response.content) > 1000


def test_swagger_ui_loads_the_schema_and_calls_no_validator(client):
    html = client.get("/docs").text
    assert "url: 'openapi.json'" in html and '"validatorUrl": null' in html
    assert "window.location.origin + '/docs/oauth2-redirect'" in html
    assert client.get("/docs/oauth2-redirect").status_code == 200
    schema = client.get("/openapi.json").json()
    assert {"/classify", "/ner", "/qa"} <= set(schema["paths"])
    assert not {"/", "/docs", "/redoc"} & set(schema["paths"]), "the docs routes stay out of the schema"


def test_the_description_names_every_task_and_route(client):
    from bert.tasks import registry

    description = client.get("/openapi.json").json()["info"]["description"]
    assert len(registry.TASKS) >= 6
    for task in registry.TASKS.values():
        assert f"**{task.name}**" in description
        for route in task.routes:
            assert f"`POST {route.path}`" in description


def test_root_redirects_to_docs_relatively(client):
    response = client.get("/")
    assert response.status_code == 307 and response.headers["location"] == "docs"
    assert urljoin("http://host/", response.headers["location"]) == "http://host/docs"
    assert urljoin("http://host/prefix/", response.headers["location"]) == "http://host/prefix/docs"
    assert client.head("/").status_code == 307 and client.get("/", follow_redirects=True).status_code == 200


def test_docs_are_open_but_the_api_is_not_with_a_key():
    client = TestClient(create_app(Settings(api_key=API_KEY)), follow_redirects=False)
    for path in sorted(DOCS_PATHS):
        assert client.get(path).status_code in (200, 307), path
    refused = client.post("/classify", json={"inputs": "x"})
    assert refused.status_code == 401 and refused.json()["error_type"] == "unauthorized"
