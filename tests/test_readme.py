"""The README and docs/ tell the truth: the README is a short front door whose SDK example is examples/quickstart.py
and runs against a real server, whose routes table lists every route the server has, every `python -m` command in
it or in docs/ answers --help, every server flag it names exists; every relative link in the README and docs/
resolves (file and heading), and every `docs/*.md` page (and section) that the code cites exists."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from test_serving_support import PYTHON, REPO, Server, build_checkpoint

README = (REPO / "README.md").read_text()
QUICKSTART = REPO / "examples" / "quickstart.py"
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 200


def _section(text: str, heading: str) -> str:
    """A `## ` section's text, from its heading to the next `## ` heading."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def test_readme_is_a_front_door():
    lines = README.count("\n") + (not README.endswith("\n"))
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the details belong in docs/"


def test_readme_python_example_is_the_quickstart_script():
    block = re.search(r"The same calls from Python.*?```python\n(.*?)```", README, re.S).group(1)
    script = QUICKSTART.read_text()
    code = script[script.index('"""', 3) + 3 :].strip()  # after the module docstring
    assert block.strip() == code


def test_quickstart_runs_against_a_server(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "multi")
    with Server("--model", str(checkpoint)) as server:
        run = subprocess.run(
            [PYTHON, str(QUICKSTART)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "BERTSERVE_BASE_URL": server.url},
        )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "['classify', 'ner', 'qa', 'embed']"
    assert lines[-1].startswith("32 [")  # the tiny model's hidden size, then two cosines
    assert "True" in lines[-2]  # the answer's offsets point at its text


def test_readme_routes_table_lists_every_route():
    """Every method and path of the server's OpenAPI document, and the docs pages, in the README's table."""
    from serving.app import create_app
    from serving.settings import Settings

    app = create_app(Settings())  # no lifespan: nothing is loaded
    served = {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item}
    served |= {("GET", path) for path in ("/", "/docs", "/redoc", "/openapi.json", "/playground")}
    documented = set()
    for row in _section(README, "## Routes").splitlines():
        cell = row.split("|")[1] if row.startswith("| `") else ""
        method = re.match(r"\s*`([A-Z]+) ", cell)
        if method:
            documented |= {(method.group(1), path) for path in re.findall(r"`(?:[A-Z]+ )?(/[\w/.-]*)`", cell)}
    assert documented, "no routes found in the README's table"
    assert not sorted(served - documented), sorted(served - documented)
    # the other APIs' routes (kept out of OpenAPI) have one row and docs/compat.md; a path there may be a prefix
    compat = compat_routes()
    unknown = {(m, p) for m, p in documented - served if not any(m == cm and cp.startswith(p) for cm, cp in compat)}
    assert not sorted(unknown), sorted(unknown)


def compat_routes() -> set[tuple[str, str]]:
    from serving.routes import compat_cohere, compat_hf, compat_tei

    modules = (compat_hf, compat_tei, compat_cohere)
    return {(method, route.path) for module in modules for route in module.router.routes for method in route.methods}


def test_compat_md_names_every_route_of_the_other_apis():
    text = (REPO / "docs" / "compat.md").read_text()
    # /hf/{tag} is written /hf/<pipeline-tag>; /v1/models/{name:path} as /v1/models/NAME
    missing = sorted(
        f"{method} {path}"
        for method, path in compat_routes()
        if f"{method} {re.split(r'[{]', path)[0].rstrip('/') or '/'}" not in text
    )
    assert compat_routes() and not missing, missing


# A helper that takes two plain arguments (docs/architecture.md, "Options"), so it has no --help.
NO_HELP = {"training.data.wikitext"}
MODULES = sorted(
    {
        module.rstrip(".")
        for page in DOC_PAGES
        for module in re.findall(r"python -m ((?:training|export|serving|batch|bench|evals)[\w.]*)", page.read_text())
    }
    - NO_HELP
)


@pytest.mark.parametrize("module", MODULES)
def test_every_command_in_the_readme_and_docs_answers_help(module):
    run = subprocess.run([PYTHON, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (module, run.stderr[-2000:])
    assert "usage" in run.stdout.lower()


def test_every_server_flag_in_the_readme_exists():
    help_text = subprocess.run(
        [PYTHON, "-m", "serving", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout
    section = _section(README, "## Serving: `python -m serving`")
    documented = set(re.findall(r"`(--[a-z][a-z-]+)", section))
    assert documented, "no flags found in the README's serving section"
    missing = sorted(flag for flag in documented if flag not in help_text)
    assert not missing, missing


def _without_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # fenced blocks
    return re.sub(r"`[^`\n]*`", "", text)  # inline code


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link and code marks dropped), lower case, punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _headings(page) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return re.findall(r"^#{1,6}\s+(.*?)\s*$", text, re.M)


def _anchors(page) -> set[str]:
    anchors, seen = set(), {}
    for heading in _headings(page):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in DOC_PAGES:
        for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", _without_code(page.read_text())):
            if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def _product_files():
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in listed.splitlines():
        path = REPO / name
        if (
            not name.startswith(("docs/", "tests/"))
            and path.suffix in {".py", ".sh", ".yaml", ".yml", ".toml", ""}
            and path.is_file()
        ):
            yield path


CITED_PAGE = re.compile(r"docs/([\w./-]+\.md)")
# `docs/page.md, "Section"` or `docs/page.md ("Section"`, across a comment's line break
CITED_SECTION = re.compile(r'docs/([\w./-]+\.md)(?:,\s*|\s*\(|\s+)"([^"\n]+)"')


def test_every_docs_page_and_section_the_code_cites_exists():
    missing = []
    for path in _product_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        where = path.relative_to(REPO)
        missing += [
            f"{where}: docs/{page}" for page in CITED_PAGE.findall(text) if not (REPO / "docs" / page).is_file()
        ]
        joined = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)  # a citation broken over comment lines
        for page, section in CITED_SECTION.findall(joined):
            doc = REPO / "docs" / page
            if not doc.is_file():
                continue
            wanted = section.lower()
            headings = [heading.lower() for heading in _headings(doc)]
            labels = [label.lower() for label in re.findall(r"\*\*([^*\n]+)\*\*", doc.read_text())]
            if not any(wanted in heading for heading in headings) and not any(
                label.startswith(wanted) for label in labels
            ):
                missing.append(f'{where}: docs/{page}, "{section}"')
    assert not missing, missing
