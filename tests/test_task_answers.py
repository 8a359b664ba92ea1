"""A task's answer is declared in its own module (dataclasses, the type its `Route` answers), and the server's
response models are made of that declaration (serving/routes/schemas.py `response_model`): the component's name is
the dataclass's, its fields and their descriptions are the dataclass's, and bert/ stays free of pydantic and FastAPI.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pydantic
import pytest

from bert.tasks import base, common, registry
from serving.routes import schemas

ROOT = Path(__file__).resolve().parent.parent
ROUTES = [(task, route) for task in registry.TASKS.values() for route in task.routes]


def answer_classes(kind) -> set[type]:
    """The dataclasses an answer type is made of, at any depth (a field's type included)."""
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return {kind}.union(*(answer_classes(hints[f.name]) for f in dataclasses.fields(kind)))
    return set().union(*(answer_classes(a) for a in typing.get_args(kind)))


def plain_values(kind) -> bool:
    """Whether an answer type is lists and unions of numbers and strings only (no dict, no Any, no object)."""
    if kind in (int, float, str, bool):
        return True
    origin = typing.get_origin(kind)
    return origin in (list, typing.Union) and all(plain_values(a) for a in typing.get_args(kind))


def test_bert_imports_neither_pydantic_nor_fastapi():
    web = {"pydantic", "fastapi", "starlette"}
    found = []
    for path in sorted((ROOT / "bert").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in web]
    assert not found, "bert/ is the ground floor; the web layer reads its declarations:\n" + "\n".join(found)


@pytest.mark.parametrize("task,route", ROUTES, ids=[route.path for _, route in ROUTES])
def test_a_routes_answer_is_the_tasks_declaration(task, route):
    assert not isinstance(route.response, str), f"{route.path} names its answer; declare it in {task!r}'s module"
    classes = answer_classes(route.response)
    if not classes:  # vectors (/embed, /embed_all): lists of numbers, nothing to declare
        assert plain_values(route.response), f"{route.path}: an answer made of no declared object"
    for cls in classes:
        assert cls.__module__.startswith("bert.tasks."), f"{cls.__name__} is declared in {cls.__module__}"


@pytest.mark.parametrize("task,route", ROUTES, ids=[route.path for _, route in ROUTES])
def test_the_response_model_carries_the_declared_names_fields_and_descriptions(task, route):
    # wrapped in a list, so that an answer that is one object is a component too, as in the OpenAPI schema
    schema = pydantic.TypeAdapter(list[schemas.response_model(route.response)]).json_schema(mode="serialization")
    components = schema.get("$defs", {})
    for cls in answer_classes(route.response):
        assert cls.__name__ in components, f"{route.path}: no component named {cls.__name__}"
        component = components[cls.__name__]
        fields = dataclasses.fields(cls)
        assert list(component["properties"]) == [f.name for f in fields], cls.__name__
        required = {
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert set(component.get("required", [])) == required, cls.__name__
        for f in fields:
            assert component["properties"][f.name].get("description") == f.metadata.get("help"), (
                f"{cls.__name__}.{f.name}"
            )


def test_described_gives_a_field_its_description_and_default():
    @dataclasses.dataclass(kw_only=True)
    class Probe:
        """A probe."""

        a: int = base.described("always there")
        b: typing.Optional[str] = base.described("sometimes", None)
        c: list[str] = dataclasses.field(default_factory=list)

    model = schemas.response_model(list[Probe])
    item = typing.get_args(model)[0]
    assert item.__name__ == "Probe" and item.__doc__ == "A probe."
    props = item.model_json_schema()["properties"]
    assert props["a"]["description"] == "always there" and props["b"]["description"] == "sometimes"
    assert item.model_json_schema()["required"] == ["a"] and props["b"]["default"] is None
    assert item(a=1).c == [] and "description" not in props["c"]
    assert schemas.response_model(Probe) is item  # made once


def test_an_answer_shared_by_two_routes_is_one_schema():
    # /v1/rerank's usage and /v1/embeddings' usage: one component, else FastAPI would rename both
    rerank = registry.get("rerank")
    v1 = next(route for route in rerank.routes if route.path == "/v1/rerank")
    made = schemas.response_model(v1.response)
    assert made.model_fields["usage"].annotation is schemas.OpenAIUsage
    embed = registry.get("embed")
    openai = next(route for route in embed.routes if route.path == "/v1/embeddings")
    assert schemas.response_model(openai.response).model_fields["usage"].annotation is schemas.OpenAIUsage
    assert schemas.OpenAIUsage is schemas.response_model(common.OpenAIUsage)
