"""Registries that list nothing: every module of a package that defines a declaration (a task's `TASK`, a family's
`FAMILY`) joins by being there.

Both the task and the family registries read their package this way, so that adding one is adding its file.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path


def declarations(package: str, folder: Path, attribute: str, kind: type, skip: set[str]) -> list:
    """The `attribute` of every module in `folder` (the package `package`) that defines one of type `kind`, in
    (order, name) order. Modules in `skip` (the registry's own) and private ones (`_x`) are not read."""
    found = []
    for module in pkgutil.iter_modules([str(folder)]):
        if module.name in skip or module.name.startswith("_"):
            continue
        declared = getattr(importlib.import_module(f"{package}.{module.name}"), attribute, None)
        if isinstance(declared, kind):
            found.append(declared)
    return sorted(found, key=lambda d: (d.order, d.name))
