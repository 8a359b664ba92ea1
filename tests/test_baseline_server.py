"""The benchmarks' baseline server (bench/baseline_server.py): what a user would write with transformers. Its /qa
must answer where a transformers release ships no question-answering pipeline (5.17 and 5.24 do not)."""

from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "serving" / "demo_model"

pytest.importorskip("transformers")


def test_the_baseline_answers_questions_with_a_span_of_the_context():
    from fastapi.testclient import TestClient

    from bench.baseline_server import create_app

    context = "The novel Pride and Prejudice was written by Jane Austen and published in 1813 in London."
    with TestClient(create_app(str(DEMO), "qa")) as client:
        answer = client.post("/qa", json={"question": "Who wrote Pride and Prejudice?", "context": context}).json()
        assert 0 < answer["score"] <= 1
        assert 0 <= answer["start"] < answer["end"] <= len(context)
        assert answer["answer"] == context[answer["start"] : answer["end"]]
        assert "Austen" in answer["answer"]
        long_context = "Nothing happened on that day. " * 200 + context  # past one window: the windows are searched
        answer = client.post("/qa", json={"question": "Who wrote Pride and Prejudice?", "context": long_context})
        assert "Austen" in answer.json()["answer"]
