"""Print the third-party requirements of bertserve with the given extras, one per line, from pyproject.toml.

    python3 docker/requirements.py serve          # core dependencies + [serve]
    python3 docker/requirements.py export serve

The Dockerfile installs these before bertserve's own wheel: they change only when pyproject.toml does, so
a code change rebuilds one small layer instead of reinstalling every dependency. Self-references such as
"bertserve[torch]" are expanded. Standard library only (tomllib: Python 3.11+).
"""

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(project: dict, extras: list[str]) -> list[str]:
    name = project["name"]
    optional = project.get("optional-dependencies", {})
    out, seen, todo = list(project.get("dependencies", [])), set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"error: {name} has no extra {extra!r} (has: {', '.join(sorted(optional))})")
        seen.add(extra)
        for requirement in optional[extra]:
            own = re.fullmatch(rf"{re.escape(name)}\[([^\]]+)\]", requirement.replace(" ", ""))
            if own:
                todo += own.group(1).split(",")
            else:
                out.append(requirement)
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    print("\n".join(requirements(project, sys.argv[1:])))
