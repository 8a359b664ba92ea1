"""The SDK (clients/, httpx + pydantic only) against the server's OpenAPI schema, so the two cannot drift: every
route the server offers is an SDK method (or is listed below with the client its shape belongs to), every field of
its request is a parameter of that method with the server's default (a required field a required parameter), a
field the server limits to choices takes each of them, the body the SDK sends holds only fields the server knows,
and each type the SDK parses an answer into has the server's fields with their JSON types.

The server is the real FastAPI app over a tiny checkpoint (hidden 32, 2 layers, MiniLM's tokenizer); the SDK's
requests are caught by an `httpx.MockTransport`, so only what the SDK would send is looked at, not the answers."""

from __future__ import annotations

import inspect
import json
import re
import typing
from pathlib import Path

import httpx
import pydantic
import pytest
from test_serving_support import build_checkpoint

from bertserve_client import Client, types
from bertserve_client._base import endpoint_names

# Routes whose body is another API's (its own clients call them: the openai and cohere packages, infinity's), and
# the Prometheus scrape: no SDK method.
NOT_SDK_ROUTES = {
    "/v1/embeddings": "OpenAI's embeddings API (the openai client)",
    "/v1/rerank": "the rerank API of infinity, Cohere and Jina (their clients)",
    "/metrics": "Prometheus text for a scraper",
}
# The arguments each SDK method needs (the rest left at their defaults).
CALLS = {
    "classify": (("a text",), {}),
    "ner": (("a text",), {}),
    "embed": (("a text",), {}),
    "qa": (("a question?", "a context."), {}),
    "rerank": (("a query", ["a text"]), {}),
    "fill_mask": (("a [MASK] text",), {}),
    "embed_sparse": (("a text",), {}),
    "embed_all": (("a text",), {}),
    "zero_shot": (("a text", ["one", "two"]), {}),
}
SDK_GETS = {"health": "/health", "ready": "/ready", "info": "/info"}


class Sent(Exception):
    """Raised by the transport once the SDK's request is caught: the answer is not what is tested."""

    def __init__(self, request: httpx.Request):
        super().__init__(request.url.path)
        self.request = request


def _catch(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/info":  # the SDK asks how many inputs one request may carry
        return httpx.Response(200, json={"max_client_batch_size": 32})
    raise Sent(request)


def sent(method: str, *args, **kwargs) -> tuple[str, dict]:
    """(path, JSON body) of the one request an SDK method sends for these arguments."""
    client = Client("http://sdk.test", http_client=httpx.Client(transport=httpx.MockTransport(_catch)), max_retries=0)
    with pytest.raises(Sent) as caught:
        getattr(client, method)(*args, **kwargs)
    request = caught.value.request
    return request.url.path, json.loads(request.content)


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict:
    from serving.app import create_app
    from serving.settings import Settings

    checkpoint = build_checkpoint(tmp_path_factory.mktemp("sdk") / "multi")
    return create_app(Settings(model=str(checkpoint))).openapi()


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def request_schema(schema: dict, path: str) -> dict:
    """The object schema of a route's body (for a body that may also be a list of objects, the object)."""
    body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    body = _resolve(schema, body)
    for branch in body.get("anyOf", [body]):
        branch = _resolve(schema, branch)
        if branch.get("type") == "object" or "properties" in branch:
            return branch
        if branch.get("type") == "array":
            return _resolve(schema, branch["items"])
    raise AssertionError(f"{path}: no object body in {body}")


def response_types(schema: dict, path: str) -> set[str]:
    """The names of the component schemas a route's 200 answer is made of."""
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                if name not in found:
                    found.add(name)
                    walk(schema["components"]["schemas"][name])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema["paths"][path]["post"]["responses"]["200"])
    return found


def _json_type(node: dict) -> set[str]:
    """The JSON types a property may have, null aside (an SDK field may be optional where the server's is not)."""
    branches = node.get("anyOf", [node])
    return {b.get("type", "object") for b in branches} - {"null"}


@pytest.fixture(scope="module")
def routes(openapi) -> dict[str, str]:
    """SDK method -> the route it calls."""
    return {method: sent(method, *args, **kwargs)[0] for method, (args, kwargs) in CALLS.items()}


def test_every_sdk_method_is_tried():
    assert set(endpoint_names()) == set(CALLS), "a new SDK method needs its arguments in CALLS"


def test_every_server_route_is_an_sdk_method(openapi, routes):
    served = set(openapi["paths"])
    reached = set(routes.values()) | set(SDK_GETS.values())
    assert reached <= served, f"the SDK calls routes the server does not have: {sorted(reached - served)}"
    missing = served - reached - set(NOT_SDK_ROUTES)
    assert not missing, f"server routes the SDK has no method for: {sorted(missing)}"
    for name in SDK_GETS:
        assert callable(getattr(Client, name))


