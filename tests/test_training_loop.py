"""The training loop on tiny models: config validation, schedule, loss going down, checkpoints that
transformers loads, exact resume, evaluate reproducing metrics.json, and torchrun with two processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from training import evaluate as evaluate_cli
from training import finetune, pretrain
from training.loop import learning_rate_at

REPO = Path(__file__).resolve().parents[1]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = "good great fun happy warm love nice fine best clever".split()
NEGATIVE = "bad awful boring sad cold hate poor dull worst silly".split()
FILLER = (
    "the a film movie plot actor was is and it this very so quite rather story cast scene end music "
    "john paris london acme corp in of at with by on . , !"
).split()
TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "model_type": "bert",
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A ~70-token vocabulary, a hidden-32 model config, and small classify / NER / corpus files."""
    root = tmp_path_factory.mktemp("training-assets")
    tok = root / "tokenizer"
    tok.mkdir()
    (tok / "vocab.txt").write_text("\n".join(SPECIAL + POSITIVE + NEGATIVE + FILLER) + "\n")
    (tok / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (root / "tiny.json").write_text(json.dumps(TINY))
    rng = random.Random(0)

    def sentence(label):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 10))]
        for _ in range(3):
            words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        return " ".join(words)

    for name, n in (("train.tsv", 256), ("dev.tsv", 64)):
        rows = [(sentence(y), y) for y in (rng.randint(0, 1) for _ in range(n))]
        (root / name).write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    conll = []
    for _ in range(120):
        words = [rng.choice(FILLER[:20]) for _ in range(rng.randint(2, 6))]
        tags = ["O"] * len(words)
        i = rng.randint(0, len(words))
        kind, entity = rng.choice(
            [("PER", ["john"]), ("LOC", ["paris"]), ("LOC", ["london"]), ("ORG", ["acme", "corp"])]
        )
        words[i:i] = entity
        tags[i:i] = [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
        conll.append("\n".join(f"{w} X X {t}" for w, t in zip(words, tags)))
    (root / "ner.txt").write_text("-DOCSTART- -X- -X- O\n\n" + "\n\n".join(conll) + "\n")
    corpus = []
    for _ in range(24):
        corpus += [sentence(rng.randint(0, 1)) + " ." for _ in range(rng.randint(4, 10))] + [""]
    (root / "corpus.txt").write_text("\n".join(corpus))
    return root


def classify_args(assets, out, *extra):
    return [
        "--task",
        "classify",
        "--init-preset",
        str(assets / "tiny.json"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--train-data",
        str(assets / "train.tsv"),
        "--eval-data",
        str(assets / "dev.tsv"),
        "--output-dir",
        str(out),
        "--batch-size",
        "16",
        "--max-seq-length",
        "32",
        "--learning-rate",
        "3e-3",
        "--log-every",
        "1",
        "--no-progress",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--torch-threads",
        "1",
        *extra,
    ]


def losses(out) -> dict[int, float]:
    return {
        r["step"]: r["loss"] for r in map(json.loads, (Path(out) / "log.jsonl").read_text().splitlines()) if "loss" in r
    }


# ----------------------------------------------------------------------------- configuration


def test_learning_rate_schedule():
    lrs = [learning_rate_at(s, peak=1.0, warmup_steps=4, total_steps=12) for s in range(12)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == pytest.approx(1.0) and lrs[11] == pytest.approx(1 / 8)
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--task", "qa", "--max-seq-length", "64", "--max-query-length", "64"], "max_query_length + 3"),
        (["--task", "qa", "--max-seq-length", "128", "--doc-stride", "100"], "doc_stride"),
        (["--task", "ner", "--labels", "a,b"], "classify only"),
        (["--task", "classify", "--regression", "--labels", "a,b"], "contradict"),
        (["--task", "classify", "--batch-size", "10", "--grad-accum-steps", "3"], "divisible"),
        (["--task", "classify", "--precision", "fp16", "--device", "cpu"], "fp16 needs a GPU"),
        (["--task", "classify", "--doc-stride", "64"], "--doc-stride applies to --task qa only"),
    ],
)
def test_contradictory_finetune_options_fail_before_work(assets, tmp_path, capsys, flags, message):
    argv = [
        "--init-preset",
        str(assets / "tiny.json"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--train-data",
        "x",
        "--eval-data",
        "y",
        "--output-dir",
        str(tmp_path / "o"),
        *flags,
    ]
    with pytest.raises(SystemExit) as e:
        finetune.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_unknown_flags_are_rejected(capsys):
    with pytest.raises(SystemExit):
        finetune.main(["--task", "classify", "--learnin-rate", "1"])
    assert "unrecognized arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        pretrain.main(["--corpus", "nope.txt", "--vocab-size", "1000", "--max-predictions-per-seq", "200"])
    err = capsys.readouterr().err
    assert "does not exist" in err and "max_predictions_per_seq" in err


# ----------------------------------------------------------------------------- fine-tuning


def test_tiny_classify_run_learns_saves_and_evaluate_reproduces(assets, tmp_path, capsys):
    out = tmp_path / "cls"
    assert finetune.main(classify_args(assets, out, "--num-epochs", "6", "--eval-every", "16")) == 0
    seen = losses(out)
    first, last = sum(list(seen.values())[:5]) / 5, sum(list(seen.values())[-5:]) / 5
    assert last < first * 0.7, (first, last)
    saved = json.loads((out / "best" / "metrics.json").read_text())
    assert saved["accuracy"] > 0.8
    capsys.readouterr()
    evaluate_cli.main(["--ckpt", str(out / "best"), "--data", str(assets / "dev.tsv")])
    printed = json.loads(capsys.readouterr().out)
    assert {k: printed[k] for k in printed} == {k: saved[k] for k in printed}
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        assert (out / "best" / name).is_file()


def test_tiny_checkpoint_loads_in_transformers(assets, tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    from bert.checkpoint import load_checkpoint

    out = tmp_path / "cls"
    finetune.main(classify_args(assets, out, "--max-steps", "3"))
    ours, _ = load_checkpoint(out / "last")
    theirs = transformers.BertForSequenceClassification.from_pretrained(out / "last").eval()
    ids = torch.tensor([[2, 10, 20, 30, 3, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-4
        )
    assert theirs.config.id2label == {0: "0", 1: "1"}


def test_tiny_ner_run_and_evaluate_reproduces(assets, tmp_path, capsys):
    out = tmp_path / "ner"
    argv = [
        "--task",
        "ner",
        "--init-preset",
        str(assets / "tiny.json"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--train-data",
        str(assets / "ner.txt"),
        "--eval-data",
        str(assets / "ner.txt"),
        "--output-dir",
        str(out),
        "--batch-size",
        "16",
        "--max-seq-length",
        "32",
        "--learning-rate",
        "3e-3",
        "--num-epochs",
        "4",
        "--no-progress",
        "--device",
        "cpu",
        "--torch-threads",
        "1",
    ]
    assert finetune.main(argv) == 0
    saved = json.loads((out / "best" / "metrics.json").read_text())
    assert saved["f1"] > 50
    capsys.readouterr()
    evaluate_cli.main(["--task", "ner", "--ckpt", str(out / "best"), "--data", str(assets / "ner.txt")])
    printed = json.loads(capsys.readouterr().out)
    assert printed["f1"] == saved["f1"] and printed["per_type"] == saved["per_type"]


def test_finetune_resume_reproduces_losses_exactly(assets, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    finetune.main(classify_args(assets, whole, "--max-steps", "24", "--eval-every", "8"))
    finetune.main(classify_args(assets, parts, "--max-steps", "24", "--eval-every", "8", "--stop-at-step", "12"))
    assert max(losses(parts)) == 12
    finetune.main(
        classify_args(assets, parts, "--max-steps", "24", "--eval-every", "8", "--resume", str(parts / "last"))
    )
    a, b = losses(whole), losses(parts)
    assert [a[s] for s in range(13, 23)] == [b[s] for s in range(13, 23)]  # bit-exact, not approximately


# ----------------------------------------------------------------------------- pretraining


def pretrain_args(assets, out, *extra):
    return [
        "--corpus",
        str(assets / "corpus.txt"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--preset",
        str(assets / "tiny.json"),
        "--output-dir",
        str(out),
        "--max-seq-length",
        "48",
        "--max-predictions-per-seq",
        "8",
        "--dupe-factor",
        "2",
        "--heldout-percent",
        "20",
        "--batch-size",
        "8",
        "--learning-rate",
        "2e-3",
        "--log-every",
        "1",
        "--no-progress",
        "--device",
        "cpu",
        "--max-eval-instances",
        "32",
        "--torch-threads",
        "1",
        *extra,
    ]


def test_pretrain_interrupted_and_resumed_matches_uninterrupted(assets, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    pretrain.main(pretrain_args(assets, whole, "--max-steps", "30", "--eval-every", "10"))
    pretrain.main(pretrain_args(assets, parts, "--max-steps", "30", "--eval-every", "10", "--stop-at-step", "10"))
    pretrain.main(
        pretrain_args(assets, parts, "--max-steps", "30", "--eval-every", "10", "--resume", str(parts / "last"))
    )
    a, b = losses(whole), losses(parts)
    assert [a[s] for s in range(11, 21)] == [b[s] for s in range(11, 21)]
    assert sum(a[s] for s in range(26, 31)) < sum(a[s] for s in range(1, 6))  # and it learns
    metrics = json.loads((whole / "metrics.json").read_text())["last_eval"]
    assert {"mlm_accuracy", "nsp_accuracy", "mlm_loss"} <= set(metrics)
    assert (whole / "best" / "vocab.txt").is_file()


def _torchrun(assets, out, *extra):
    # PYTHONFAULTHANDLER: a process that aborts in native code still prints where Python was
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "training.finetune",
        *classify_args(assets, out, "--max-steps", "8", "--eval-every", "4", *extra),
    ]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    # faulthandler's list of extension modules is long and says nothing here
    stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("Extension modules:"))
    assert done.returncode == 0, f"stdout: {done.stdout[-1000:]}\nstderr: {stderr[:3000]}\n...\n{stderr[-4000:]}"


def test_torchrun_two_processes_gloo_and_exact_resume(assets, tmp_path):
    whole, parts = tmp_path / "ddp", tmp_path / "ddp-parts"
    _torchrun(assets, whole)
    assert (whole / "best" / "metrics.json").is_file() and (whole / "last" / "trainer_state.json").is_file()
    assert max(losses(whole)) == 8
    _torchrun(assets, parts, "--stop-at-step", "4")
    assert (parts / "last" / "rng_rank1.pt").is_file()
    _torchrun(assets, parts, "--resume", str(parts / "last"))
    a, b = losses(whole), losses(parts)
    assert [a[s] for s in range(5, 9)] == [b[s] for s in range(5, 9)]


def test_ctrl_c_mid_step_saves_last_and_resume_is_exact(assets, tmp_path, monkeypatch):
    from training import task_data

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    args = ("--max-steps", "20", "--eval-every", "100", "--save-every", "100")
    finetune.main(classify_args(assets, whole, *args))
    original, calls = task_data.FeatureData.collate, {"n": 0}

    def interrupting(self, indices, rng=None):
        calls["n"] += 1
        if calls["n"] == 9:  # inside step 9, after step 8 completed (and no periodic save so far)
            raise KeyboardInterrupt
        return original(self, indices, rng)

    monkeypatch.setattr(task_data.FeatureData, "collate", interrupting)
    finetune.main(classify_args(assets, parts, *args))
    state = json.loads((parts / "last" / "trainer_state.json").read_text())
    assert state["step"] == 8 and state["reason"] == "interrupted"
    monkeypatch.setattr(task_data.FeatureData, "collate", original)
    finetune.main(classify_args(assets, parts, *args, "--resume", str(parts / "last")))
    a, b = losses(whole), losses(parts)
    assert [a[s] for s in range(9, 21)] == [b[s] for s in range(9, 21)]


def test_tiny_qa_run_with_heldout_articles_and_evaluate_reproduces(assets, tmp_path, capsys):
    import gzip

    rng = random.Random(5)
    articles = []
    for a in range(12):
        paragraphs = []
        for p in range(3):
            name = rng.choice(["john", "paris", "london", "acme"])
            context = " ".join(rng.choice(FILLER[:20]) for _ in range(rng.randint(20, 40)))
            start = len(context) + 1
            context = f"{context} {name} " + " ".join(rng.choice(FILLER[:20]) for _ in range(10))
            paragraphs.append(
                {
                    "context": context,
                    "qas": [
                        {
                            "id": f"{a}-{p}",
                            "question": "who is it ?",
                            "answers": [{"text": name, "answer_start": start}],
                        }
                    ],
                }
            )
        articles.append({"title": f"article {a}", "paragraphs": paragraphs})
    for part, chunk in ((1, articles[:6]), (2, articles[6:])):
        with gzip.open(tmp_path / f"train.part-0{part}.json.gz", "wt") as f:
            json.dump({"version": "1.1", "data": chunk}, f)
    out = tmp_path / "qa"
    argv = [
        "--task",
        "qa",
        "--init-preset",
        str(assets / "tiny.json"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--train-data",
        str(tmp_path),
        "--heldout-articles",
        "2",
        "--output-dir",
        str(out),
        "--max-seq-length",
        "32",
        "--doc-stride",
        "8",
        "--max-query-length",
        "8",
        "--batch-size",
        "8",
        "--learning-rate",
        "3e-3",
        "--max-steps",
        "10",
        "--no-progress",
        "--device",
        "cpu",
        "--torch-threads",
        "1",
    ]
    assert finetune.main(argv) == 0
    saved = json.loads((out / "best" / "metrics.json").read_text())
    assert saved["total"] == 6  # the 2 held-out articles x 3 questions
    capsys.readouterr()
    evaluate_cli.main(["--task", "qa", "--ckpt", str(out / "best"), "--data", str(tmp_path)])
    printed = json.loads(capsys.readouterr().out)
    assert printed["f1"] == saved["f1"] and printed["exact_match"] == saved["exact_match"]


def test_bf16_autocast_runs_on_cpu(assets, tmp_path):
    out = tmp_path / "bf16"
    assert finetune.main(classify_args(assets, out, "--max-steps", "2", "--precision", "bf16")) == 0
    assert max(losses(out)) == 2
