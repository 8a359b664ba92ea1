"""`GET /playground` against a real `python -m serving` on loopback: the page is one offline HTML file whose every
call is a route of the app, open when an API key is set; and in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) the classify form answers with label bars, and an empty text shows the
server's JSON error while the page keeps working."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from test_serving_support import Server, build_checkpoint

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
API_KEY = "playground-test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("playground") / "multi")
    with Server("--model", str(checkpoint)) as running:
        yield running


def page_routes(html: str) -> set[str]:
    """The paths the page's script calls: the values of its ROUTES table, relative to the server's root."""
    table = re.search(r"const ROUTES = \{(.*?)\};", html, re.S)
    assert table, "the page's ROUTES table is gone"
    return {"/" + route for route in re.findall(r':\s*"([\w./-]+)"', table.group(1))}


def test_page_is_offline_html_calling_only_the_apps_routes(server):
    response = httpx.get(server.url + "/playground")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    # Offline: nothing loaded from elsewhere (no src/href to a host, no protocol-relative URL).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "the page loads from another host"
    assert "fetch(" in html and html.count("fetch(") == 1, "every request goes through call(), whose paths are ROUTES"
    schema = httpx.get(server.url + "/openapi.json").json()
    served = {path for path, item in schema["paths"].items() for method in item}
    routes = page_routes(html)
    assert {"/info", "/classify", "/ner", "/qa", "/embed", "/rerank", "/fill-mask", "/zero-shot"} <= routes
    assert not routes - served, sorted(routes - served)
    tasks = httpx.get(server.url + "/info").json()["tasks"]
    assert {f"/{task}" for task in tasks} <= routes, tasks  # each task this server holds has its form


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # what Chromium sends


def test_the_root_is_the_page_for_a_browser_and_the_docs_for_other_clients(server):
    page = httpx.get(server.url + "/", headers={"accept": BROWSER_ACCEPT})
    assert page.status_code == 200 and page.text == httpx.get(server.url + "/playground").text
    assert page.headers["vary"] == "accept"
    for accept in ("*/*", "application/json", None):  # curl, a JSON client, none at all
        headers = {"accept": accept} if accept else {}
        response = httpx.get(server.url + "/", headers=headers)
        assert response.status_code == 307 and response.headers["location"] == "docs", (accept, response.text)
    assert httpx.head(server.url + "/", headers={"accept": BROWSER_ACCEPT}).status_code == 200
    # POST / is still the Hugging Face Inference API, whatever the client accepts
    answer = httpx.post(server.url + "/", json={"inputs": "a fine film"}, headers={"accept": BROWSER_ACCEPT})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json"), answer.text


def test_page_is_open_behind_an_api_key_and_its_calls_are_not(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    with Server("--model", str(checkpoint), env={"BERTSERVE_API_KEY": API_KEY}) as server:
        assert httpx.get(server.url + "/playground").status_code == 200
        assert httpx.get(server.url + "/", headers={"accept": BROWSER_ACCEPT}).status_code == 200
        assert httpx.get(server.url + "/info").status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert httpx.get(server.url + "/info", headers=auth).status_code == 200


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="playground-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _run_classify(driver, text: str):
    """Type `text` into the classify form, submit it with the keyboard, and wait for its answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    field = driver.find_element(By.ID, "classify-text")
    field.clear()
    if text:
        field.send_keys(text)
    field.send_keys(Keys.CONTROL, Keys.ENTER)
    WebDriverWait(driver, 60).until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "#out-classify .latency[data-status]")
            and not d.find_element(By.CSS_SELECTOR, "#form-classify button.run").get_attribute("disabled")
        )
    )
    return driver.find_element(By.ID, "out-classify")


