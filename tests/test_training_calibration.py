"""The calibration text a trained checkpoint holds (training/calibration.py): the inputs as the model saw them,
read back by export's reader, bounded as export's search costs them."""

from __future__ import annotations

import json
from pathlib import Path

from bert.tasks.common import Features
from bert.tokenizer import BertTokenizer
from export.samples import read_calibration
from training.calibration import calibration_lines, merged

DEMO = Path(__file__).resolve().parents[1] / "serving" / "demo_model"


def features(tokenizer, inputs) -> list[Features]:
    return [Features(e.ids, e.type_ids) for e in tokenizer.encode_batch(inputs)]


def test_texts_pairs_and_ranked_groups_come_back_as_export_reads_them(tmp_path):
    tokenizer = BertTokenizer.from_dir(DEMO)
    texts = ["a film of quiet charm.", "the plot never takes off!"]
    # each input once, decoded as the model saw it (uncased)
    assert calibration_lines(tokenizer, features(tokenizer, ["A film of quiet charm.", *texts, texts[1]])) == [
        json.dumps(t) for t in texts
    ]
    queries = [(f"question {q}?", f"candidate text {q} {t}.") for q in range(100) for t in range(8)]
    lines = calibration_lines(tokenizer, features(tokenizer, [*texts, *texts, *queries]), limit=256)
    path = tmp_path / "calibration.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    found = read_calibration(path)
    assert found["sentences"] and set(found["sentences"]) <= set(texts)
    assert len(found["sentences"]) + len(found["pairs"]) == 256  # spread over the 802 distinct inputs
    assert set(found["pairs"]) <= set(queries) and len(set(found["pairs"])) == len(found["pairs"])
    # a query with several texts is a ranked group too, and the groups hold `limit` texts in all (export runs each)
    groups = [json.loads(line) for line in lines if line.startswith("{")]
    assert sum(len(g["texts"]) for g in groups) == 256 and all(len(g["texts"]) == 8 for g in groups)
    assert {g["query"] for g in groups} < {q for q, _ in queries}


def test_a_multi_task_run_shares_the_limit_between_its_tasks():
    one = "".join(f'"text {i}"\n' for i in range(300))
    two = "".join(f'["question {i}", "context {i}"]\n' for i in range(300))
    lines = merged([one, None, two], limit=256).splitlines()
    assert len(lines) == 256 and sum(line.startswith("[") for line in lines) == 128
    assert merged([None, None]) is None
