"""/zero-shot (issue 24, bar 2): an NLI model served by bertserve answers as transformers' zero-shot-classification
pipeline does on the same weights (labels in the same order, scores to 1e-5 from the torch backend and 1e-4 from an
ONNX fp32 export), multi_label both ways, single and list inputs: a random-init tiny NLI classifier written by
transformers, and one fine-tuned through `python -m training.finetune --task classify` on an NLI set made from
SST-2. Refusals are JSON 4xx with the server still ready; a model without an entailment label is refused at startup
in one line; the SDK's zero_shot (sync and async) gives what the HTTP API gives."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from test_serving_support import PYTHON, REPO, Server, export_artifact, minilm_dir

sys.path.insert(0, str(REPO / "clients"))  # this checkout's SDK, whatever copy is installed
from bertserve_client import AsyncClient, Client, ValidationError, ZeroShotResult  # noqa: E402

# each request waits up to this long: a hang guard, not a speed bar (a 2-core machine running the suite's
# parallel workers has taken over httpx's default 5 s to answer one)
TIMEOUT = 60.0
NLI_LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}
MAX_POSITIONS = 128
TEXTS = [
    "The new phone has a great camera but the battery dies by noon.",
    "Our team won the championship after a dramatic overtime goal.",
    "Add the flour slowly and stir until the sauce thickens.",
]
LABELS = ["technology", "sports", "cooking", "politics"]
# (inputs, candidate_labels, hypothesis_template, multi_label): each asked of the server and of the pipeline
CASES = [
    (TEXTS[0], LABELS, None, False),
    (TEXTS[0], LABELS, None, True),
    (TEXTS, LABELS, None, False),
    (TEXTS, LABELS, None, True),
    (TEXTS[1], ["sports"], None, False),  # one label: scored against contradiction, as with multi_label
    (TEXTS[2], "cooking, travel ,,dance", "The topic is {}.", False),  # one comma-separated string
    (TEXTS[1:], ["fun", "sad"], "{0}", True),
    ("word " * 300 + "the end", ["long", "short"], None, False),  # cut to the model's 128 tokens (truncate)
]


def _save_tokenizer(directory):
    import transformers

    transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), model_max_length=MAX_POSITIONS).save_pretrained(
        directory
    )


def _tiny_classifier(directory, id2label: dict, seed: int = 0):
    import torch
    import transformers

    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,  # random weights that tell inputs apart, so the labels' order is tested
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )
    torch.manual_seed(seed)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory)
    _save_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def nli_model(tmp_path_factory):
    pytest.importorskip("transformers")
    return _tiny_classifier(tmp_path_factory.mktemp("zero-shot") / "nli", NLI_LABELS)


@pytest.fixture(scope="module")
def server(nli_model):
    with Server(
        "--zero-shot-model", str(nli_model), "--max-client-batch-size", "3", "--max-request-sequences", "12"
    ) as s:
        yield s


def _body(inputs, labels, template, multi_label, **extra) -> dict:
    body = {"inputs": inputs, "candidate_labels": labels, "multi_label": multi_label, **extra}
    if template is not None:
        body["hypothesis_template"] = template
    return body


def _pipeline_answers(model_dir) -> list:
    import transformers

    classifier = transformers.pipeline("zero-shot-classification", model=str(model_dir), device="cpu")
    answers = []
    for inputs, labels, template, multi_label in CASES:
        kwargs = {"multi_label": multi_label, **({"hypothesis_template": template} if template else {})}
        answers.append(classifier(inputs, candidate_labels=labels, **kwargs))
    return answers


def _served_answers(url: str) -> list:
    answers = []
    for inputs, labels, template, multi_label in CASES:
        response = httpx.post(
            url + "/zero-shot", json=_body(inputs, labels, template, multi_label, truncate=True), timeout=TIMEOUT
        )
        assert response.status_code == 200, response.text
        answers.append(response.json())
    return answers


def _largest_difference(served: list, expected: list) -> float:
    """Labels in the same order and the same texts, else AssertionError; the largest |score difference|."""
    worst = 0.0
    for got, want in zip(served, expected):
        assert isinstance(got, list) == isinstance(want, list), (got, want)
        for g, w in zip(*(([got], [want]) if isinstance(got, dict) else (got, want))):
            assert g["sequence"] == w["sequence"] and g["labels"] == w["labels"], (g, w)
            assert set(g) == {"sequence", "labels", "scores"}
            worst = max(worst, float(np.abs(np.subtract(g["scores"], w["scores"])).max()))
    return worst


@pytest.fixture(scope="module")
def reference(nli_model) -> list:
    return _pipeline_answers(nli_model)


def test_zero_shot_equals_the_pipeline_torch(server, reference):
    info = httpx.get(server.url + "/info", timeout=TIMEOUT).json()
    assert info["tasks"] == ["zero_shot"] and info["labels"]["zero_shot"] == list(NLI_LABELS.values())
    worst = _largest_difference(_served_answers(server.url), reference)
    print(f"bar 2, zero-shot torch: max |bertserve - pipeline| {worst:.2e}")
    assert worst <= 1e-5
    # the labels really are ranked: random weights with a wide init do not give near-equal scores
    assert all(abs(a["scores"][0] - a["scores"][-1]) > 1e-3 for a in reference[:2])


def test_zero_shot_equals_the_pipeline_onnx(nli_model, reference, tmp_path):
    artifact = export_artifact(nli_model, tmp_path / "artifact")
    assert json.loads((artifact / "config.json").read_text())["id2label"]  # the labels travel with the export
    with Server("--model", str(artifact)) as onnx:
        info = httpx.get(onnx.url + "/info", timeout=TIMEOUT).json()
        assert info["backend"] == "onnxruntime" and "zero_shot" in info["tasks"] and "classify" in info["tasks"]
        served = _served_answers(onnx.url)
    worst = _largest_difference(served, reference)
    print(f"bar 2, zero-shot onnx fp32: max |bertserve - pipeline| {worst:.2e}")
    assert worst <= 1e-4


def test_zero_shot_refusals_are_json_and_the_server_stays_ready(server):
    post = lambda body: httpx.post(server.url + "/zero-shot", json=body, timeout=TIMEOUT)  # noqa: E731
    ok = {"inputs": "a text", "candidate_labels": ["a", "b"]}
    for body, status in [
        ({**ok, "inputs": []}, 400),
        ({**ok, "inputs": ""}, 400),
        ({**ok, "inputs": ["fine", "  "]}, 400),
        ({**ok, "candidate_labels": []}, 400),
        ({**ok, "candidate_labels": ""}, 400),
        ({**ok, "candidate_labels": " , ,"}, 400),
        ({**ok, "candidate_labels": ["a", " "]}, 400),
        ({**ok, "candidate_labels": ["a", "b", "a"]}, 422),  # a label twice: two answers for one name
        ({**ok, "hypothesis_template": "no place for the label"}, 422),
        ({**ok, "hypothesis_template": "{} or {}"}, 422),
        ({**ok, "hypothesis_template": "{:>999999999}"}, 422),  # a format spec would build a huge string
        ({**ok, "hypothesis_template": "{0.__class__}"}, 422),
        ({**ok, "hypothesis_template": "{label}"}, 422),
        ({**ok, "candidate_labels": 5}, 422),
        ({**ok, "multi_label": "yes"}, 422),
        ({**ok, "top_k": 2}, 422),
        ({"candidate_labels": ["a"]}, 422),
        ({**ok, "inputs": ["x"] * 4}, 413),  # max_client_batch_size 3
        ({**ok, "inputs": ["x"] * 3, "candidate_labels": list("abcde")}, 413),  # 15 pairs, the limit is 12
        ({**ok, "candidate_labels": [f"label {i}" for i in range(13)]}, 413),
        ({**ok, "inputs": "word " * 300}, 422),  # longer than the model's 128 tokens, no truncate
        ({**ok, "candidate_labels": ["a", "word " * 200], "truncate": True}, 422),  # the hypothesis alone too long
    ]:
        response = post(body)
        assert response.status_code == status, (body, response.text)
        assert set(response.json()) == {"error", "error_type"}, response.text
    assert "12 (max_request_sequences)" in post({**ok, "candidate_labels": [str(i) for i in range(13)]}).json()["error"]
    assert httpx.post(server.url + "/zero-shot", json=[ok], timeout=TIMEOUT).status_code == 422
    assert httpx.get(server.url + "/ready", timeout=TIMEOUT).status_code == 200
    assert post({**ok, "candidate_labels": ["a", "b", "c", "d"]}).status_code == 200
    assert post({**ok, "inputs": ["x"] * 3, "candidate_labels": list("abcd")}).status_code == 200  # 12: at the limit


def test_a_model_without_an_entailment_label_is_refused(tmp_path):
    sentiment = _tiny_classifier(tmp_path / "sentiment", {0: "negative", 1: "positive"})
    run = subprocess.run(
        [PYTHON, "-m", "serving", "--zero-shot-model", str(sentiment), "--port", "0", "--threads", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "entail" in lines[0] and "negative, positive" in lines[0], run.stderr
    # served with --model it classifies, and /zero-shot is the JSON 404 of a task not served
    with Server("--model", str(sentiment)) as s:
        assert "zero_shot" not in httpx.get(s.url + "/info", timeout=TIMEOUT).json()["tasks"]
        response = httpx.post(s.url + "/zero-shot", json={"inputs": "x", "candidate_labels": ["a"]}, timeout=TIMEOUT)
        assert response.status_code == 404 and set(response.json()) == {"error", "error_type"}


def test_sdk_zero_shot_sync_and_async(server):
    raw = httpx.post(server.url + "/zero-shot", json=_body(TEXTS, LABELS[:3], None, False), timeout=TIMEOUT).json()
    raw_one = httpx.post(
        server.url + "/zero-shot", json=_body(TEXTS[0], "a, b", "It is {}.", True), timeout=TIMEOUT
    ).json()
    with Client(server.url, batch_size=2) as client:  # three texts: two requests, answers in order
        many = client.zero_shot(TEXTS, LABELS[:3])
        one = client.zero_shot(TEXTS[0], "a, b", hypothesis_template="It is {}.", multi_label=True)
        with pytest.raises(ValidationError, match="hypothesis_template"):
            client.zero_shot(TEXTS[0], ["a"], hypothesis_template="no field")

    async def go():
        async with AsyncClient(server.url, batch_size=2) as client:
            return await client.zero_shot(TEXTS, LABELS[:3]), await client.zero_shot(
                TEXTS[0], "a, b", hypothesis_template="It is {}.", multi_label=True
            )

    async_many, async_one = asyncio.run(go())
    for got in (many, async_many):
        assert all(isinstance(r, ZeroShotResult) for r in got)
        # split over two requests, a text may share its batch with other texts: the same answer to float rounding
        assert _largest_difference([[r.model_dump() for r in got]], [raw]) <= 1e-6
    for got in (one, async_one):
        assert isinstance(got, ZeroShotResult) and got.model_dump() == raw_one and got.label == raw_one["labels"][0]


def _nli_from_sst2(path, rows: list[tuple[str, str]]) -> None:
    """Each SST-2 sentence as a premise twice: "This example is positive." and "... negative." as hypotheses,
    entailment where the hypothesis names its label, contradiction where it does not."""
    lines = ["premise\thypothesis\tlabel"]
    for sentence, label in rows:
        for name, value in (("negative", "0"), ("positive", "1")):
            lines.append(f"{sentence}\tThis example is {name}.\t{'entailment' if label == value else 'contradiction'}")
    path.write_text("\n".join(lines) + "\n")


def _sst2(path) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]


def test_a_model_fine_tuned_through_the_cli_serves_zero_shot_as_the_pipeline(tmp_path, data_dir):
    pytest.importorskip("transformers")
    _nli_from_sst2(tmp_path / "train.tsv", _sst2(data_dir / "SST-2" / "train.tsv")[:48])
    _nli_from_sst2(tmp_path / "dev.tsv", _sst2(data_dir / "SST-2" / "dev.tsv")[:16])
    out = tmp_path / "run"
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "training.finetune",
            "--task",
            "classify",
            "--init-preset",
            "tiny",
            "--tokenizer",
            str(minilm_dir()),
            "--train-data",
            str(tmp_path / "train.tsv"),
            "--eval-data",
            str(tmp_path / "dev.tsv"),
            "--text-column",
            "0",
            "--pair-column",
            "1",
            "--label-column",
            "2",
            "--header",
            "yes",
            "--output-dir",
            str(out),
            "--batch-size",
            "16",
            "--max-seq-length",
            "64",
            "--max-steps",
            "6",
            "--no-progress",
            "--torch-threads",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    best = out / "best"
    config = json.loads((best / "config.json").read_text())
    assert sorted(config["id2label"].values()) == ["contradiction", "entailment"], config["id2label"]
    expected = _pipeline_answers(best)
    with Server("--zero-shot-model", str(best)) as served:
        answers = _served_answers(served.url)
    worst = _largest_difference(answers, expected)
    print(f"bar 2, zero-shot of a model fine-tuned on SST-2 as NLI (torch): max |bertserve - pipeline| {worst:.2e}")
    assert worst <= 1e-5


def test_a_checkpoint_naming_the_task_without_an_entailment_label_gets_no_made_up_answer():
    """A config whose "task" is zero_shot serves it whatever its labels; without an entailment label decoding is
    a fault (500), never scores read off some other output."""
    from bert.tasks.common import ModelFacts
    from bert.tasks.zero_shot import TASK

    outputs = [[{"zero_shot": np.array([0.5, -0.5], dtype=np.float32)}]]
    with pytest.raises(RuntimeError, match="negative, positive"):
        TASK.decode_request(
            ["t"], [[None]], outputs, ModelFacts({0: "negative", 1: "positive"}), candidate_labels=["a"]
        )
    nli = ModelFacts({0: "Contradiction", 1: "ENTAILMENT"})  # any case, as the pipeline reads it
    answer = TASK.decode_request(["t"], [[None]], outputs, nli, candidate_labels=["a"])[0]
    assert answer["labels"] == ["a"] and abs(answer["scores"][0] - 1 / (1 + np.exp(1.0))) < 1e-6


def test_labels_the_tokenizer_cannot_read_are_refused_naming_them(server):
    """A label of only invisible characters (a zero-width space, NUL) tokenises to nothing: the model would weigh
    "This example is ." and the answer would score a label it never read; it is a 400 as such an input is. A lone
    surrogate in a label or the template is a 422 naming the field, not the tokenizer's own message."""
    for raw, status, field in [
        (b'{"inputs": "a text", "candidate_labels": ["\\u200b", "b"]}', 400, "candidate_labels[0]"),
        (b'{"inputs": "a text", "candidate_labels": ["a", "\\u0000"]}', 400, "candidate_labels[1]"),
        (b'{"inputs": "a text", "candidate_labels": "a, \\ufeff"}', 400, "candidate_labels[1]"),
        (b'{"inputs": "a text", "candidate_labels": ["\\ud800", "b"]}', 422, "candidate_labels[0]"),
        (
            b'{"inputs": "a text", "candidate_labels": ["a", "b"], "hypothesis_template": "\\ud800 {}"}',
            422,
            "hypothesis_template",
        ),
    ]:
        response = httpx.post(
            server.url + "/zero-shot", content=raw, headers={"content-type": "application/json"}, timeout=TIMEOUT
        )
        assert response.status_code == status, (raw, response.text)
        assert set(response.json()) == {"error", "error_type"} and field in response.json()["error"], response.text
    # a label with visible text beside a format character is a label
    ok = httpx.post(
        server.url + "/zero-shot", json={"inputs": "a text", "candidate_labels": ["\u200bsports", "b"]}, timeout=TIMEOUT
    )
    assert ok.status_code == 200 and abs(sum(ok.json()["scores"]) - 1) < 1e-5, ok.text
