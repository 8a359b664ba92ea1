"""The Hugging Face Inference API as `huggingface_hub.InferenceClient` speaks it, against a real server: at the
server's root (`POST /`, the served model's task) and per pipeline tag (`/hf/<tag>`) on a server of several tasks;
every answer equals what our own route answers, reshaped as the Inference API's clients parse it; other APIs' fields
accepted, refused in one JSON 4xx naming them where they ask for something we cannot do."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from test_compat_support import compat_models  # noqa: F401 - a fixture
from test_serving_support import REPO, Server

hub = pytest.importorskip("huggingface_hub")
DEMO = str(REPO / "serving" / "demo_model")
TIMEOUT = 60.0
TEXT = "My name is Wolfgang and I live in Berlin."


@pytest.fixture(scope="module")
def server(compat_models):  # noqa: F811
    with Server(
        "--model", DEMO, "--fill-mask-model", str(compat_models["mlm"]), "--zero-shot-model", str(compat_models["nli"])
    ) as running:
        yield running


def _client(url: str):
    return hub.InferenceClient(model=url, timeout=TIMEOUT)


def _ours(server, path: str, body):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def test_inference_client_at_the_root_gets_the_servers_first_task(server):
    answer = _client(server.url).text_classification("a gripping, beautifully shot film")
    ours = _ours(server, "/classify", {"inputs": "a gripping, beautifully shot film"})
    assert [(a.label, a.score) for a in answer] == [(o["label"], o["score"]) for o in ours]
    raw = _ours(server, "/", {"inputs": "a gripping, beautifully shot film"})
    assert raw == [ours]  # the Inference API's [[{label, score}]]


def test_inference_client_each_task_by_its_pipeline_tag(server):
    url = server.url + "/hf/"
    classes = _client(url + "text-classification").text_classification("awful", top_k=2)
    assert [c.label for c in classes] == [
        o["label"] for o in _ours(server, "/classify", {"inputs": "awful", "top_k": 2})
    ]

    entities = _client(url + "token-classification").token_classification(TEXT, aggregation_strategy="simple")
    ours = _ours(server, "/ner", {"inputs": TEXT, "aggregation": "simple"})
    assert [(e.entity_group, e.word, e.start, e.end) for e in entities] == [
        (o["entity_group"], o["word"], o["start"], o["end"]) for o in ours
    ]
    assert ours, "the demo model finds entities in the text"
    kept = _client(url + "token-classification").token_classification(TEXT, ignore_labels=[ours[0]["entity_group"]])
    assert all(e.entity_group != ours[0]["entity_group"] for e in kept)

    answer = _client(url + "question-answering").question_answering("Where do I live?", TEXT, doc_stride=32)
    ours = _ours(server, "/qa", {"question": "Where do I live?", "context": TEXT, "doc_stride": 32})
    assert (answer.answer, answer.start, answer.end) == (ours["answer"], ours["start"], ours["end"])

    vector = _client(url + "feature-extraction").feature_extraction("hello there", normalize=True, truncate=False)
    np.testing.assert_allclose(vector, _ours(server, "/embed", {"inputs": "hello there"}), atol=1e-6)

    scores = _client(url + "sentence-similarity").sentence_similarity("a cat", ["a cat", "the stock market fell"])
    vectors = _ours(server, "/embed", {"inputs": ["a cat", "a cat", "the stock market fell"]})
    expected = [sum(a * b for a, b in zip(vectors[0], v)) for v in vectors[1:]]
    assert scores == pytest.approx(expected, abs=1e-6) and scores[0] == pytest.approx(1.0, abs=1e-5)

    masks = _client(url + "fill-mask").fill_mask("Paris is the [MASK] of France.", top_k=3)
    ours = _ours(server, "/fill-mask", {"inputs": "Paris is the [MASK] of France.", "top_k": 3})
    assert [(m.token, m.token_str, m.sequence) for m in masks] == [
        (o["token"], o["token_str"], o["sequence"]) for o in ours[0]
    ]  # one mask: a flat list

    labels = ["sports", "cooking", "politics"]
    zero = _client(url + "zero-shot-classification").zero_shot_classification(
        "We won the match.", labels, multi_label=True, hypothesis_template="It is about {}."
    )
    ours = _ours(
        server,
        "/zero-shot",
        {
            "inputs": "We won the match.",
            "candidate_labels": labels,
            "multi_label": True,
            "hypothesis_template": "It is about {}.",
        },
    )
    assert [(z.label, z.score) for z in zero] == list(zip(ours["labels"], ours["scores"]))


def test_the_root_takes_each_task_its_body_names(server):
    client = _client(server.url)
    answer = client.question_answering("Where do I live?", TEXT)
    assert answer.answer == _ours(server, "/qa", {"question": "Where do I live?", "context": TEXT})["answer"]
    assert len(client.sentence_similarity("a", ["a", "b"])) == 2
    assert client.feature_extraction("hello", normalize=False).shape == (
        1,
        384 if False else len(_ours(server, "/embed", {"inputs": "hello"})[0]),
    )
    zero = client.zero_shot_classification("We won.", ["sports", "cooking"])
    assert sorted(z.label for z in zero) == ["cooking", "sports"]


def test_a_masked_lm_alone_answers_fill_mask_at_its_root(compat_models):  # noqa: F811
    with Server("--model", str(compat_models["mlm"])) as server:
        masks = _client(server.url).fill_mask("The [MASK] sat on the [MASK].")
        assert len(masks) == 2 and all(len(m) == 5 for m in masks)  # two masks: one list each
        assert len(_client(server.url).fill_mask("The cat [MASK].")) == 5


@pytest.mark.parametrize(
    "path, body, status, names",
    [
        (
            "/hf/text-classification",
            {"inputs": "a", "parameters": {"top_k": 1}, "options": {"wait_for_model": True}},
            200,
            None,
        ),
        ("/hf/fill-mask", {"inputs": "a [MASK]", "parameters": {"targets": ["b"]}}, 422, "parameters.targets"),
        (
            "/hf/question-answering",
            {"inputs": {"question": "q", "context": "c"}, "parameters": {"handle_impossible_answer": True}},
            422,
            "parameters.handle_impossible_answer",
        ),
        ("/hf/question-answering", {"inputs": "no object"}, 422, "inputs"),
        ("/hf/text-classification", {"inputs": "a", "parameters": {"top_k": "2"}}, 422, "parameters.top_k"),
        ("/hf/text-classification", {"inputs": "a", "parameters": {"bogus": 1}}, 422, "parameters.bogus"),
        ("/hf/text-classification", {"inputs": "a", "extra": 1}, 422, "extra"),
        ("/hf/text-classification", {"inputs": "a", "options": {"nope": 1}}, 422, "options.nope"),
        ("/hf/feature-extraction", {"inputs": "a", "truncation_direction": "middle"}, 422, "truncation_direction"),
        ("/hf/feature-extraction", {"inputs": "a", "truncation_direction": "left", "truncate": True}, 200, None),
        ("/hf/feature-extraction", {"inputs": "a", "parameters": {"prompt_name": "nope"}}, 422, "prompt_name"),
        ("/hf/feature-extraction", {"inputs": "a", "truncation_direction": "right", "truncate": True}, 200, None),
        ("/hf/feature-extraction", {"inputs": "a", "encoding_format": "base64"}, 422, "encoding_format"),
        ("/hf/text-generation", {"inputs": "a"}, 404, "text-generation"),
        ("/hf/text-classification", {"inputs": ""}, 400, "inputs"),
        ("/hf/text-classification", {"inputs": []}, 422, "inputs"),
        ("/hf/zero-shot-classification", {"inputs": "a"}, 422, "candidate_labels"),
        ("/", [1, 2], 422, "body"),
        ("/", {"parameters": {}}, 422, "inputs"),
        ("/hf/sentence-similarity", {"inputs": {"source_sentence": "a", "sentences": "b"}}, 422, "inputs"),
    ],
)
def test_fields_of_other_apis_are_taken_or_refused_by_name(server, path, body, status, names):
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    if status != 200:
        assert set(response.json()) == {"error", "error_type"} and names in response.json()["error"]
    assert httpx.get(server.url + "/ready", timeout=TIMEOUT).status_code == 200


def test_a_body_that_is_not_json_is_refused_as_json(server):
    response = httpx.post(server.url + "/", content=b"{nope", timeout=TIMEOUT)
    assert response.status_code == 422 and "not valid JSON" in response.json()["error"]
