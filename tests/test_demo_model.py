"""The built-in demo model: `python -m serving` with no model answers all three endpoints sensibly,
and what ships fits the repository budget (fp16 shards, under 50 MB in all)."""

from __future__ import annotations

import json

import httpx
import pytest
from test_serving_support import Server

from serving.settings import DEMO_MODEL_DIR

pytestmark = pytest.mark.skipif(
    not (DEMO_MODEL_DIR / "config.json").is_file(),
    reason="serving/demo_model/ is not in this build (recipes/demo.sh builds it)",
)


def test_demo_model_is_one_encoder_with_three_heads_in_fp16_under_50_mb():
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert config["architectures"] == ["BertForMultiTask"]
    assert sorted(config["task_labels"]) == ["classify", "ner", "qa"]
    assert config["task_labels"]["classify"] == ["negative", "positive"]
    assert {"B-PER", "I-PER", "B-ORG", "B-LOC", "B-MISC"} <= set(config["task_labels"]["ner"])
    files = [p for p in DEMO_MODEL_DIR.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 50 * 2**20
    index = json.loads((DEMO_MODEL_DIR / "model.safetensors.index.json").read_text())
    from safetensors import safe_open

    for shard in set(index["weight_map"].values()):
        with safe_open(DEMO_MODEL_DIR / shard, "np") as f:
            assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"F16"}


@pytest.fixture(scope="module")
def demo_server():
    with Server() as server:  # no --model: the demo model
        yield server


def test_no_argument_server_serves_the_demo_model(demo_server):
    info = httpx.get(demo_server.url + "/info").json()
    assert info["tasks"] == ["classify", "ner", "qa", "embed"]
    labels = httpx.post(
        demo_server.url + "/classify",
        json={
            "inputs": [
                "A moving, beautifully acted film that I would happily watch again.",
                "A dull, lifeless mess with no redeeming qualities.",
            ]
        },
    ).json()
    assert [answer[0]["label"] for answer in labels] == ["positive", "negative"]
    text = "Angela Merkel met Emmanuel Macron in Paris on Tuesday to discuss the European Union budget."
    entities = httpx.post(demo_server.url + "/ner", json={"inputs": text}).json()
    found = {(text[e["start"] : e["end"]], e["entity_group"]) for e in entities}
    assert {("Angela Merkel", "PER"), ("Emmanuel Macron", "PER"), ("Paris", "LOC")} <= found, found
    context = (
        "The Amazon rainforest covers much of the Amazon basin of South America. The majority of the "
        "forest is contained within Brazil, with 60% of the rainforest, followed by Peru with 13%."
    )
    answer = httpx.post(
        demo_server.url + "/qa", json={"question": "Which country contains most of the forest?", "context": context}
    ).json()
    assert answer["answer"] == "Brazil" and context[answer["start"] : answer["end"]] == "Brazil"


NER_SENTENCES = [  # the README's, and a sentence whose word pieces the old default split ("mu", "##sk")
    "My name is Wolfgang and I live in Berlin.",
    "Angela Merkel met Emmanuel Macron in Paris.",
    "Elon Musk said Tesla will open a factory in Berlin.",
]


def test_ner_default_gives_whole_words_as_written(demo_server):
    """Issue 13, bar 2: with no aggregation given, every entity is whole words, its `word` the text as written."""
    answers = httpx.post(demo_server.url + "/ner", json={"inputs": NER_SENTENCES}).json()
    print({text: [(e["entity_group"], e["word"]) for e in entities] for text, entities in zip(NER_SENTENCES, answers)})
    for text, entities in zip(NER_SENTENCES, answers):
        assert entities, text
        for e in entities:
            assert e["word"] == text[e["start"] : e["end"]]  # original casing, original spacing
            assert e["start"] == 0 or not text[e["start"] - 1].isalnum(), (text, e)  # begins at a word start
            assert e["end"] == len(text) or not text[e["end"]].isalnum(), (text, e)  # ends at a word end
            assert not e["word"].startswith("##") and e["word"][0].isupper(), e
    words = {e["word"] for entities in answers for e in entities}
    assert {"Wolfgang", "Berlin", "Angela Merkel", "Paris", "Tesla"} <= words, words


def test_embed_beside_the_heads_and_its_quality_in_info(demo_server):
    info = httpx.get(demo_server.url + "/info").json()
    assert info["embedding"]["dimensions"] == 384 and info["embedding"]["quality"]["recall_at_1"]
    vectors = httpx.post(demo_server.url + "/embed", json={"inputs": ["a film", "a movie"]}).json()
    assert len(vectors) == 2 and abs(sum(x * x for x in vectors[0]) - 1) < 1e-5
