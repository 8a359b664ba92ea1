"""The families with building blocks of their own (DeBERTa-v2/v3: disentangled attention; ModernBERT: rotary
positions, windowed attention, a gated MLP, pre-norm, a fused qkv layout) against transformers' own classes, one
test per behaviour, parametrized over the families: checkpoints written by transformers' save_pretrained give
transformers' outputs for every head, padded (sdpa and eager) and packed (serving's varlen path, CPU reference
attention); ours load back into transformers with equal outputs; a task fine-tuned from the family's backbone, and
a multi-task model trained with an embedding teacher, load in transformers and answer as it does.

Each family's tiny random models, inputs and settings (initializer_range 0.2, so that inputs are told apart) are
its own file's (tests/test_deberta.py, tests/test_modernbert.py: its `Case`), made once per test process; the
behaviours only one family has stay in that file.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_modernbert import TRAIN, training_data, worst  # noqa: E402

from bert.checkpoint import load_checkpoint, load_for_inference, save_checkpoint  # noqa: E402

FAMILIES = ["deberta", "modernbert"]  # tests/test_<name>.py
HEADS = ["classify", "ner", "qa", "mlm", "embed"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    return importlib.import_module(f"test_{request.param}").Case(tmp_path_factory)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("head", HEADS)
def test_transformers_checkpoint_gives_their_logits_padded(family, head, implementation):
    directory, theirs = family.checkpoints[head]
    ids, mask = family.batch()
    ours = family.our_padded(directory, head, ids, mask, implementation)
    diff = worst(ours, family.theirs_out(theirs, head, ids, mask), mask, per_token=head != "classify")
    assert diff <= 1e-5, diff


@pytest.mark.parametrize("head", ["classify", "ner", "qa", "mlm"])
def test_packed_varlen_path_gives_their_logits(family, head):
    """serving's packed path (torch_packed, CPU reference attention): windows bounded inside each sequence,
    relative attention laid out per sequence inside the packed batch."""
    from runtime.backends.torch_packed import PackedEncoder, PackedRunner, pack

    directory, theirs = family.checkpoints[head]
    ids, mask = family.batch()
    model, _ = load_for_inference(directory)
    packed = pack({"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": 0 * ids.numpy()})
    table = PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False).run(packed)
    expected = family.theirs_out(theirs, head, ids, mask)
    if head == "mlm":  # the fill-mask head gives each token's top candidates: their probabilities
        scores = expected[0].softmax(-1).topk(table["fill_mask_scores"].shape[-1], dim=-1).values
        diff = worst([table["fill_mask_scores"]], [scores], mask, per_token=True)
    else:
        diff = worst([table[n] for n in family.heads[head][2]], expected, mask, per_token=head != "classify")
    assert diff <= 2e-5, diff


@pytest.mark.parametrize("head", HEADS)
def test_ours_load_in_transformers_with_equal_logits(family, tmp_path, head):
    directory, theirs = family.checkpoints[head]
    model, _ = load_checkpoint(directory)
    save_checkpoint(model, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == family.model_type and written["architectures"] == [type(theirs).__name__]
    reloaded, info = family.heads[head][0].from_pretrained(
        tmp_path / "ours", output_loading_info=True, **family.loading
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    family.check_written(written, reloaded, theirs)
    ids, mask = family.batch((300, 40))
    reloaded.eval()
    diff = worst(
        family.theirs_out(reloaded, head, ids, mask),
        family.theirs_out(theirs, head, ids, mask),
        mask,
        head != "classify",
    )
    assert diff == 0.0, diff


@pytest.mark.parametrize("task", ["classify", "ner", "qa", "rerank"])
def test_finetuned_from_backbone_loads_in_transformers_with_equal_logits(family, data_dir, tmp_path, task):
    from training import finetune
    from training.config import run

    out = tmp_path / "run"
    argv = ["--task", task, "--ckpt", str(family.checkpoints["embed"][0]), "--output-dir", str(out)]
    argv += ["--max-seq-length", "64", *training_data(data_dir, tmp_path, task), *TRAIN]
    assert run(finetune.main, argv) == 0
    best = out / "best"
    head = "classify" if task == "rerank" else task  # a reranker is a one-output sequence classifier
    cls = family.heads[head][0]
    written = json.loads((best / "config.json").read_text())
    assert written["model_type"] == family.model_type and written["architectures"] == [cls.__name__]
    theirs, info = cls.from_pretrained(best, output_loading_info=True, **family.loading)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    backbone = family.checkpoints["embed"][1]
    assert not torch.equal(family.trained_weight(backbone), family.trained_weight(theirs))  # trained
    ids, mask = family.batch((300, 40))
    ours = family.our_padded(best, head, ids, mask, outputs=("rerank_logits",) if task == "rerank" else None)
    if task == "rerank":
        assert ours[0].shape == (2, 1)
    diff = worst(ours, family.theirs_out(theirs.eval(), head, ids, mask), mask, head != "classify")
    assert diff <= 1e-5, diff


def served(settings, path: str, body: dict):
    """One request to the app of `settings`, once its model is warm."""
    import time

    from fastapi.testclient import TestClient

    from serving.app import create_app

    with TestClient(create_app(settings)) as client:
        for _ in range(600):  # the model warms up in the background after startup
            if client.get("/ready").status_code == 200:
                break
            time.sleep(0.1)
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_multitask_with_an_embedding_teacher_trains_and_serves_embed(family, data_dir, tmp_path):
    """python -m training.multitask --embed-teacher from the family's backbone (task heads beside the kept
    embeddings): best/ reloads with the scores it was chosen by, and /embed serves its encoder's mean-pooled states
    as transformers' base class of the family computes them."""
    from serving.settings import Settings
    from training import multitask
    from training.config import run

    backbone, out = family.checkpoints["embed"][0], tmp_path / "run"
    argv = ["--ckpt", str(backbone), "--embed-teacher", str(backbone), "--output-dir", str(out)]
    for task in family.teacher_tasks:
        (tmp_path / task).mkdir()
        data = training_data(data_dir, tmp_path / task, task)
        argv += [f"--{task}-train", data[1], f"--{task}-eval", data[3], f"--{task}-max-seq-length", "64", *data[4:]]
    train = [*TRAIN, "--eval-every", "2"]
    train[train.index("--max-steps") + 1] = "2"
    assert run(multitask.main, argv + train) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_checkpoint_eval"] == metrics["last_eval"]  # best/ as written, loaded back
    assert metrics["last_eval"]["embed"]["teacher_cosine"] > 0.9
    answer = np.array(served(Settings(model=str(out / "best")), "/embed", {"inputs": family.embed_texts}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "best")
    encoder = family.heads["embed"][0].from_pretrained(out / "best", **family.loading).eval()
    encoded = tokenizer(family.embed_texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = encoder(**encoded).last_hidden_state
    mask = encoded["attention_mask"][..., None].float()
    expected = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    assert np.abs(answer - expected.numpy()).max() <= 1e-5
    assert not torch.equal(family.trained_weight(family.checkpoints["embed"][1]), family.trained_weight(encoder))
