"""The README tells the truth: its SDK example is examples/quickstart.py and runs against a real server, every
`python -m` command it shows answers --help, and every server flag it documents exists."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from test_serving_support import PYTHON, REPO, Server, build_checkpoint

README = (REPO / "README.md").read_text()
QUICKSTART = REPO / "examples" / "quickstart.py"


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


MODULES = sorted(set(re.findall(r"python -m ((?:training|export|serving|batch|bench|evals)[\w.]*)", README)))


@pytest.mark.parametrize("module", MODULES)
def test_every_command_in_the_readme_answers_help(module):
    run = subprocess.run([PYTHON, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (module, run.stderr[-2000:])
    assert "usage" in run.stdout.lower()


def test_every_server_flag_in_the_readme_exists():
    help_text = subprocess.run(
        [PYTHON, "-m", "serving", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout
    section = README[README.index("## Serving: `python -m serving`") : README.index("## Python client")]
    documented = set(re.findall(r"`(--[a-z][a-z-]+)", section))
    assert documented, "no flags found in the README's serving section"
    missing = sorted(flag for flag in documented if flag not in help_text)
    assert not missing, missing