def test_browser_classifies_and_shows_the_servers_error(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    labels = httpx.get(server.url + "/info").json()["labels"]["classify"]
    browser.get(server.url + "/")  # the root, as a person types it: the page, not the API docs
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.ID, "classify-text"))
    tabs = [tab.text for tab in browser.find_elements(By.CSS_SELECTOR, "#tabs button")]
    assert tabs == ["Classify", "Named entities", "Question answering", "Embeddings"], tabs

    out = _run_classify(browser, "A gripping, beautifully acted film.")
    shown = [label.text for label in out.find_elements(By.CSS_SELECTOR, ".bar .label")]
    assert shown and set(shown) <= set(labels), (shown, labels)
    assert " ms" in out.find_element(By.CSS_SELECTOR, ".latency").text
    assert not out.find_elements(By.CSS_SELECTOR, ".error")

    # Hostile: an empty text. The page shows the server's own JSON error, and answers the next request.
    refused = httpx.post(server.url + "/classify", json={"inputs": "", "top_k": None})
    assert refused.status_code >= 400
    error = refused.json()
    out = _run_classify(browser, "")
    box = out.find_element(By.CSS_SELECTOR, ".error").text
    assert str(refused.status_code) in box and error["error_type"] in box and error["error"] in box, box
    assert not out.find_elements(By.CSS_SELECTOR, ".bar")

    out = _run_classify(browser, "Dull and far too long.")
    assert [label.text for label in out.find_elements(By.CSS_SELECTOR, ".bar .label")], out.text
    assert not out.find_elements(By.CSS_SELECTOR, ".error")
    curl = browser.execute_script("return document.querySelector('#out-classify pre.curl').textContent")
    assert curl.startswith(f"curl -s '{server.url}/classify'") and '"inputs":"Dull and far too long."' in curl


def test_browser_draws_each_task_of_the_server(server, browser):
    """The other forms of a classify/ner/qa/embed server: the QA answer marked in its context, entities (or none)
    over the text, and the cosine matrix of the texts (1 on its diagonal)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/playground")
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.ID, "tab-embed"))
    for task in ("qa", "ner", "embed"):
        browser.find_element(By.ID, f"tab-{task}").click()
        browser.find_element(By.CSS_SELECTOR, f"#form-{task} button.run").click()
        WebDriverWait(browser, 60).until(
            lambda d, task=task: d.find_elements(By.CSS_SELECTOR, f"#out-{task} .latency[data-status]")
        )
        out = browser.find_element(By.ID, f"out-{task}")
        assert not out.find_elements(By.CSS_SELECTOR, ".error"), out.text
        assert out.find_element(By.CSS_SELECTOR, ".latency").get_attribute("data-status") == "200"
        if task == "qa":
            answer = out.find_element(By.CSS_SELECTOR, ".marked mark").text
            assert answer.endswith("answer") and answer[: -len("answer")] in "My name is Wolfgang and I live in Berlin."
        elif task == "ner":
            assert out.find_elements(By.CSS_SELECTOR, ".marked") or "No entities found." in out.text
        else:
            cells = out.find_elements(By.CSS_SELECTOR, "table.matrix td")
            assert len(cells) == 9 and [cells[i].text for i in (0, 4, 8)] == ["1.000"] * 3, [c.text for c in cells]


def test_browser_draws_a_masked_lms_candidates_and_sparse_terms(browser, tmp_path):
    """A masked LM serves fill-mask and sparse: the mask's candidates as bars, and the text's heaviest vocabulary
    terms as bars scaled to the heaviest, at most the 20 the form asks for, each named by its word."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_compat_support import tiny_bert

    model = tiny_bert(tmp_path / "mlm", "BertForMaskedLM")
    with Server("--model", str(model)) as server:
        terms = httpx.post(
            server.url + "/embed_sparse",
            json={"inputs": "The Eiffel Tower is in Paris.", "top_k": 20, "return_tokens": True},
        ).json()[0]
        browser.get(server.url + "/")
        WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.ID, "tab-sparse"))
        tabs = [tab.text for tab in browser.find_elements(By.CSS_SELECTOR, "#tabs button")]
        assert tabs == ["Embeddings", "Fill mask", "Sparse terms"], tabs  # fill_mask in /info: the fill-mask form
        for task in ("fill-mask", "sparse"):
            browser.find_element(By.ID, f"tab-{task}").click()
            browser.find_element(By.CSS_SELECTOR, f"#form-{task} button.run").click()
            WebDriverWait(browser, 60).until(
                lambda d, task=task: d.find_elements(By.CSS_SELECTOR, f"#out-{task} .latency[data-status]")
            )
            out = browser.find_element(By.ID, f"out-{task}")
            assert not out.find_elements(By.CSS_SELECTOR, ".error"), out.text
            shown = [label.text for label in out.find_elements(By.CSS_SELECTOR, ".bar .label")]
            if task == "fill-mask":
                assert len(shown) == 5, shown  # the route's default top_k
            else:
                heaviest = sorted(terms, key=lambda t: -t["value"])
                assert shown == [t["token"] for t in heaviest], (shown, heaviest)
                widths = [f.get_attribute("style") for f in out.find_elements(By.CSS_SELECTOR, ".bar .fill")]
                assert "width: 100%" in widths[0], widths[0]
