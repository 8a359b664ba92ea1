"""--qa-verify-model: a fast /qa model's unsure answers (best two closer than --qa-verify-margin) are answered
again by an exact model. Two real tiny QA checkpoints with different weights play fast and exact; the
engine runs in-process (torch backend), one real server checks the HTTP side and the startup refusals."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pytest
from test_serving_support import (
    CONTEXT,
    PYTHON,
    QA_ITEMS,
    REPO,
    RERANK_TEXTS,
    Server,
    build_checkpoint,
    build_cross_encoder,
)
from test_serving_support import (
    RERANK_QUERY as QUERY,
)

from bert.tasks import TASKS
from bert.tasks import qa as qa_codec
from bert.tasks.common import Limits
from runtime.model_dir import ModelError
from serving.batcher import Ticket
from serving.engine import Engine, Timing
from serving.metrics import Metrics
from serving.settings import Settings

ITEMS = QA_ITEMS + [
    {"question": "Which nations share the region?", "context": CONTEXT[:600]},
    {"question": "How much is in Peru?", "context": CONTEXT[200:700], "top_k": 3},
    {"question": "What does the basin encompass?", "context": CONTEXT[60:300]},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    return {
        "fast": build_checkpoint(root / "fast", task="qa", seed=0),
        "exact": build_checkpoint(root / "exact", task="qa", seed=1),
        "classify": build_checkpoint(root / "classify", task="classify", seed=2),
    }


def run(items, task="qa", options=None, **settings):
    """(answers, items verified) of one request of `task` through a fresh engine."""
    engine = Engine(Settings(threads=1, **settings), Metrics())
    engine.load()
    timing = Timing()

    async def scenario():
        engine.start()
        try:
            unit = engine.unit(task)
            return await engine.infer(unit, TASKS[task], items, options or {}, ticket=Ticket(), timing=timing)
        finally:
            await engine.stop()

    return asyncio.run(scenario()), timing.verified


def test_unsure_items_are_answered_by_the_exact_model_the_rest_by_the_fast_one(models):
    fast, _ = run(ITEMS, model=str(models["fast"]))
    exact, _ = run(ITEMS, model=str(models["exact"]))
    assert fast != exact  # different weights: the test can tell who answered
    # the fast model's own margins, from its best two answers
    ranked, _ = run([dict(item, top_k=2) for item in ITEMS], model=str(models["fast"]))
    margins = [r[0]["score"] - (r[1]["score"] if len(r) > 1 else 0.0) for r in ranked]
    threshold = sorted(margins)[len(margins) // 2]  # about half the items are unsure
    unsure = [m < threshold for m in margins]
    assert 0 < sum(unsure) < len(ITEMS)
    mixed, verified = run(
        ITEMS, model=str(models["fast"]), qa_verify_model=str(models["exact"]), qa_verify_margin=threshold
    )
    assert verified == sum(unsure)
    for answer, was_unsure, f, e in zip(mixed, unsure, fast, exact):
        assert answer == (e if was_unsure else f)


def test_margin_zero_verifies_nothing_and_one_verifies_everything(models):
    fast, _ = run(ITEMS, model=str(models["fast"]))
    exact, _ = run(ITEMS, model=str(models["exact"]))
    none, verified = run(ITEMS, model=str(models["fast"]), qa_verify_model=str(models["exact"]), qa_verify_margin=0)
    assert (none, verified) == (fast, 0)
    every, verified = run(ITEMS, model=str(models["fast"]), qa_verify_model=str(models["exact"]), qa_verify_margin=1)
    assert (every, verified) == (exact, len(ITEMS))


def test_margins_are_the_lead_of_the_best_answer(models):
    ranked, _ = run([dict(item, top_k=2) for item in ITEMS[:3]], model=str(models["fast"]))
    for answers in ranked:
        assert len(answers) == 2 and 0 <= answers[0]["score"] - answers[1]["score"] <= 1
    assert qa_codec.margins([], [], [], None) == []


@pytest.mark.parametrize(
    "case, match",
    [
        ("same", "already serves qa"),
        ("not_qa", "serves only classify"),
        ("no_qa_served", "does not serve qa"),
        ("missing", "no such|not found|does not exist|cannot"),
    ],
)
def test_a_verify_model_that_cannot_do_the_job_is_refused_at_load(models, case, match):
    settings = {
        "same": dict(model=str(models["fast"]), qa_verify_model=str(models["fast"])),
        "not_qa": dict(model=str(models["fast"]), qa_verify_model=str(models["classify"])),
        "no_qa_served": dict(model=str(models["classify"]), qa_verify_model=str(models["exact"])),
        "missing": dict(model=str(models["fast"]), qa_verify_model=str(models["fast"].parent / "nope")),
    }[case]
    with pytest.raises((ModelError, FileNotFoundError, ValueError), match=match):
        Engine(Settings(threads=1, **settings), Metrics()).load()


def test_the_server_says_what_it_verified_and_refuses_a_bad_verify_model_in_one_line(models):
    with Server(
        "--model", str(models["fast"]), "--qa-verify-model", str(models["exact"]), "--qa-verify-margin", "1"
    ) as server:
        r = httpx.post(server.url + "/qa", json=ITEMS[:2], timeout=30)
        assert r.status_code == 200 and r.headers["x-verified-items"] == "2"
        info = httpx.get(server.url + "/info", timeout=5).json()
        assert info["verify"]["qa"]["margin"] == 1 and info["verify"]["qa"]["path"] == str(models["exact"])
        r = httpx.post(server.url + "/qa", json={"question": "q", "context": "c", "top_k": "2"}, timeout=5)
        assert r.status_code == 422 and r.json()["error_type"] == "validation"
        assert httpx.get(server.url + "/ready", timeout=5).status_code == 200
    assert "--qa-verify-model" in refused_at_start(
        "--model", str(models["fast"]), "--qa-verify-model", str(models["classify"])
    )


def refused_at_start(*args: str) -> str:
    """`python -m serving ARGS` exits 2 with one `error:` line and no traceback: that line."""
    done = subprocess.run([PYTHON, "-m", "serving", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return errors[0]


# ---- /rerank: the texts near its query's best are scored again -------------------------------------------
TEXTS = RERANK_TEXTS + ["Rome has many old churches.", "The tower is 330 metres tall.", "Lyon is a city in France."]


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory):
    """Two one-output cross-encoders with different weights (fast and exact), written by transformers."""
    root = tmp_path_factory.mktemp("rerank-verify")
    return {name: build_cross_encoder(root / name, seed) for name, seed in (("fast", 0), ("exact", 1))}


def rerank(pairs, **settings):
    """(logits, pairs verified) of one rerank request's (query, text) pairs through a fresh engine."""
    return run(pairs, "rerank", {"raw_scores": True}, **settings)


