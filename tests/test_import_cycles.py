"""The product's imports form layers: no import cycle anywhere, and bert/ at the bottom.

Packages: bert (the core), training, export, runtime (the inference runtime), serving, batch, the SDK
(clients/bertserve_client), bench and evals. Rules, each a test:
- no cycle, in any package or across them;
- bert/ imports none of training, export, runtime, serving, batch: it holds the declarations (tasks, heads,
  families) and the code that runs a model, which the others read;
- runtime imports neither serving nor batch (both run models through it); serving and batch never import each
  other: the server is HTTP, a batch job files;
- serving imports neither export nor training; export does not import training;
- the SDK imports nothing of ours (it is installed alone, on machines without the server).

The graph is read from the source with `ast`, without importing anything. An edge A -> B is an `import`
statement in A that names B (`import bert.x`, `from bert.x import y`, `from bert import x`, relative forms);
importing a submodule is not counted as importing its package's __init__ (every sibling import would
otherwise be a cycle through it), and imports under `if TYPE_CHECKING:` never run, so they do not count.

Two graphs:
- module-level imports only (what runs when a module is imported): a cycle there is an import-order bug;
- every import, including those inside functions: a deferred import does not make a cycle harmless, it
  hides it (bert/errors.py once imported checkpoint, config and tokenizer inside bad_input_errors(), and
  each of them imported bert.errors; the module-level graph alone did not show it). The layering rules are
  checked on this one: a layer imported inside a function is still imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# import name -> its folder in the repository
PRODUCT = {
    "bert": "bert",
    "training": "training",
    "export": "export",
    "runtime": "runtime",
    "serving": "serving",
    "batch": "batch",
    "bertserve_client": "clients/bertserve_client",
    "bench": "bench",
    "evals": "evals",
}
# package -> the packages it must never import
FORBIDDEN = {
    "bert": ("training", "serving", "export", "batch", "runtime"),
    "runtime": ("serving", "batch", "training", "export"),
    "serving": ("export", "training", "batch"),
    "export": ("training", "batch"),
    "training": ("batch",),
    "batch": ("training", "export", "serving"),
    "bertserve_client": tuple(p for p in PRODUCT if p != "bertserve_client"),
}
# The applications that run models through the runtime, each alone: neither imports the other.
APPLICATIONS = ("serving", "batch")


def module_name(path: Path, root: Path) -> str:
    """A file's import name; `root` is the folder its top package sits in."""
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


def python_sources(top: Path) -> list[Path]:
    """The .py files under `top`, not those in hidden folders beside the code (bench/.peers holds the peers' virtual
    environments, whose files are not ours)."""
    return [p for p in sorted(top.rglob("*.py")) if not any(part.startswith(".") for part in p.relative_to(top).parts)]


def import_graph(
    root: Path = REPO, packages: dict[str, str] = PRODUCT, *, module_level: bool
) -> dict[str, dict[str, int]]:
    """module -> {imported module of `packages` (import name -> folder under `root`): line of the import}."""
    files = {}
    for folder in packages.values():
        top = root / folder
        files.update({module_name(p, top.parent): p for p in python_sources(top)})
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


def cycles(graph: dict[str, dict[str, int]], limit: int = 20) -> list[list[str]]:
    """Cycles enough to show every tangle: find one, drop its first edge, look again (at most `limit`)."""
    graph = {node: dict(edges) for node, edges in graph.items()}
    found = []
    while len(found) < limit and (cycle := find_cycle(graph)):
        found.append(cycle)
        del graph[cycle[0]][cycle[1]]
    return found


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def cycle_report(graph: dict[str, dict[str, int]]) -> str:
    return "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles(graph))


def layer_violations(graph: dict[str, dict[str, int]], forbidden: dict[str, tuple[str, ...]] = FORBIDDEN) -> list[str]:
    """Each import a package may not make, as "importer (line N) -> imported"."""
    return [
        f"{module} (line {line}) -> {target}"
        for module, edges in sorted(graph.items())
        for target, line in sorted(edges.items())
        if target.split(".")[0] in forbidden.get(module.split(".")[0], ())
    ]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_graph_sees_relative_and_package_imports(tmp_path):
    """The checker itself: each import form makes its edge, a TYPE_CHECKING import none, and a cycle
    through a function's import shows only in the full graph."""
    _write(
        tmp_path,
        {
            "bert/__init__.py": "",
            "bert/sub/__init__.py": "from bert.sub import leaf\n",
            "bert/sub/leaf.py": "from ..low import x\n",
            "bert/low.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bert.high\n"
                "def f():\n    from . import high\n"
            ),
            "bert/high.py": "import bert.low\nfrom bert import sub\n",
        },
    )
    top = import_graph(tmp_path, {"bert": "bert"}, module_level=True)
    assert top == {
        "bert": {},
        "bert.sub": {"bert.sub.leaf": 1},
        "bert.sub.leaf": {"bert.low": 1},
        "bert.low": {},
        "bert.high": {"bert.low": 1, "bert.sub": 2},
    }
    assert find_cycle(top) is None
    full = import_graph(tmp_path, {"bert": "bert"}, module_level=False)
    assert full["bert.low"] == {"bert.high": 5}
    assert find_cycle(full) == ["bert.high", "bert.low", "bert.high"]
    assert describe(find_cycle(full), full) == "bert.high (line 1) -> bert.low (line 5) -> bert.high"


