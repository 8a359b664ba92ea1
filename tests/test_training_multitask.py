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

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
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
    for a, (city, person) in enumerate(
        [("paris", "john"), ("london", "mary"), ("berlin", "peter"), ("rome", "anna"), ("madrid", "paul")]
    ):
        context = f"{person} lives in {city} . the weather in {city} is warm and {person} likes it ."
        qas = [
            {
                "id": f"{a}-{q}",
                "question": question,
                "answers": [{"text": answer, "answer_start": context.index(answer)}],
            }
            for q, (question, answer) in enumerate(
                [
                    ("where does the person live ?", city),
                    ("who lives there ?", person),
                    ("how is the weather ?", "warm"),
                ]
            )
        ]
        articles.append({"title": city, "paragraphs": [{"context": context, "qas": qas}]})
    (root / "squad.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    return root


def argv(root: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--ckpt",
        str(root / "backbone"),
        "--classify-train",
        str(root / "train.tsv"),
        "--classify-eval",
        str(root / "dev.tsv"),
        "--classify-labels",
        "0,1",
        "--classify-label-names",
        "negative,positive",
        "--ner-train",
        str(root / "ner.txt"),
        "--ner-eval",
        str(root / "ner.txt"),
        "--qa-train",
        str(root / "squad.json"),
        "--heldout-articles",
        "1",
        "--classify-max-seq-length",
        "32",
        "--ner-max-seq-length",
        "32",
        "--qa-max-seq-length",
        "64",
        "--max-query-length",
        "16",
        "--doc-stride",
        "16",
        "--batch-size",
        "4",
        "--eval-batch-size",
        "8",
        "--learning-rate",
        "1e-3",
        "--warmup-steps",
        "0",
        "--device",
        "cpu",
        "--torch-threads",
        "1",
        "--no-progress",
        "--output-dir",
        str(out),
        *extra,
    ]


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
    model, report = load_checkpoint(
        assets / "backbone", model_cls=BertForMultiTask, from_backbone=True, config_overrides={"task_labels": labels}
    )
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
    assert (
        multitask.main(
            argv(assets, out, "--max-steps", "6", "--eval-every", "3", "--save-dtype", "fp16", "--max-shard-mb", "0.3")
        )
        == 0
    )
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
    cfg = multitask.MultiTaskConfig(
        ckpt=str(assets / "backbone"),
        qa_train=str(assets / "squad.json"),
        task_weights=["qa=1", "ner=1"],
        save_dtype="int8",
        qa_max_seq_length=32,
        max_query_length=64,
        embed_weight=0.0,
    )
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    message = str(e.value)
    assert "--qa-eval is required" in message or "--heldout-articles" in message
    assert "--task-weights" in message and "--save-dtype" in message and "--qa-max-seq-length" in message
    assert "--embed-weight must be positive" in message


# ----------------------------------------------------------------------------- keeping the encoder's embeddings


def teacher_cosine(run: Path, teacher: Path, texts: list[str]) -> float:
    """Mean cosine between the embeddings of `texts` by run/last (full precision) and by the teacher."""
    from bert.checkpoint import load_checkpoint
    from bert.tasks import embed
    from bert.tokenizer import BertTokenizer
    from training.task_data import pooled_embeddings

    features = embed.encode(BertTokenizer.from_dir(teacher), texts, max_length=64, truncate=True)
    a, b = (pooled_embeddings(load_checkpoint(d)[0], features, "mean") for d in (run / "last", teacher))
    return float((torch.nn.functional.cosine_similarity(torch.from_numpy(a), torch.from_numpy(b))).mean())


def test_embedding_loss_is_zero_when_the_student_is_the_teacher(assets):
    from bert.checkpoint import load_checkpoint
    from bert.model import BertForMultiTask
    from bert.tokenizer import BertTokenizer

    x = torch.randn(5, 32)
    assert float(multitask.embedding_loss(x, x)) == pytest.approx(0.0, abs=1e-6)
    assert float(multitask.embedding_loss(x, 3 * x)) == pytest.approx(0.0, abs=1e-6)  # direction only
    assert float(multitask.embedding_loss(x, -x)) == pytest.approx(2.0, abs=1e-6)

    cfg = multitask.parse_config(multitask.MultiTaskConfig, argv(assets, assets / "unused"))
    tokenizer = BertTokenizer.from_dir(assets / "backbone")
    parts = {t: multitask.prepare(cfg.task_config(t), tokenizer)[0] for t in cfg.tasks()}
    targets = multitask.teacher_targets(
        multitask.load_teacher(str(assets / "backbone"), "cpu"), "mean", parts, batch_size=8
    )
    assert targets["classify"].segments is None and targets["ner"].segments is None  # the input itself
    assert targets["qa"].segments is not None  # the question alone
    assert len(targets["qa"].vectors) < len(parts["qa"])  # a question with several windows is embedded once
    labels = {"classify": ["negative", "positive"], "ner": ["O"] * 7, "qa": []}
    student, _ = load_checkpoint(
        assets / "backbone", model_cls=BertForMultiTask, from_backbone=True, config_overrides={"task_labels": labels}
    )
    student.set_pooling("mean")  # TINY has no dropout: in train mode too the student computes the teacher's function
    data = multitask.MultiTaskData(parts, seed=0, embed_targets=targets)
    for offset in data.offsets:
        batch = data.collate([offset + i for i in range(4)])
        assert "teacher_embedding" in batch
        plain = {k: v for k, v in batch.items() if k != "teacher_embedding" and not k.startswith("embed_")}
        with torch.no_grad():
            added = multitask.compute_loss(student, batch, embed_weight=10.0) - multitask.compute_loss(student, plain)
        assert float(added) == pytest.approx(0.0, abs=1e-5)


def test_the_teacher_keeps_the_embeddings_close(assets, tmp_path):
    """40 steps at a high learning rate move the encoder; with the teacher its embeddings stay nearer the
    teacher's, on held-out texts of every kind (sentences, questions, contexts)."""
    steps = ["--max-steps", "40", "--eval-every", "40", "--learning-rate", "3e-3"]
    multitask.main(argv(assets, tmp_path / "plain", *steps))
    multitask.main(
        argv(assets, tmp_path / "kept", *steps, "--embed-teacher", str(assets / "backbone"), "--embed-weight", "1")
    )
    texts = [
        "a warm and very good film",
        "the plot was boring",
        "john smith lives in paris",
        "where does the person live ?",
        "anna lives in rome . the weather in rome is warm and anna likes it .",
    ]
    plain = teacher_cosine(tmp_path / "plain", assets / "backbone", texts)
    kept = teacher_cosine(tmp_path / "kept", assets / "backbone", texts)
    print(f"mean cosine to the teacher: without it {plain:.4f}, with it {kept:.4f}")
    assert kept > plain + 0.05 and kept > 0.95, (plain, kept)

    reported = json.loads((tmp_path / "kept" / "metrics.json").read_text())["best_checkpoint_eval"]["embed"]
    assert set(reported["by_source"]) == {"classify", "ner", "qa_questions", "qa_contexts"}
    assert 0.95 < reported["teacher_cosine"] <= 1.0 + 1e-6 and reported["texts"] > 0
    assert "embed" not in json.loads((tmp_path / "plain" / "metrics.json").read_text())["last_eval"]


def test_resume_is_exact_with_the_teacher(assets, tmp_path):
    from bert.checkpoint import read_state_dict

    full, part = tmp_path / "full", tmp_path / "part"
    teacher = ["--embed-teacher", str(assets / "backbone"), "--max-steps", "6", "--eval-every", "100"]
    multitask.main(argv(assets, full, *teacher, "--save-every", "3"))
    multitask.main(argv(assets, part, *teacher, "--stop-at-step", "3"))
    multitask.main(argv(assets, part, *teacher, "--resume", str(part / "last")))
    a, b = read_state_dict(full / "last"), read_state_dict(part / "last")
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [
        [r["loss"] for r in map(json.loads, (d / "log.jsonl").read_text().splitlines()) if "loss" in r]
        for d in (full, part)
    ]
    assert losses[0] == losses[1]  # qa batches (a question forward of their own) included: 6 steps, 3 tasks


def test_config_records_the_teachers_pooling(assets, tmp_path):
    """A sentence-transformers teacher that pools the [CLS] state: the student is trained on, and its
    config.json records, that pooling; so a server pools it as it was trained."""
    import shutil

    from bert.tasks.embed import read_pooling

    teacher = tmp_path / "st-teacher"
    shutil.copytree(assets / "backbone", teacher)
    (teacher / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    (teacher / "1_Pooling").mkdir()
    (teacher / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    out = tmp_path / "run"
    assert (
        multitask.main(argv(assets, out, "--max-steps", "2", "--eval-every", "2", "--embed-teacher", str(teacher))) == 0
    )
    for directory in (out / "best", out / "last"):
        assert json.loads((directory / "config.json").read_text())["pooling"] == {"mode": "cls", "normalize": True}
        assert (read_pooling(directory).mode, read_pooling(directory).source) == ("cls", "config.json")
    # Without a teacher: the pooling the starting checkpoint declares (here none: mean, normalised).
    assert multitask.main(argv(assets, tmp_path / "plain", "--max-steps", "1", "--eval-every", "1")) == 0
    assert json.loads((tmp_path / "plain" / "best" / "config.json").read_text())["pooling"] == {
        "mode": "mean",
        "normalize": True,
    }


def bad_teachers(assets: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Name -> (teacher directory, what the one line must say)."""
    import shutil

    from bert.checkpoint import save_checkpoint
    from bert.config import BertConfig
    from bert.model import BertModel
    from bert.tokenizer import BertTokenizer

    vocab = BertTokenizer.from_dir(assets / "backbone").vocab_size
    save_checkpoint(
        BertModel(BertConfig(vocab_size=vocab, **dict(TINY, hidden_size=64))),
        root / "wide",
        tokenizer=assets / "backbone",
    )
    other_vocab = root / "other-vocab-tokenizer"
    other_vocab.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(vocab - 5)]
    (other_vocab / "vocab.txt").write_text("\n".join(words) + "\n")
    save_checkpoint(BertModel(BertConfig(vocab_size=vocab, **TINY)), root / "other-vocab", tokenizer=other_vocab)
    shutil.copytree(assets / "backbone", root / "sqrt-pooling")
    (root / "sqrt-pooling" / "modules.json").write_text(
        json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )
    (root / "sqrt-pooling" / "1_Pooling").mkdir()
    (root / "sqrt-pooling" / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_sqrt_len_tokens": True})
    )
    (root / "no-config").mkdir()
    return {
        "missing": (root / "nowhere", "not a directory"),
        "no-config": (root / "no-config", "holds no config.json"),
        "wider": (root / "wide", "64 dimensions, the student's 32"),
        "other-vocabulary": (root / "other-vocab", "vocabulary"),
        "unknown-pooling": (root / "sqrt-pooling", "pooling"),
    }


@pytest.mark.parametrize("case", ["missing", "no-config", "wider", "other-vocabulary", "unknown-pooling"])
def test_a_bad_teacher_is_one_line_and_exit_2(case, assets, tmp_path, capsys):
    from training.config import run

    teacher, problem = bad_teachers(assets, tmp_path)[case]
    out = tmp_path / "run"
    assert run(multitask.main, argv(assets, out, "--max-steps", "1", "--embed-teacher", str(teacher))) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --embed-teacher "), lines
    assert str(teacher) in lines[0] and problem in lines[0], lines[0]
    assert not out.exists()  # refused before any work


def test_a_bad_teacher_on_the_command_line(assets, tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.multitask",
            *argv(assets, tmp_path / "run", "--embed-teacher", str(tmp_path / "nowhere")),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: --embed-teacher ") and "Traceback" not in result.stderr