def test_rerank_scores_again_the_texts_near_the_best_and_the_best_with_them(rerankers):
    pairs = [(QUERY, t) for t in TEXTS]
    fast, _ = rerank(pairs, model=str(rerankers["fast"]))
    exact, _ = rerank(pairs, model=str(rerankers["exact"]))
    order = sorted(range(len(fast)), key=lambda i: -fast[i])
    assert sorted(range(len(exact)), key=lambda i: -exact[i])[0] != order[0]  # the models disagree on the best
    # a margin between the 3rd and 4th text's distance to the best: the best and the next two are scored again
    behind = [fast[order[0]] - fast[i] for i in order]
    margin = (behind[2] + behind[3]) / 2
    assert behind[1] < margin  # the best leads by less than the margin, so it is scored again too
    mixed, verified = rerank(
        pairs, model=str(rerankers["fast"]), rerank_verify_model=str(rerankers["exact"]), rerank_verify_margin=margin
    )
    again = set(order[:3])
    assert verified == 3
    assert mixed == [exact[i] if i in again else fast[i] for i in range(len(pairs))]
    # the best leads by more than the margin: nothing is scored again
    alone, verified = rerank(
        pairs,
        model=str(rerankers["fast"]),
        rerank_verify_model=str(rerankers["exact"]),
        rerank_verify_margin=behind[1] * 0.999,
    )
    assert (alone, verified) == (fast, 0)
    every, verified = rerank(
        pairs, model=str(rerankers["fast"]), rerank_verify_model=str(rerankers["exact"]), rerank_verify_margin=1e9
    )
    assert (every, verified) == (exact, len(pairs))
    # a query's only text has nothing to be put above: never scored again
    one, verified = rerank(
        pairs[:1], model=str(rerankers["fast"]), rerank_verify_model=str(rerankers["exact"]), rerank_verify_margin=1e9
    )
    assert verified == 0 and one == pytest.approx(fast[:1], abs=1e-5)  # alone: no padding, last digits may move


