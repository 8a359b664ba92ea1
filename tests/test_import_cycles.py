"""bert/ has no import cycles: the core's modules form layers (errors, config, tokenizer, tasks, model,
checkpoint), and a lower one never imports a higher one.

The graph is read from the source with `ast`, without importing anything. An edge A -> B is an `import`
statement in A that names B (`import bert.x`, `from bert.x import y`, `from bert import x`, relative forms);
importing a submodule is not counted as importing its package's __init__ (every sibling import would
otherwise be a cycle through it), and imports under `if TYPE_CHECKING:` never run, so they do not count.

Two graphs, two tests:
- module-level imports only (what runs when a module is imported): a cycle there is an import-order bug;
- every import, including those inside functions: a deferred import does not make a cycle harmless, it
  hides it (bert/errors.py once imported checkpoint, config and tokenizer inside bad_input_errors(), and
  each of them imported bert.errors; the module-level graph alone did not show it).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "bert"


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, module_level: bool):
    """The import statements of a module: those that run when it is imported (module level, inside
    if/try/with and class bodies, not inside functions), or every one."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = REPO, package: str = PACKAGE, *, module_level: bool) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line of the import}."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), module_level):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                if target in files and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_graph_sees_relative_and_package_imports(tmp_path):
    """The checker itself: each import form makes its edge, a TYPE_CHECKING import none, and a cycle
    through a function's import shows only in the full graph."""
    pkg = tmp_path / "bert"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from bert.sub import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("from ..low import x\n")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bert.high\ndef f():\n    from . import high\n"
    )
    (pkg / "high.py").write_text("import bert.low\nfrom bert import sub\n")
    top = import_graph(tmp_path, module_level=True)
    assert top == {
        "bert": {},
        "bert.sub": {"bert.sub.leaf": 1},
        "bert.sub.leaf": {"bert.low": 1},
        "bert.low": {},
        "bert.high": {"bert.low": 1, "bert.sub": 2},
    }
    assert find_cycle(top) is None
    full = import_graph(tmp_path, module_level=False)
    assert full["bert.low"] == {"bert.high": 5}
    assert find_cycle(full) == ["bert.high", "bert.low", "bert.high"]


def test_no_cycle_among_module_level_imports():
    graph = import_graph(module_level=True)
    assert len(graph) > 5
    cycle = find_cycle(graph)
    assert cycle is None, describe(cycle, graph)


def test_no_cycle_counting_imports_inside_functions():
    graph = import_graph(module_level=False)
    cycle = find_cycle(graph)
    assert cycle is None, describe(cycle, graph)


def test_the_config_imports_no_codec():
    """bert.config reads the task names when it validates a config, not when it is imported."""
    import subprocess
    import sys

    probe = "import sys, bert.config, bert.errors\nprint(sorted(m for m in sys.modules if m.startswith('bert.tasks')))"
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