def test_the_checker_sees_cycles_across_packages_and_layer_violations(tmp_path):
    """A tree that breaks every rule: a cycle between two packages through a function's import, a second,
    separate cycle, the core importing training, serving importing export, and an SDK (in a folder named
    differently from its import name) importing the core."""
    _write(
        tmp_path,
        {
            "bert/__init__.py": "",
            "bert/model.py": "def train():\n    from training.loop import step\n",
            "training/__init__.py": "",
            "training/loop.py": "from bert.model import train\n",
            "serving/__init__.py": "",
            "serving/app.py": "import export.onnx\n",
            "export/__init__.py": "",
            "export/onnx.py": "from . import wrapper\n",
            "export/wrapper.py": "from export.onnx import x\n",
            "clients/sdk/__init__.py": "from bert import model\n",
        },
    )
    packages = {"bert": "bert", "training": "training", "serving": "serving", "export": "export", "sdk": "clients/sdk"}
    full = import_graph(tmp_path, packages, module_level=False)
    found = cycles(full)
    assert sorted(c[:-1] for c in found) == [["bert.model", "training.loop"], ["export.onnx", "export.wrapper"]]
    report = cycle_report(full)
    assert "bert.model (line 2) -> training.loop (line 1) -> bert.model" in report
    assert "export.onnx (line 1) -> export.wrapper (line 1) -> export.onnx" in report
    assert find_cycle(import_graph(tmp_path, packages, module_level=True)) == [
        "export.onnx",
        "export.wrapper",
        "export.onnx",
    ]
    forbidden = {**FORBIDDEN, "sdk": tuple(packages)}
    assert layer_violations(full, forbidden) == [
        "bert.model (line 2) -> training.loop",
        "sdk (line 1) -> bert.model",
        "serving.app (line 1) -> export.onnx",
    ]


def test_no_cycle_among_module_level_imports():
    graph = import_graph(module_level=True)
    assert {name.split(".")[0] for name in graph} >= {"bert", "training", "export", "serving", "bench", "evals"}
    assert "bertserve_client" in graph
    assert not cycles(graph), cycle_report(graph)


def test_no_cycle_counting_imports_inside_functions():
    graph = import_graph(module_level=False)
    assert not cycles(graph), cycle_report(graph)


def test_each_layer_imports_only_those_below_it():
    """bert/ imports no training, serving, export or batch; serving no export or training; export no training;
    the SDK nothing of ours. Counted with imports inside functions: a deferred import still ties the layers."""
    graph = import_graph(module_level=False)
    assert graph["bert.tasks.qa"], "the graph must see bert's own imports"
    violations = layer_violations(graph)
    assert not violations, "imports across the layers' rules:\n" + "\n".join(violations)


def test_serving_and_batch_share_only_the_runtime():
    """The server and batch jobs load and run models through runtime/ alone: no batch module imports serving, no
    serving module imports batch, and runtime imports neither (counted with imports inside functions)."""
    graph = import_graph(module_level=False)
    assert any(name.startswith("runtime.") for name in graph), "the graph must see the runtime package"
    assert any(name.startswith("batch.") for name in graph), "the graph must see the batch package"
    crossing = sorted(
        f"{module} (line {line}) -> {target}"
        for module, edges in graph.items()
        for target, line in edges.items()
        if (module.split(".")[0], target.split(".")[0])
        in {("batch", "serving"), ("serving", "batch"), ("runtime", "serving"), ("runtime", "batch")}
    )
    assert not crossing, crossing
    users = {
        module.split(".")[0] for module, edges in graph.items() for target in edges if target.startswith("runtime")
    }
    assert set(APPLICATIONS) <= users, users


def test_the_config_imports_no_codec():
    """bert.config reads the task names when it validates a config, not when it is imported."""
    import subprocess
    import sys

    probe = "import sys, bert.config, bert.errors\nprint(sorted(m for m in sys.modules if m.startswith('bert.tasks')))"
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