def test_rerank_margins_are_per_query():
    from bert.tasks import rerank as rerank_codec

    pairs = [("a", "x"), ("b", "x"), ("a", "y"), ("a", "z"), ("c", "x")]
    outputs = [[{"rerank": [v]}] for v in (2.0, 5.0, 1.5, -1.0)] + [[{"rerank": [0.0]}, {"rerank": [3.0]}]]
    found = rerank_codec.margins(pairs, outputs)
    assert found[0] == pytest.approx(0.5) and found[2] == pytest.approx(0.5) and found[3] == pytest.approx(3.0)
    assert found[1] == found[4] == float("inf")  # alone under their query (the last: its best window, 3.0)


def test_the_server_verifies_rerank_and_says_so(rerankers):
    with Server(
        "--model",
        str(rerankers["fast"]),
        "--rerank-verify-model",
        str(rerankers["exact"]),
        "--rerank-verify-margin",
        "1000",
    ) as server:
        r = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": TEXTS[:4]}, timeout=30)
        assert r.status_code == 200 and r.headers["x-verified-items"] == "4", (r.status_code, r.headers)
        r = httpx.post(server.url + "/v1/rerank", json={"query": QUERY, "documents": TEXTS[:3], "top_n": 1}, timeout=30)
        assert r.status_code == 200 and r.headers["x-verified-items"] == "3"
        info = httpx.get(server.url + "/info", timeout=5).json()
        assert info["verify"]["rerank"]["margin"] == 1000
        r = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": []}, timeout=5)
        assert r.status_code == 400 and "error" in r.json()  # no texts: refused as without a verify model
        assert httpx.get(server.url + "/ready", timeout=5).status_code == 200
    assert "verify" in refused_at_start("--model", str(rerankers["fast"]), "--rerank-verify-margin", "-1")


# ---- /ner and /classify: a text whose best label leads its second by little is labelled again ---------------
SENTENCES = [
    "Angela Merkel met Emmanuel Macron in Paris on Tuesday.",
    "The European Union fined Google in Brussels.",
    "Kathmandu is the capital of Nepal.",
    "Wolfgang lives in Berlin and works for Siemens.",
    "Manchester United beat Arsenal 2-1 at Old Trafford.",
    "Peter Blackburn",
    "The Amazon basin covers parts of Brazil, Peru and Colombia.",
    "Hugging Face Inc. is a company based in New York City.",
]


@pytest.fixture(scope="module")
def labellers(tmp_path_factory):
    """Per task, two tiny checkpoints with different weights (fast and exact)."""
    root = tmp_path_factory.mktemp("label-verify")
    return {
        task: {
            name: build_checkpoint(root / f"{task}-{name}", task=task, seed=seed)
            for name, seed in (("fast", 0), ("exact", 1))
        }
        for task in ("ner", "classify")
    } | {
        "zero_shot": {name: nli_classifier(root / f"nli-{name}", seed) for name, seed in (("fast", 0), ("exact", 1))},
        "fill_mask": {name: masked_lm(root / f"mlm-{name}", seed) for name, seed in (("fast", 0), ("exact", 1))},
        "qa": {
            name: build_checkpoint(root / f"qa-{name}", task="qa", seed=seed)
            for name, seed in (("fast", 0), ("exact", 1))
        },
        "rerank": {name: build_cross_encoder(root / f"rr-{name}", seed) for name, seed in (("fast", 0), ("exact", 1))},
    }


