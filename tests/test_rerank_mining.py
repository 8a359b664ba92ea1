"""Hard negatives mined by a bi-encoder (training.mine_rerank) and the listwise rerank loss (bert/tasks/rerank.py)."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_serving_support import PYTHON, REPO, minilm_dir

from bert.tasks import rerank
from training import mine_rerank

CAT = "The cat eats fish every morning. Stock markets fell sharply in 1929. A cat sleeps most of the day."
DOG = "The dog eats meat. Dogs bark at night."


def _article(title: str, paragraphs: list[tuple[str, list[tuple[str, str]]]]) -> dict:
    """paragraphs: (context, [(question, answer text)]); each answer starts at its first occurrence."""
    return {
        "title": title,
        "paragraphs": [
            {
                "context": context,
                "qas": [
                    {
                        "id": f"{title}-{i}-{j}",
                        "question": q,
                        "answers": [{"text": a, "answer_start": context.index(a)}],
                    }
                    for j, (q, a) in enumerate(qas)
                ],
            }
            for i, (context, qas) in enumerate(paragraphs)
        ],
    }


ARTICLES = [
    _article("pets", [(CAT, [("What does the cat eat?", "fish")]), (DOG, [("What do dogs do at night?", "bark")])]),
    _article(
        "rivers",
        [
            (
                "The Volga flows east. The Rhine flows north. Rivers carry water.",
                [("Where does the Volga flow?", "east")],
            )
        ],
    ),
    _article("held", [("Held out text. Never mined here.", [("Which text is held?", "Held out")])]),
]


def _squad(tmp_path):
    path = tmp_path / "squad.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"version": "1.1", "data": ARTICLES}, f)
    return path


def _bag_of_words(texts: list[str]) -> np.ndarray:
    """A hand-checkable encoder: unit vectors of lower-cased word counts over a fixed vocabulary."""
    vocab = sorted(
        {
            w
            for a in ARTICLES
            for p in a["paragraphs"]
            for w in rerank.WORD.findall((p["context"] + " " + " ".join(q["question"] for q in p["qas"])).lower())
        }
    )
    index = {w: i for i, w in enumerate(vocab)}
    vectors = np.zeros((len(texts), len(vocab)), dtype=np.float32)
    for row, text in enumerate(texts):
        for w in rerank.WORD.findall(text.lower()):
            vectors[row, index[w]] += 1
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def test_the_miner_keeps_the_best_scored_sentences_of_the_article_that_are_not_the_answers():
    mined = mine_rerank.mine(ARTICLES[:2], _bag_of_words, depth=2, progress=False)
    pets = mined["articles"][0]["sentences"]
    assert pets == [
        "The cat eats fish every morning.",
        "Stock markets fell sharply in 1929.",
        "A cat sleeps most of the day.",
        "The dog eats meat.",
        "Dogs bark at night.",
    ]  # the article's sentences across paragraphs, cut as evals.embed_quality cuts them
    cat = mined["questions"][0]
    assert cat["question"] == "What does the cat eat?" and cat["gold"] == 0 and cat["gold_rank"] == 1
    # "what does the cat eat": shares "the", "cat" with sentence 2 and "the" with 3 ... and nothing with 1 (or 4).
    assert cat["negatives"] == [2, 3]
    dogs = mined["questions"][1]
    assert dogs["gold"] == 4 and dogs["negatives"][0] != 4 and len(dogs["negatives"]) == 2
    volga = mined["questions"][2]
    assert (volga["article"], volga["gold"], volga["negatives"]) == (1, 0, [1, 2])
    queries = rerank.mined_queries(mined, 2)
    assert [q.query for q in queries] == [
        "What does the cat eat?",
        "Where does the Volga flow?",
        "What do dogs do at night?",
    ]
    assert queries[0].texts == [pets[0], pets[2], pets[3]] and queries[0].labels == [1.0, 0.0, 0.0]
    assert len(rerank.mined_queries(mined, 3)) == 0  # fewer mined than asked: left out, so groups stay equal


def test_an_interrupted_mining_continues_where_it_was():
    states = []
    whole = mine_rerank.mine(ARTICLES[:2], _bag_of_words, depth=2, progress=False, checkpoint=states.append)
    assert [s["mined"] for s in states] == [1, 2]
    first = json.loads(json.dumps(states[0]))  # as kept on disk
    calls = []

    def counted(texts):
        calls.append(texts)
        return _bag_of_words(texts)

    assert mine_rerank.mine(ARTICLES[:2], counted, depth=2, progress=False, done=first) == whole
    assert calls[0][0] == "The Volga flows east."  # the first article was not encoded again


def test_the_mining_command_uses_minilm_never_reads_held_out_articles_and_keeps_its_file(tmp_path):
    squad, out = _squad(tmp_path), tmp_path / "mined" / "mined.json"
    command = [PYTHON, "-m", "training.mine_rerank", "--squad", str(squad), "--heldout-articles", "1", "--depth", "2"]
    command += ["--model", str(minilm_dir()), "--threads", "1", "--device", "cpu", "--out", str(out)]
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    mined = json.loads(out.read_text())
    assert [a["title"] for a in mined["articles"]] == ["pets", "rivers"]
    assert mined["stats"]["questions"] == 3
    cat = mined["questions"][0]
    assert cat["gold"] == 0 and 1 not in cat["negatives"]  # the stock market is the least like a question on cats
    assert cat["negatives"][0] == 2  # MiniLM: the other sentence about the cat first
    # The same data named by a relative path from another directory is the same file: not mined again.
    relative = [str(squad.relative_to(tmp_path)) if part == str(squad) else part for part in command]
    again = subprocess.run(
        relative, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert again.returncode == 0 and "already mined" in again.stderr, again.stderr[-2000:]
    with pytest.raises(Exception, match="holding out 1 articles, not --heldout-articles 2"):
        rerank.read_mined(str(out), 2, set())
    with pytest.raises(Exception, match="held-out articles"):
        rerank.read_mined(str(out), 1, {"rivers"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize(
    "device, line",
    [
        ("cuda", "error: --device cuda: no CUDA device here (use cpu)"),
        ("cuda:1", "error: --device cuda:1: no CUDA device here (use cpu)"),
        ("gpu", "error: --device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ],
)
def test_mining_on_a_device_that_is_not_there_is_one_line_and_exit_2(tmp_path, device, line):
    out = tmp_path / "mined.json"
    command = [PYTHON, "-m", "training.mine_rerank", "--squad", str(_squad(tmp_path)), "--heldout-articles", "1"]
    result = subprocess.run(
        command + ["--model", str(tmp_path / "nowhere"), "--device", device, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [line]
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_training_run_on_a_device_that_is_not_there_is_refused_before_any_work():
    """The same rule as mining's (training.config.device_problem), in every training command's config."""
    for device, problem in [
        ("cuda", "device cuda: no CUDA device here (use cpu)"),
        ("cuda:x", "device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    ]:
        command = [PYTHON, "-m", "training.finetune", "--task", "classify", "--ckpt", "nowhere", "--train-data"]
        result = subprocess.run(
            command + ["nowhere.tsv", "--device", device], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2
        assert problem in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]


def test_listwise_loss_is_softmax_cross_entropy_over_each_querys_candidates():
    logits = torch.tensor([2.0, 0.0, -1.0, 0.5, 0.5, 3.0, 1.0]).view(-1, 1)
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]).view(-1, 1)
    queries = torch.tensor([4, 4, 4, 9, 9, 2, 2])  # the last query has no relevant candidate: adds nothing
    first = -math.log(math.exp(2) / (math.exp(2) + 1 + math.exp(-1)))
    second = math.log(2)
    got = rerank.listwise_loss(logits, labels, queries)
    assert got.item() == pytest.approx((first + second) / 2, abs=1e-6)
    task = rerank.TASK
    batch = task.collate_targets([(1.0, 0), (0.0, 0), (0.0, 0), (0.0, 1), (1.0, 1), (0.0, 2), (0.0, 2)], 8)
    batch["query_ids"] = queries
    assert task.loss({task.output_name("rerank"): logits}, batch).item() == pytest.approx(got.item())
    pointwise = task.loss({task.output_name("rerank"): logits}, task.collate_targets(labels.view(-1).tolist(), 8))
    assert pointwise.item() == pytest.approx(
        torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).item()
    )


def test_grouped_batches_hold_whole_queries():
    from training.task_data import FeatureData

    lengths = [5, 9, 3, 4, 7, 7, 2, 8, 6, 1, 3, 3]
    data = FeatureData([[0] * n for n in lengths], [0.0] * 12, "rerank", 6, 0, True, 0, 3)
    for epoch in range(3):
        batches = data.batches(epoch)
        assert len(batches) == 2 and sorted(i for b in batches for i in b) == list(range(12))
        for batch in batches:
            assert len(batch) == 6 and all(batch[k : k + 3] == list(range(batch[k], batch[k] + 3)) for k in (0, 3))
            assert batch[0] % 3 == 0 and batch[3] % 3 == 0


def test_listwise_options_are_checked():
    def cfg(**kw):
        base = dict(train_data="squad:x", eval_data="", heldout_articles=1, header="auto", batch_size=8)
        base.update(grad_accum_steps=1, rerank_loss="listwise", rerank_negatives=3, rerank_mined="m.json")
        return SimpleNamespace(**{**base, **kw})

    assert rerank.TASK.train_problems(cfg()) == []
    assert rerank.TASK.train_group_size(cfg()) == 4 and rerank.TASK.train_group_size(cfg(rerank_loss="pointwise")) == 1
    assert any("multiple of 4" in p for p in rerank.TASK.train_problems(cfg(batch_size=6)))
    assert any("needs --rerank-mined" in p for p in rerank.TASK.train_problems(cfg(rerank_mined="")))
    assert any("grad-accum" in p for p in rerank.TASK.train_problems(cfg(grad_accum_steps=2)))
    assert any("pointwise or listwise" in p for p in rerank.TASK.train_problems(cfg(rerank_loss="pairwise")))


def test_finetune_listwise_on_mined_negatives(tmp_path):
    """A tiny end-to-end run: mined queries of 1 + 1 candidates, listwise loss, batches of 2 queries; held-out
    MRR is reported on the squad: held-out article as without mining."""
    from bert.atomic import write_file_atomic

    squad = _squad(tmp_path)
    mined = mine_rerank.mine(ARTICLES[:2], _bag_of_words, depth=2, progress=False)
    write_file_atomic(tmp_path / "mined.json", json.dumps({"settings": {"heldout_articles": 1}, **mined}))
    out = tmp_path / "run"
    command = [PYTHON, "-m", "training.finetune", "--task", "rerank", "--init-preset", "tiny"]
    command += ["--tokenizer", str(minilm_dir()), "--output-dir", str(out), "--max-seq-length", "32"]
    command += [
        "--train-data",
        f"squad:{squad}",
        "--heldout-articles",
        "1",
        "--rerank-mined",
        str(tmp_path / "mined.json"),
    ]
    command += ["--rerank-negatives", "1", "--rerank-loss", "listwise", "--batch-size", "4", "--max-steps", "2"]
    command += ["--no-progress", "--torch-threads", "1", "--log-every", "1"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "6 training features" in done.stderr  # 3 questions x (1 + 1)
    metrics = json.loads((out / "best" / "metrics.json").read_text())
    assert "mrr" in json.dumps(metrics)
    losses = [json.loads(line).get("loss") for line in (out / "log.jsonl").read_text().splitlines()]
    assert [x for x in losses if x is not None], losses
