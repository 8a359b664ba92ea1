"""training.multitask on a tiny random backbone (hidden 32, 2 layers) with the MiniLM tokenizer: mixed
single-task batches, per-task losses that go down, and an end-to-end run whose output loads back as a
BertForMultiTask with three heads, sharded in fp16, with metrics for all three tasks."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from training import multitask
from training.config import ConfigError

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 128, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
POSITIVE = "good great fun happy warm".split()
NEGATIVE = "bad awful boring sad cold".split()
FILLER = "the film movie plot was is and it this very".split()


@pytest.fixture(scope="module")
def assets(tmp_path_factory, minilm_dir):
    """A tiny random BertModel saved with the MiniLM tokenizer, and a few lines of each dataset."""
    from bert.checkpoint import save_checkpoint
    from bert.config import BertConfig
    from bert.model import BertModel
    from bert.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("multitask")
    vocab = BertTokenizer.from_dir(minilm_dir).vocab_size
    torch.manual_seed(0)
    save_checkpoint(BertModel(BertConfig(vocab_size=vocab, **TINY)), root / "backbone", tokenizer=minilm_dir)
    rng = random.Random(0)

    def sentence(label):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        return " ".join(words)

    for name, n in (("train.tsv", 24), ("dev.tsv", 8)):
        rows = [(sentence(i % 2), i % 2) for i in range(n)]
        (root / name).write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    conll = []
    for _ in range(16):
        words = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))]
        tags = ["O"] * len(words)
        i = rng.randint(0, len(words))
        kind, entity = rng.choice([("PER", ["john", "smith"]), ("LOC", ["paris"]), ("ORG", ["acme", "corp"])])
        words[i:i] = entity
        tags[i:i] = [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
        conll.append("\n".join(f"{w} X X {t}" for w, t in zip(words, tags)))
    (root / "ner.txt").write_text("-DOCSTART- -X- -X- O\n\n" + "\n\n".join(conll) + "\n")
    articles = []
    for a, (city, person) in enumerate([("paris", "john"), ("london", "mary"), ("berlin", "peter"),
                                        ("rome", "anna"), ("madrid", "paul")]):
        context = f"{person} lives in {city} . the weather in {city} is warm and {person} likes it ."
        qas = [{"id": f"{a}-{q}", "question": question,
                "answers": [{"text": answer, "answer_start": context.index(answer)}]}
               for q, (question, answer) in enumerate([("where does the person live ?", city),
                                                       ("who lives there ?", person),
                                                       ("how is the weather ?", "warm")])]
        articles.append({"title": city, "paragraphs": [{"context": context, "qas": qas}]})
    (root / "squad.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    return root


def argv(root: Path, out: Path, *extra: str) -> list[str]:
    return ["--ckpt", str(root / "backbone"), "--classify-train", str(root / "train.tsv"),
            "--classify-eval", str(root / "dev.tsv"), "--classify-labels", "0,1", "--classify-label-names", "negative,positive",
            "--ner-train", str(root / "ner.txt"), "--ner-eval", str(root / "ner.txt"),
            "--qa-train", str(root / "squad.json"), "--heldout-articles", "1",
            "--classify-max-seq-length", "32", "--ner-max-seq-length", "32", "--qa-max-seq-length", "64",
            "--max-query-length", "16", "--doc-stride", "16", "--batch-size", "4", "--eval-batch-size", "8",
            "--learning-rate", "1e-3", "--warmup-steps", "0", "--device", "cpu", "--torch-threads", "1",
            "--no-progress", "--output-dir", str(out), *extra]


def test_batches_single_task_and_weighted(assets):
    from bert.tokenizer import BertTokenizer

    cfg = multitask.parse_config(multitask.MultiTaskConfig, argv(assets, assets / "unused"))
    tokenizer = BertTokenizer.from_dir(assets / "backbone")
    parts = {t: multitask.prepare(cfg.task_config(t), tokenizer)[0] for t in cfg.tasks()}
    data = multitask.MultiTaskData(parts, seed=1)
    batches = data.batches(0)
    assert len(batches) == sum(len(p.batches(0)) for p in parts.values())
    assert batches == data.batches(0) and batches != data.batches(1)  # a pure function of the epoch
    kinds = [data.collate(sorted(b))["task"] for b in batches]
    assert {k: kinds.count(k) for k in parts} == {t: len(p.batches(0)) for t, p in parts.items()}
    weighted = multitask.MultiTaskData(parts, seed=1, weights={"classify": 1, "ner": 1, "qa": 2})
    kinds = [weighted.collate(sorted(b))["task"] for b in weighted.batches(0)]
    assert kinds.count("qa") == pytest.approx(len(kinds) / 2, abs=1)
    assert abs(len(kinds) - len(batches)) <= len(parts)  # same epoch length, up to rounding each share


def test_losses_finite_and_decreasing(assets):
    from bert.checkpoint import load_checkpoint
    from bert.model import BertForMultiTask
    from bert.tokenizer import BertTokenizer

    cfg = multitask.parse_config(multitask.MultiTaskConfig, argv(assets, assets / "unused"))
    tokenizer = BertTokenizer.from_dir(assets / "backbone")
    parts = {t: multitask.prepare(cfg.task_config(t), tokenizer)[0] for t in cfg.tasks()}
    labels = {"classify": ["negative", "positive"], "ner": ["O"] * 7, "qa": []}
    model, report = load_checkpoint(assets / "backbone", model_cls=BertForMultiTask, from_backbone=True,
                                    config_overrides={"task_labels": labels})
    assert {"classifier.weight", "token_classifier.weight", "qa_outputs.weight"} <= set(report.initialised)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = multitask.MultiTaskData(parts, seed=0)
    for task, offset in zip(data.tasks, data.offsets):
        batch = data.collate([offset + i for i in range(4)])  # the same batch every step
        assert batch["task"] == task
        losses = []
        for _ in range(6):
            loss = multitask.compute_loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        assert all(torch.isfinite(torch.tensor(losses))), (task, losses)
        assert losses[-1] < losses[0], (task, losses)


def test_end_to_end_fp16_shards(assets, tmp_path):
    from bert.checkpoint import INDEX_NAME, load_checkpoint, read_state_dict
    from bert.model import BertForMultiTask

    out = tmp_path / "run"
    assert multitask.main(argv(assets, out, "--max-steps", "6", "--eval-every", "3",
                               "--save-dtype", "fp16", "--max-shard-mb", "0.3")) == 0
    best = out / "best"
    model, report = load_checkpoint(best, model_cls=BertForMultiTask)
    assert not report and isinstance(model, BertForMultiTask)
    assert model.tasks == ["classify", "ner", "qa"]
    assert model.config.task_labels["classify"] == ["negative", "positive"]
    assert model.config.task_labels["ner"][0] == "O" and "B-PER" in model.config.task_labels["ner"]
    assert model.classifier.out_features == 2 and model.qa_outputs.out_features == 2
    out_ = model(torch.tensor([[101, 2204, 102]]))
    assert out_.classify_logits.shape == (1, 2) and out_.qa_start_logits.shape == (1, 3)

    index = json.loads((best / INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((best / s).is_file() for s in shards)
    from safetensors.torch import load_file
    for shard in shards:  # at most 0.3 MB, unless one tensor alone is bigger (the word embeddings)
        tensors = load_file(best / shard)
        assert (best / shard).stat().st_size <= 300_000 + 10_000 or len(tensors) == 1
    assert {v.dtype for v in read_state_dict(best).values() if v.is_floating_point()} == {torch.float16}
    assert {v.dtype for v in read_state_dict(out / "last").values() if v.is_floating_point()} == {torch.float32}
    assert (best / "vocab.txt").is_file() or (best / "tokenizer.json").is_file()

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and set(metrics["tasks"]) == {"classify", "ner", "qa"}
    final = metrics["best_checkpoint_eval"]
    assert {"accuracy"} <= set(final["classify"]) and "f1" in final["ner"] and "exact_match" in final["qa"]
    best_metrics = json.loads((best / "metrics.json").read_text())
    assert {"classify", "ner", "qa", "mean_score"} <= set(best_metrics)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in log if "loss" in r)


def test_resume_is_exact(assets, tmp_path):
    from bert.checkpoint import read_state_dict

    full, part = tmp_path / "full", tmp_path / "part"
    multitask.main(argv(assets, full, "--max-steps", "4", "--eval-every", "100", "--save-every", "2"))
    multitask.main(argv(assets, part, "--max-steps", "4", "--eval-every", "100", "--stop-at-step", "2"))
    multitask.main(argv(assets, part, "--max-steps", "4", "--eval-every", "100", "--resume", str(part / "last")))
    a, b = read_state_dict(full / "last"), read_state_dict(part / "last")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_flags_checked_before_work(assets):
    with pytest.raises(SystemExit):
        multitask.parse_config(multitask.MultiTaskConfig, ["--ckpt", str(assets / "backbone")])  # no task
    cfg = multitask.MultiTaskConfig(ckpt=str(assets / "backbone"), qa_train=str(assets / "squad.json"),
                                    task_weights=["qa=1", "ner=1"], save_dtype="int8", qa_max_seq_length=32,
                                    max_query_length=64)
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    message = str(e.value)
    assert "--qa-eval is required" in message or "--heldout-articles" in message
    assert "--task-weights" in message and "--save-dtype" in message and "qa_max_seq_length" in message
