"""The tiers' lists in tests/conftest.py name files and tests that exist: a renamed file cannot leave the fast tier,
nor a renamed slow test enter it, unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import FAST_FILES, LONG_FILES, SLOW_TESTS

TESTS = Path(__file__).resolve().parent


def test_every_fast_file_exists():
    assert sorted(name for name in FAST_FILES if not (TESTS / name).is_file()) == []


def test_every_long_file_exists_once():
    assert sorted(name for name in LONG_FILES if not (TESTS / name).is_file()) == []
    assert len(set(LONG_FILES)) == len(LONG_FILES)


def test_every_slow_test_is_a_test_of_a_fast_file():
    missing = []
    for entry in sorted(SLOW_TESTS):
        file, name = entry.split("::")
        if file not in FAST_FILES or not (TESTS / file).is_file():
            missing.append(entry)
            continue
        tree = ast.parse((TESTS / file).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name not in defined:
            missing.append(entry)
    assert missing == []