def nli_classifier(directory: Path, seed: int) -> Path:
    from test_task_zero_shot import NLI_LABELS, _tiny_classifier

    return _tiny_classifier(directory, NLI_LABELS, seed)


def masked_lm(directory: Path, seed: int) -> Path:
    """A tiny BertForMaskedLM written by transformers, its prediction head sharpened so that tokens are ranked."""
    import torch
    import transformers
    from test_serving_support import minilm_dir as tokenizer_dir

    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.transform.dense.weight.mul_(8)
    model.save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir())).save_pretrained(directory)
    return directory


MASKED = [" ".join(["[MASK]" if i == 2 else w for i, w in enumerate(s.split())]) for s in SENTENCES[:5]]
MASKED += ["[MASK] Blackburn", "The Amazon [MASK] covers parts of [MASK].", "Hugging Face is a [MASK] in New York."]
CASES = [
    ("ner", SENTENCES, {"aggregation": "none"}),
    ("classify", SENTENCES, {"top_k": None}),
    ("zero_shot", SENTENCES, {"candidate_labels": ["politics", "sports", "places"]}),
    ("zero_shot", SENTENCES, {"candidate_labels": ["politics", "sports", "places"], "multi_label": True}),
    ("fill_mask", MASKED, {"top_k": 3}),
]


