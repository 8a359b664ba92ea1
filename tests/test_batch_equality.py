"""python -m batch's answers are the references': embed equals sentence-transformers' normalized encode on
all-MiniLM-L6-v2 (SQuAD sentences: 200 by default, 20,000 with BERTSERVE_TEST_FULL=1), and classify, ner and
qa rows equal what a real `python -m serving` answers for the same rows on the demo model (40, 40 and 20 rows by
default; 1,000 of each with BERTSERVE_TEST_FULL=1)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("pyarrow")

from batch import Predictor  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "serving" / "demo_model"
FULL = os.environ.get("BERTSERVE_TEST_FULL") == "1"


def squad_sentences(data_dir: Path, count: int) -> list[str]:
    from bert.tasks.qa import read_squad_articles
    from bert.tasks.rerank import sentence_spans

    sentences: list[str] = []
    for article in read_squad_articles(sorted((data_dir / "squad-train").glob("train-v1.1.part-*.json.gz"))):
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            sentences.extend(context[a:b] for a, b in sentence_spans(context) if context[a:b].strip())
            if len(sentences) >= count:
                return sentences[:count]
    return sentences


def squad_questions(data_dir: Path, count: int) -> list[dict]:
    from bert.tasks.qa import read_squad_articles

    items = []
    for article in read_squad_articles(sorted((data_dir / "squad-train").glob("train-v1.1.part-*.json.gz"))):
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"][:1]:
                items.append({"question": qa["question"], "context": paragraph["context"]})
                if len(items) >= count:
                    return items
    return items


def conll_sentences(data_dir: Path, count: int) -> list[str]:
    sentences, words = [], []
    for line in (data_dir / "conll2003" / "valid.txt").read_text().splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append(" ".join(words))
                words = []
            continue
        words.append(line.split()[0])
    return [s for s in sentences if len(s) > 20][:count]


def test_embed_equals_sentence_transformers(minilm_dir, data_dir):
    st = pytest.importorskip("sentence_transformers")
    sentences = squad_sentences(data_dir, 20_000 if FULL else 200)
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(
        sentences, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
    )
    # sentence-transformers cuts a text at the model's 256 tokens; without --truncate the job refuses such a row
    # (2 of the 20,000)
    # fp32: --precision auto runs embed in bf16 on a CPU with AMX (cosine >= 0.99, not 1e-4)
    table = Predictor("embed", minilm_dir, truncate=True, precision="fp32")({"text": sentences})
    assert table["error"].null_count == len(sentences)
    ours = np.asarray(table["embedding"].to_pylist(), dtype=np.float32)
    worst = float(np.abs(ours - reference).max())
    print(f"embed of {len(sentences)} SQuAD sentences: max |batch - sentence-transformers| = {worst:.2e}")
    assert ours.shape == reference.shape and worst < 1e-4


@pytest.fixture(scope="module")
def demo_server():
    from test_serving_support import Server

    with Server("--model", str(DEMO)) as server:
        yield server


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4


def test_classify_ner_qa_equal_the_servers_answers(demo_server, data_dir, sst2_dev):
    n = 1000 if FULL else 40
    texts = [s for s, _ in sst2_dev[:n]]
    sentences = conll_sentences(data_dir, n)
    questions = squad_questions(data_dir, n if FULL else n // 2)
    with httpx.Client(base_url=demo_server.url, timeout=120) as client:

        def post(path, body):
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            return response.json()

        served_classify = [post("/classify", {"inputs": texts[i : i + 16]}) for i in range(0, len(texts), 16)]
        served_ner = [post("/ner", {"inputs": sentences[i : i + 16]}) for i in range(0, len(sentences), 16)]
        served_qa = [post("/qa", questions[i : i + 8]) for i in range(0, len(questions), 8)]
    served_classify = [x for chunk in served_classify for x in chunk]
    served_ner = [x for chunk in served_ner for x in chunk]
    served_qa = [x for chunk in served_qa for x in chunk]

    rows = Predictor("classify", DEMO)({"text": texts}).to_pylist()
    for row, answer in zip(rows, served_classify, strict=True):
        assert row["error"] is None and row["label"] == answer[0]["label"] and _close(row["score"], answer[0]["score"])

    rows = Predictor("ner", DEMO)({"text": sentences}).to_pylist()
    entities = 0
    for row, answer in zip(rows, served_ner, strict=True):
        assert row["error"] is None and len(row["entities"]) == len(answer), (row, answer)
        for ours, theirs in zip(row["entities"], answer):
            assert {k: ours[k] for k in ("start", "end", "word", "entity_group")} == {
                k: theirs[k] for k in ("start", "end", "word", "entity_group")
            }
            assert _close(ours["score"], theirs["score"])
            entities += 1
    assert entities > len(sentences) // 2  # the rows hold entities to compare

    columns = {"question": [q["question"] for q in questions], "context": [q["context"] for q in questions]}
    rows = Predictor("qa", DEMO)(columns).to_pylist()
    for row, answer in zip(rows, served_qa, strict=True):
        assert row["error"] is None
        assert (row["answer"], row["start"], row["end"]) == (answer["answer"], answer["start"], answer["end"])
        assert _close(row["score"], answer["score"])
    print(
        f"equal to the server: classify {len(texts)} rows, ner {len(sentences)} rows ({entities} entities), qa {len(rows)}"
    )
