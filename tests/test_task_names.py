"""No product module outside bert/tasks/ names a task: a task is one declaration (bert/tasks/<name>.py), and the
model, backends, routes, batch jobs, export and training loop over the registry instead of branching on a name.

The test walks the syntax tree of every product module and fails on a task's name (the registry's names and their
route spellings, "fill-mask") where code decides by it: in a comparison (`task == "qa"`, `task in ("qa", "ner")`),
as a dict key (`{"qa": ...}`), a subscript (`COLUMNS["ner"]`) or a `match` case. Docstrings, comments, help text
and messages may speak of tasks; code may not decide by them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bert.tasks import registry

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bert", "training", "export", "serving", "batch", "runtime")

# (file, enclosing function or "<module>") -> why it still names a task: in each, the
# name is a key of a file format, not a branch on a task.
ALLOWED: dict[tuple[str, str], str] = {}


def task_names() -> set[str]:
    names = set(registry.TASKS)
    names |= {name.replace("_", "-") for name in names}
    return names


def product_modules() -> list[Path]:
    files = []
    for package in PACKAGES:
        root = ROOT / package
        if root.is_dir():
            files += [
                p for p in sorted(root.rglob("*.py")) if not p.relative_to(ROOT).as_posix().startswith("bert/tasks/")
            ]
    return files


class _Finder(ast.NodeVisitor):
    def __init__(self, names: set[str]):
        self.names = names
        self.scope = ["<module>"]
        self.found: list[tuple[int, str, str]] = []  # (line, scope, what)

    def _named(self, node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in self.names:
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return next((n for n in map(self._named, node.elts) if n), None)
        return None

    def _hit(self, node, name: str, how: str) -> None:
        self.found.append((node.lineno, self.scope[-1], f"{how} {name!r}"))

    def _scoped(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Compare(self, node):
        for operand in (node.left, *node.comparators):
            if name := self._named(operand):
                self._hit(node, name, "compares with")
        self.generic_visit(node)

    def visit_Dict(self, node):
        for key in node.keys:
            if key is not None and (name := self._named(key)):
                self._hit(node, name, "dict key")
        self.generic_visit(node)

    def visit_Subscript(self, node):
        literal = isinstance(node.value, ast.Name) and node.value.id == "Literal"  # a type: another API's word
        if not literal and (name := self._named(node.slice)):
            self._hit(node, name, "subscript")
        self.generic_visit(node)

    def visit_MatchValue(self, node):
        if name := self._named(node.value):
            self._hit(node, name, "match case")
        self.generic_visit(node)


def find(path: Path, names: set[str]) -> list[tuple[int, str, str]]:
    finder = _Finder(names)
    finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return finder.found


def test_the_walk_sees_every_kind_of_site(tmp_path):
    # The finder itself: each way of deciding by a name is caught, and prose is not.
    source = tmp_path / "sample.py"
    source.write_text(
        '"""The qa task."""\n'
        "def f(task, table):\n"
        '    if task == "qa": pass\n'
        '    if task in ("ner", "x"): pass\n'
        '    d = {"embed": 1}\n'
        '    table["zero-shot"]\n'
        "    match task:\n"
        '        case "rerank": pass\n'
        '    print("classify this")\n'
    )
    found = find(source, task_names())
    assert [line for line, _, _ in found] == [3, 4, 5, 6, 8], found
    assert {scope for _, scope, _ in found} == {"f"}


def test_no_product_module_outside_bert_tasks_names_a_task():
    names = task_names()
    assert {"classify", "ner", "qa", "embed", "rerank", "fill_mask", "fill-mask", "zero_shot"} <= names
    modules = product_modules()
    assert len(modules) > 50, "the walk found too few modules to mean anything"
    problems, used = [], set()
    for path in modules:
        relative = path.relative_to(ROOT).as_posix()
        for line, scope, what in find(path, names):
            if (relative, scope) in ALLOWED:
                used.add((relative, scope))
                continue
            problems.append(f"{relative}:{line} ({scope}) {what}")
    assert not problems, "code that decides by a task's name (read the task's declaration instead):\n" + "\n".join(
        problems
    )
    stale = sorted(f"{file} ({scope})" for file, scope in set(ALLOWED) - used if (ROOT / file).exists())
    assert not stale, "allowlisted sites that no longer name a task (remove them from ALLOWED): " + ", ".join(stale)


@pytest.mark.parametrize("name", sorted(registry.TASKS))
def test_a_task_declares_what_the_applications_read(name):
    from export.sensitivity import CALIBRATION_SETS

    task = registry.get(name)
    # outputs follow from the head kind: one row per sequence or per token, named after the task
    assert len(task.outputs) == len(task.output_ranks) >= 1
    assert all(out.startswith(task.name) for out in task.outputs)
    # per token: a token axis in every output (rank 3), or a span head's start/end logits, one per token ([B, T])
    assert task.per_token == (max(task.output_ranks) == 3 or (task.head is not None and task.head.kind == "span"))
    # every route's request is made of declared fields, and batch jobs know the task's columns
    assert all(route.fields and route.doc for route in task.routes)
    assert task.job is not None and task.job.results
    assert task.calibration in CALIBRATION_SETS, f"{task.name} reads no calibration set {task.calibration!r}"


def test_multitask_reports_the_teacher_agreement_under_the_embedding_tasks_name():
    # metrics.json's key comes from the task's declaration (no name in training/), and is what it always was
    from training import multitask

    assert multitask.agreement_key() == registry.get("embed").name == "embed"
    metrics = {"mean_score": 50.0, "embed": {"teacher_cosine": 0.98765}}
    assert multitask.summary_line(metrics) == "; mean 50.00; embedding cosine to the teacher 0.9877"
    assert "teacher" not in multitask.summary_line({"mean_score": 50.0})