@pytest.mark.parametrize("task, texts, options", CASES)
def test_exactly_the_texts_whose_margin_is_under_the_verify_margin_are_labelled_again(labellers, task, texts, options):
    models = labellers[task]
    fast, _ = run(texts, task, options, model=str(models["fast"]))
    exact, _ = run(texts, task, options, model=str(models["exact"]))
    fast, exact = rounded(fast), rounded(exact)  # a batch of other texts (the ones verified) moves scores by ~1e-7
    assert all(f != e for f, e in zip(fast, exact))  # different weights: each text tells who labelled it
    margins = fast_margins(models["fast"], task, options, texts)
    cut = sorted(margins)[len(margins) // 2]
    both = {"model": str(models["fast"]), f"{task}_verify_model": str(models["exact"])}
    mixed, verified = run(texts, task, options, **both, **{f"{task}_verify_margin": cut})
    unsure = [m < cut for m in margins]
    assert 0 < sum(unsure) < len(texts) and verified == sum(unsure)
    for answer, was_unsure, f, e in zip(rounded(mixed), unsure, fast, exact):
        assert answer == (e if was_unsure else f)
    for margin, expected, count in ((0, fast, 0), (1, exact, len(texts))):
        answers, verified = run(texts, task, options, **both, **{f"{task}_verify_margin": margin})
        assert (rounded(answers), verified) == (expected, count)


def rounded(value):
    """Answers (or a table's rows) with every float to 5 decimals."""
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def fast_margins(model, task: str, options: dict, texts: list = SENTENCES) -> list[float]:
    """The task's margins of each sentence on `model`, run as the runtime runs it."""
    from runtime.inference import Inference, run_batch
    from runtime.loading import load_model

    engine = Engine(Settings(threads=1, model=str(model)), Metrics())
    loaded = load_model(Path(model), engine.load_options)
    inference = Inference(loaded, TASKS[task])
    encoded = inference.encode(texts, Limits(max_length=128, max_sequences=64), options)
    outputs = run_batch(loaded.backend, encoded.sequences)
    rows = [outputs.sequence(i) for i in range(len(encoded.sequences))]
    return inference.margins(encoded, encoded.per_item(rows), options)


def test_one_exact_model_given_for_several_tasks_is_loaded_once_and_answers_each(tmp_path):
    fast = build_checkpoint(tmp_path / "fast", seed=0)  # multi-task: classify, ner, qa heads
    exact = build_checkpoint(tmp_path / "exact", seed=1)
    both = dict(
        model=str(fast), classify_verify_model=str(exact), ner_verify_model=str(exact), qa_verify_model=str(exact)
    )
    engine = Engine(Settings(threads=1, **both), Metrics())
    engine.load()
    assert engine.verify["classify"] is engine.verify["ner"] is engine.verify["qa"]
    assert engine.verify["qa"].name == "classify+ner+qa-verify" and len(engine._backend_owners()) == 2
    umbrella = Engine(Settings(threads=1, model=str(fast), verify_model=str(exact)), Metrics())
    umbrella.load()  # --verify-model: every served task with margins
    assert sorted(umbrella.verify) == ["classify", "ner", "qa"] and len(umbrella._backend_owners()) == 2
    mixed = Engine(Settings(threads=1, model=str(fast), verify_model=str(exact), qa_verify_model=str(fast)), Metrics())
    with pytest.raises(ModelError, match="--qa-verify-model .* already serves qa"):  # a task's own flag wins
        mixed.load()
    margins = dict(classify_verify_margin=1, ner_verify_margin=1, qa_verify_margin=1)
    for task, items, options in (("classify", SENTENCES, {"top_k": None}), ("ner", SENTENCES, {}), ("qa", ITEMS, {})):
        expected, _ = run(items, task, options, model=str(exact))
        answers, verified = run(items, task, options, **both, **margins)
        assert verified == len(items) and rounded(answers) == rounded(expected), task


def test_verify_model_for_a_server_with_no_task_that_can_be_unsure_is_refused_in_one_line(minilm_dir):
    line = refused_at_start("--model", str(minilm_dir), "--verify-model", str(minilm_dir))
    assert "--verify-model" in line and "no served task can tell an unsure answer" in line


# ---- batch jobs: --verify-model answers again the rows the model is unsure of, as the server does -----------
def rounded_rows(table) -> list:
    """A result table's rows with floats to 5 decimals (a batch of other rows moves a score by ~1e-7)."""
    return rounded(table.to_pylist())


PAIRS = [(QUERY, t) for t in TEXTS] + [("what is yellow?", t) for t in TEXTS[:5]]
BATCH_CASES = [
    ("ner", {"text": SENTENCES}, {"aggregation": "none"}),
    ("classify", {"text": SENTENCES}, {}),
    ("zero_shot", {"text": SENTENCES}, {"candidate_labels": ["politics", "sports", "places"]}),
    ("fill_mask", {"text": MASKED}, {"top_k": 3}),
    ("qa", {"question": [i["question"] for i in ITEMS], "context": [i["context"] for i in ITEMS]}, {}),
    ("rerank", {"query": [q for q, _ in PAIRS], "document": [d for _, d in PAIRS]}, {}),
]


@pytest.mark.parametrize("task, columns, options", BATCH_CASES, ids=[c[0] for c in BATCH_CASES])
def test_a_batch_job_answers_again_exactly_the_rows_whose_margin_is_under_the_verify_margin(
    labellers, task, columns, options
):
    from batch import Predictor

    models = labellers[task]
    with Predictor(task, str(models["fast"]), **options) as p:
        fast = rounded_rows(p.predict(columns).table)
        margins = job_margins(p, columns)
    with Predictor(task, str(models["exact"]), **options) as p:
        exact = rounded_rows(p.predict(columns).table)
    cut = sorted(margins)[len(margins) // 2]
    unsure = [m < cut for m in margins]
    with Predictor(task, str(models["fast"]), verify_model=str(models["exact"]), verify_margin=cut, **options) as p:
        result = p.predict(columns)
    assert result.verified == sum(unsure) and 0 < sum(unsure) < len(margins) == len(fast)
    for row, was_unsure, f, e in zip(rounded_rows(result.table), unsure, fast, exact):
        assert f != e and row == (e if was_unsure else f)


def job_margins(predictor, columns: dict) -> list[float]:
    """The task's margins of each row, as the predictor encodes and runs the rows (its own windows and limits)."""
    from runtime.inference import Encoded

    prepared = predictor._prepare(columns, None)
    outputs, _ = predictor._run(prepared.features, prepared.rows, prepared.errors)
    encoded = Encoded(prepared.items, prepared.features)
    return predictor.inference.margins(encoded, outputs, predictor.codec_options)


def test_a_batch_job_records_what_it_answered_again_and_refuses_a_verify_model_that_cannot_do_the_job(
    labellers, tmp_path, capsys
):
    import json

    from batch.__main__ import main

    models = labellers["classify"]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": s}) + "\n" for s in SENTENCES))
    args = ["--task", "classify", "--model", str(models["fast"]), "--input", str(data)]
    out = tmp_path / "out"
    assert main([*args, "--output", str(out), "--verify-model", str(models["exact"]), "--verify-margin", "1"]) == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["verified"] == len(SENTENCES) and manifest["parts"][0]["verified"] == len(SENTENCES)
    assert manifest["verify_model"]["path"] == str(models["exact"]) and manifest["verify_model"]["digest"]
    assert "8 answered again by --verify-model" in capsys.readouterr().err
    # a rerun with another margin would answer other rows again: refused, not mixed into the same parts
    assert main([*args, "--output", str(out), "--verify-model", str(models["exact"]), "--verify-margin", "0.5"]) == 2
    assert "--verify-margin 1.0 (now 0.5)" in capsys.readouterr().err
    for extra, says in (
        (["--verify-model", str(models["fast"])], "is --model itself"),
        (["--verify-margin", "0.1"], "--verify-margin needs --verify-model"),
        (["--task", "embed", "--verify-model", str(models["exact"])], "embed has no notion of an unsure answer"),
    ):
        assert main([*args, *extra, "--output", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
        assert not (tmp_path / "refused").exists()


def test_an_exact_model_that_reads_other_words_or_shorter_inputs_is_refused_by_the_server_and_a_batch_job(
    labellers, tmp_path
):
    import shutil

    from batch import JobError, Predictor

    fast = labellers["classify"]["fast"]
    other = tmp_path / "other-vocabulary"
    shutil.copytree(labellers["classify"]["exact"], other)
    (other / "tokenizer.json").unlink()  # read from vocab.txt, two of whose words trade ids
    vocab = (other / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[2000], vocab[2001] = vocab[2001], vocab[2000]
    (other / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    short = build_checkpoint(tmp_path / "short", task="classify", seed=1, max_position_embeddings=64)
    for exact, says in ((other, "its vocabulary is not that of"), (short, "takes at most 64 tokens")):
        engine = Engine(Settings(threads=1, model=str(fast), classify_verify_model=str(exact)), Metrics())
        with pytest.raises(ModelError, match=f"--classify-verify-model .*{says}"):
            engine.load()
        with pytest.raises(JobError, match=f"--verify-model .*{says}"):
            Predictor("classify", str(fast), verify_model=str(exact))


# ---- an int8 artifact carrying its own fp32 graph (python -m export.onnx --verify-graph) -----------------------
@pytest.fixture(scope="module")
def with_verify_graph(tmp_path_factory):
    from export.onnx import cli

    out = tmp_path_factory.mktemp("verify-graph") / "int8"
    args = ["--ckpt", "tiny", "--random-init", "--task", "classify", "--max-seq", "64", "--precision", "int8"]
    assert cli([*args, "--int8-scope", "all", "--verify-graph", "--out", str(out)]) == 0
    assert cli([*args, "--int8-scope", "all", "--verify-graph", "--out", str(out)]) == 0  # replaces one such
    return out


def test_an_export_with_verify_graph_holds_a_whole_fp32_artifact_its_manifest_records(with_verify_graph, capsys):
    import json

    from bert.digest import sha256_files
    from export.onnx import cli

    outer = json.loads((with_verify_graph / "manifest.json").read_text())
    inner = with_verify_graph / "verify" / "manifest.json"
    record = outer["verify_graph"]
    assert record == {
        "dir": "verify",
        "precision": "fp32",
        "manifest": {"path": "manifest.json", "bytes": inner.stat().st_size, "sha256": sha256_files([inner])},
    }
    assert json.loads(inner.read_text())["precision"] == "fp32" and outer["precision"] == "int8"
    assert outer["parity"]["verify"]["passed"] is True
    args = ["--ckpt", "tiny", "--random-init", "--task", "classify", "--max-seq", "64", "--verify-graph"]
    for extra, says in (
        (["--precision", "fp32"], "goes with an int8 graph"),
        (["--precision", "int8", "--int8-distill"], "distilled weights"),
    ):
        assert cli([*args, *extra, "--out", str(with_verify_graph.parent / "refused")]) == 2
        assert says in capsys.readouterr().err


def test_a_server_and_a_batch_job_answer_again_on_the_artifacts_own_verify_graph_unless_told_not(with_verify_graph):
    from batch import Predictor

    texts = SENTENCES[:4]
    _, verified = run(texts, "classify", model=str(with_verify_graph), classify_verify_margin=1)
    assert verified == len(texts)
    _, verified = run(
        texts, "classify", model=str(with_verify_graph), classify_verify_margin=1, ignore_verify_graph=True
    )
    assert verified == 0
    with Predictor("classify", str(with_verify_graph), verify_margin=1) as p:
        assert p.predict({"text": texts}).verified == len(texts)
    with Predictor("classify", str(with_verify_graph), ignore_verify_graph=True) as p:
        assert p.predict({"text": texts}).verified == 0
    with Server("--model", str(with_verify_graph), "--classify-verify-margin", "1") as server:
        r = httpx.post(server.url + "/classify", json={"inputs": texts}, timeout=30)
        assert r.status_code == 200 and r.headers["x-verified-items"] == str(len(texts))
        info = httpx.get(server.url + "/info", timeout=5).json()
        assert info["verify"]["classify"]["path"] == str(with_verify_graph / "verify")


def test_a_verify_graph_that_is_not_the_one_recorded_is_refused_at_start_in_one_line(with_verify_graph, tmp_path):
    import shutil

    for case in ("manifest", "graph"):
        copy = tmp_path / case
        shutil.copytree(with_verify_graph, copy)
        target = copy / "verify" / ("manifest.json" if case == "manifest" else "model.onnx")
        target.write_bytes(target.read_bytes() + b" ")
        line = refused_at_start("--model", str(copy))
        assert ("is not the verify graph" if case == "manifest" else "does not match its manifest.json") in line, line


def test_margin_reach_measures_an_artifact_with_its_verify_graph_as_the_server_would(with_verify_graph, tmp_path):
    """evals.margin_reach on held-out SST-2 dev sentences: every target's share answered again is what the margin
    it names sends, and the task's default margin is reported beside it."""
    from bert.tasks import TASKS
    from evals.margin_reach import main

    out = tmp_path / "reach.json"
    assert main(["--artifact", str(with_verify_graph), "--task", "classify", "--limit", "40", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    decisions = figures["decisions"]
    assert figures["items"] == 40 and [r["target_pct"] for r in decisions["targets"]] == [99.0, 99.5, 99.9, 100.0]
    assert decisions["margins"][0]["margin"] == TASKS["classify"].verify_margin.default
    assert "members" not in figures  # a label is one decision, not a set of them
    shares = [r["answered_again_pct"] for r in decisions["targets"]]
    assert all(s is not None for s in shares) and shares == sorted(shares)
    assert set(figures["model_seconds"]) == {"int8", "fp32"}


def test_margin_reach_without_its_held_out_data_is_one_line_and_exit_2(with_verify_graph, monkeypatch, capsys):
    import evals.fast_answers
    from evals.margin_reach import main

    monkeypatch.setattr(evals.fast_answers, "DATA_DIR", with_verify_graph / "no-data")
    with pytest.raises(SystemExit) as e:
        main(["--artifact", str(with_verify_graph), "--task", "classify"])
    assert e.value.code == 2
    assert "margin_reach: error: cannot read the held-out data: " in capsys.readouterr().err