@pytest.mark.parametrize("method", sorted(CALLS))
def test_an_sdk_method_has_the_fields_and_defaults_of_its_route(openapi, routes, method):
    path = routes[method]
    body = request_schema(openapi, path)
    fields = body["properties"]
    required = set(body.get("required", []))
    parameters = {
        name: p for name, p in inspect.signature(getattr(Client, method)).parameters.items() if name != "self"
    }
    assert set(parameters) == set(fields), (
        f"{method}() and {path} differ: only in the SDK {sorted(set(parameters) - set(fields))}, only in the "
        f"server {sorted(set(fields) - set(parameters))}"
    )
    for name, parameter in parameters.items():
        if name in required:  # a positional parameter (None only where a list of items carries it: qa([...]))
            assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{method}({name}) is not positional"
            assert parameter.default in (inspect.Parameter.empty, None), f"{method}({name}=) has a default; {path} "
            "requires it"
            continue
        assert parameter.default is not inspect.Parameter.empty, f"{method}({name}) is required; {path} is not"
        assert parameter.default == fields[name].get("default"), (
            f"{method}({name}={parameter.default!r}) but {path}'s default is {fields[name].get('default')!r}"
        )
    args, kwargs = CALLS[method]
    sent_path, sent_body = sent(method, *args, **kwargs)
    items = sent_body if isinstance(sent_body, list) else [sent_body]
    for item in items:
        unknown = set(item) - set(fields)
        assert not unknown, f"{method}() sends fields {path} does not know: {sorted(unknown)}"
        for name, value in item.items():  # what is sent for a parameter left alone is the server's default
            if name in parameters and name not in required:
                assert value == fields[name].get("default"), f"{method}() sends {name}={value!r}"


@pytest.mark.parametrize("method", sorted(CALLS))
def test_an_sdk_method_takes_every_choice_its_route_offers(openapi, routes, method):
    path = routes[method]
    args, kwargs = CALLS[method]
    for name, node in request_schema(openapi, path)["properties"].items():
        choices = [c for branch in node.get("anyOf", [node]) for c in _resolve(openapi, branch).get("enum", [])]
        for choice in choices:
            _, body = sent(method, *args, **{**kwargs, name: choice})
            item = body[0] if isinstance(body, list) else body
            # a default may go unsent (the server's own default then applies): an older server never sees the field
            assert item.get(name, node.get("default")) == choice, f"{method}({name}={choice!r}) sent {item.get(name)!r}"


def shapes(node: dict, components: dict) -> set[str]:
    """A JSON schema as the shapes of value it allows: "Label", "array<Label>", "array<array<number>>" (a named
    object by its name, alternatives inside an array joined by |)."""
    if "$ref" in node:
        return {node["$ref"].rsplit("/", 1)[-1]}
    if "anyOf" in node:
        return set().union(*(shapes(branch, components) for branch in node["anyOf"]))
    if node.get("type") == "array":
        return {"array<" + "|".join(sorted(shapes(node.get("items", {}), components))) + ">"}
    return {"integer" if node.get("type") == "integer" else node.get("type", "object")}


@pytest.mark.parametrize("method", sorted(CALLS))
def test_an_sdk_method_answers_the_shapes_its_route_answers(openapi, routes, method):
    answer = openapi["paths"][routes[method]]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    ours = pydantic.TypeAdapter(typing.get_type_hints(getattr(Client, method))["return"]).json_schema(
        mode="serialization"
    )
    missing = shapes(answer, openapi["components"]["schemas"]) - shapes(ours, ours.get("$defs", {}))
    assert not missing, f"{routes[method]} answers shapes {method}() does not parse into: {sorted(missing)}"


@pytest.mark.parametrize("method", sorted(CALLS))
def test_an_sdk_result_type_has_the_fields_of_the_servers_answer(openapi, routes, method):
    for name in response_types(openapi, routes[method]):
        server = openapi["components"]["schemas"][name]
        sdk = getattr(types, name, None)
        assert sdk is not None, f"{routes[method]} answers {name}; bertserve_client.types has no {name}"
        ours = sdk.model_json_schema(mode="serialization")
        assert set(ours["properties"]) == set(server["properties"]), (
            f"{name}: only in the SDK {sorted(set(ours['properties']) - set(server['properties']))}, only in the "
            f"server {sorted(set(server['properties']) - set(ours['properties']))}"
        )
        for field, node in server["properties"].items():
            assert _json_type(ours["properties"][field]) == _json_type(node), f"{name}.{field}"
        # a field the server always sends may be optional in the SDK (an older server), never the reverse
        assert set(ours.get("required", [])) <= set(server.get("required", [])), name


def test_the_sdk_info_reads_fields_the_server_sends(openapi):
    server = openapi["components"]["schemas"]["Info"]["properties"]
    ours = types.Info.model_json_schema(mode="serialization")["properties"]
    assert set(ours) <= set(server), f"Info fields the server never sends: {sorted(set(ours) - set(server))}"
    for field in ours:
        assert _json_type(ours[field]) == _json_type(server[field]), f"Info.{field}"


def test_the_sdk_imports_nothing_of_the_server():
    import bertserve_client

    ours = re.compile(r"^\s*(from|import)\s+(bert|serving|batch|export|training|runtime)\b(?!serve)", re.M)
    for path in Path(bertserve_client.__file__).parent.glob("*.py"):
        found = ours.search(path.read_text(encoding="utf-8"))
        assert not found, f"{path.name} imports the server's code: {found.group(0).strip()}"
