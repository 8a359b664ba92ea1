"""Issue 20, each family through every part (tests/test_families.py covers loading, serving and the fp32 export of
classify / ner / qa in three families): here the ONNX export of every head of every family model_type (fp32
fused and portable, fp16, int8), all-MiniLM-L6-v2 rewritten into RoBERTa's and DistilBERT's layouts exported as
`embed`, and fine-tuning from a family backbone with the training CLIs (classify, ner, qa, rerank:
training.finetune; embed: training.multitask --embed-teacher, the one way the training CLIs train what /embed
serves), the result loaded back by transformers in its family's layout.

Tiny random transformers models (hidden 32, 2 layers, 2 heads; ELECTRA with a 16-wide embedding and its
projection), byte-level BPE (RoBERTa, DistilBERT, ELECTRA) and Unigram (XLM-RoBERTa, CamemBERT) tokenizers
trained here on the real data, and that data (SST-2, CoNLL-2003, SQuAD) sliced to a few dozen examples.

Where onnxruntime's BERT optimizer fuses (export/variants.py, opt_level 0, model_type "bert"): Attention (one per
layer) and SkipLayerNormalization (two per layer) in every family; the export fails outright when attention does
not fuse (export/variants.check_fusion). EmbedLayerNormalization fuses in DistilBERT and ELECTRA (ELECTRA's
embedding projection stays a MatMul after it) but not in RoBERTa / XLM-RoBERTa / CamemBERT: onnxruntime's kernel
numbers positions 0..T-1 and theirs start at pad_token_id + 1, so export leaves those embeddings unfused
(export/variants.embed_fusion): Gather + Add + LayerNormalization, asserted below as 0 fused.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from test_families import HEADS, _train_tokenizer, assert_close, hf_config, hf_outputs, inputs, our_outputs  # noqa: E402

from bert.checkpoint import CALIBRATION_FILE, load_for_inference, read_state_dict  # noqa: E402
from bert.config import BertConfig  # noqa: E402
from bert.tokenizer import BertTokenizer  # noqa: E402
from export.onnx import cli as export_cli  # noqa: E402
from export.samples import read_calibration  # noqa: E402

FAMILIES = ("roberta", "distilbert", "electra")
EXPORTED = ("roberta", "xlm-roberta", "camembert", "distilbert", "electra")
EXPORT_HEADS = ("classify", "ner", "qa", "embed")
LAYERS = 2  # hf_config's
# EmbedLayerNormalization per graph: none where positions start after the pad id (module docstring)
EMBED_LAYER_NORM = {"roberta": 0, "xlm-roberta": 0, "camembert": 0, "distilbert": 1, "electra": 1}
PREFIX = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}
PREFIX.update(distilbert="DistilBert", electra="Electra")
TRAIN_ARCHITECTURES = {
    "classify": "ForSequenceClassification",
    "ner": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
    "rerank": "ForSequenceClassification",
}


def _figure(name: str, value: float) -> float:
    """A measured figure, printed (pytest -s shows them)."""
    print(f"FIGURE {name}: {value:.3g}")
    return value


# ---- assets: tiny slices of the real data, tokenizers trained on them --------------------------------------


def _rerank_rows(articles: list[dict]) -> list[str]:
    """(question, sentence of its paragraph, 1 if the first answer starts in it) rows: the TSV rerank trains on."""
    rows = ["query\ttext\tlabel"]
    for article in articles:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            cuts = [0, *(m.end() for m in re.finditer(r"(?<=[.!?])\s+", context)), len(context)]
            spans = [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if context[a:b].strip()]
            for qa in paragraph["qas"][:3]:
                start = qa["answers"][0]["answer_start"]
                rows += [f"{qa['question']}\t{context[a:b].strip()}\t{int(a <= start < b)}" for a, b in spans]
    return rows


@pytest.fixture(scope="module")
def assets(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("family-assets")
    sst2 = (data_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (root / "classify-train.tsv").write_text("\n".join(sst2[:65]) + "\n")
    (root / "classify-dev.tsv").write_text("\n".join([sst2[0], *sst2[65:97]]) + "\n")
    conll = (data_dir / "conll2003" / "train.txt").read_text(encoding="utf-8").split("\n\n")
    (root / "ner-train.txt").write_text("\n\n".join(conll[:60]) + "\n")
    (root / "ner-dev.txt").write_text("\n\n".join(conll[60:90]) + "\n")
    with gzip.open(data_dir / "squad-train" / "train-v1.1.part-01.json.gz", "rt", encoding="utf-8") as f:
        articles = [{**a, "paragraphs": a["paragraphs"][:3]} for a in json.load(f)["data"][:3]]
    (root / "qa-train.json").write_text(json.dumps({"version": "1.1", "data": articles[:2]}))
    (root / "qa-dev.json").write_text(json.dumps({"version": "1.1", "data": articles[2:]}))
    (root / "rerank-train.tsv").write_text("\n".join(_rerank_rows(articles[:2])) + "\n")
    (root / "rerank-dev.tsv").write_text("\n".join(_rerank_rows(articles[2:])) + "\n")
    corpus = [line.split("\t")[0] for line in sst2[1:2000]]
    corpus += [p["context"] for a in articles for p in a["paragraphs"]]
    corpus += [" ".join(line.split()[0] for line in block.splitlines() if line.strip()) for block in conll[:300]]
    _train_tokenizer("bpe", corpus, root / "bpe")
    _train_tokenizer("unigram", corpus, root / "unigram")
    return root


def make_checkpoint(assets: Path, model_type: str, head: str, directory: Path, seed: int = 0):
    """A tiny transformers model of `model_type` with `head` (test_families.HEADS), saved with save_pretrained next
    to its family's tokenizer (pad id 1 in both); returns the model."""
    tokenizer = assets / ("unigram" if model_type in ("xlm-roberta", "camembert") else "bpe")
    vocab = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    config = hf_config(model_type, num_labels=2 if head == "qa" else 3, vocab_size=vocab, pad_token_id=1)
    torch.manual_seed(seed)
    model = HEADS[head][0].from_config(config).eval()
    model.save_pretrained(directory)
    for file in tokenizer.iterdir():
        shutil.copy(file, directory / file.name)
    return model


def export(checkpoint: Path, out: Path, *args: str) -> dict:
    """python -m export.onnx in this process (its own parity check against our torch model runs too); the manifest."""
    assert export_cli(["--ckpt", str(checkpoint), "--out", str(out), *args]) == 0
    return json.loads((out / "manifest.json").read_text())


def run_onnx(path: Path, ids, mask) -> list[torch.Tensor]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    return [torch.from_numpy(o) for o in session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})]


def mean_pooled(states: torch.Tensor, mask) -> torch.Tensor:
    m = mask[..., None].to(states.dtype)
    return (states * m).sum(1) / m.sum(1)


def reference(model, head: str, ids, mask) -> list[torch.Tensor]:
    """transformers' outputs as the graph gives them: logits, or an embed graph's mean-pooled states."""
    out = hf_outputs(model, head, ids, mask)
    return [mean_pooled(out[0], mask)] if head == "embed" else out


def node_counts(path: Path) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for node in onnx.load(str(path)).graph.node:
        key = (node.domain or "ai.onnx", node.op_type)
        counts[key] = counts.get(key, 0) + 1
    return counts


def contrib(counts: dict, op: str) -> int:
    return counts.get(("com.microsoft", op), 0)


# ---- ONNX fp32: the fused graph and the portable (TensorRT) graph equal transformers --------------------


@pytest.mark.parametrize("head", EXPORT_HEADS)
@pytest.mark.parametrize("model_type", EXPORTED)
def test_fp32_and_portable_exports_equal_transformers_with_fused_attention(assets, tmp_path, model_type, head):
    theirs = make_checkpoint(assets, model_type, head, tmp_path / "ckpt")
    manifest = export(tmp_path / "ckpt", tmp_path / "artifact", *(["--task", "embed"] if head == "embed" else []))
    artifact = tmp_path / "artifact"
    assert manifest["task"] == head and manifest["precision"] == "fp32"
    written = json.loads((artifact / "config.json").read_text())
    assert written["model_type"] == model_type  # not collapsed to "roberta": transformers picks the class by it
    if head != "embed":
        assert written["architectures"] == [PREFIX[model_type] + TRAIN_ARCHITECTURES[head]]
    else:
        assert manifest["pooling"]["pooling"] == "mean"  # no sentence-transformers files: mean, as theirs

    # fused: counted in the file itself, not only in the manifest; each SkipLayerNormalization split back into
    # Add + LayerNormalization for the CPU (export/variants.py split_skip_layer_norm)
    fused = node_counts(artifact / "model.onnx")
    assert contrib(fused, "Attention") == LAYERS
    assert (
        contrib(fused, "SkipLayerNormalization") == 0
        and manifest["fused_operators"]["SkipLayerNormalization"] == 2 * LAYERS
    )
    assert contrib(fused, "EmbedLayerNormalization") == EMBED_LAYER_NORM[model_type]
    assert manifest["fused_operators"]["Attention"] == LAYERS
    # the split ones, and the unfused embeddings' own where EmbedLayerNormalization did not fuse
    unfused_embeddings = 1 if EMBED_LAYER_NORM[model_type] == 0 else 0
    assert fused.get(("ai.onnx", "LayerNormalization"), 0) == 2 * LAYERS + unfused_embeddings

    # portable: standard ONNX ops only (what TensorRT parses), a valid model
    portable = node_counts(artifact / "model.portable.onnx")
    assert all(domain == "ai.onnx" for domain, _ in portable), sorted(k for k in portable if k[0] != "ai.onnx")
    assert portable.get(("ai.onnx", "Softmax"), 0) == LAYERS  # attention left as MatMul + Softmax + MatMul
    onnx.checker.check_model(str(artifact / "model.portable.onnx"))

    config = BertConfig.from_json_file(tmp_path / "ckpt" / "config.json")
    ids, mask = inputs(config, batch=4, width=20)
    expected = reference(theirs, head, ids, mask)
    per_token = head in ("ner", "qa")
    for name in ("model.onnx", "model.portable.onnx"):
        got = run_onnx(artifact / name, ids, mask)
        worst = assert_close(got, expected, mask, per_token=per_token, tol=1e-4)
        _figure(f"fp32 {name} {model_type} {head} max|diff| vs transformers", worst)


# ---- fp16 and int8 against fp32, and the fp16 graph TensorRT builds from ------------------------------------


def random_batch(config, batch: int = 32, width: int = 32, seed: int = 3):
    """Right-padded random ids avoiding the pad id, every row at least 4 real tokens, one row full width."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, config.vocab_size, (batch, width), generator=g)
    lengths = torch.randint(4, width + 1, (batch,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, config.pad_token_id), mask


def _agreement(fp32: torch.Tensor, other: torch.Tensor, mask, head: str) -> float:
    """Share of decisions that agree: the argmax label per sequence (classify) or real token (ner), the argmax
    position over real tokens (qa start / end)."""
    if head == "qa":
        keep = mask.bool()
        a = fp32.masked_fill(~keep, -torch.inf).argmax(-1)
        b = other.masked_fill(~keep, -torch.inf).argmax(-1)
        return (a == b).float().mean().item()
    if head == "ner":
        fp32, other = fp32[mask.bool()], other[mask.bool()]
    return (fp32.argmax(-1) == other.argmax(-1)).float().mean().item()


def _relative_rms(fp32: torch.Tensor, other: torch.Tensor, mask, per_token: bool) -> float:
    if per_token:
        fp32, other = fp32[mask.bool()], other[mask.bool()]
    return ((fp32 - other).pow(2).mean().sqrt() / fp32.pow(2).mean().sqrt()).item()


# fp16 / int8 against the same artifact's fp32 portable graph, on 32 sequences of random ids: relative RMS error and
# agreement of the decisions (label per sequence or token, span start / end position) as the exporter's own parity
# verification bounds them on its sample text (export/parity.TOLERANCES); embeddings' cosine to fp32 >= 0.999
# (fp16) / 0.99 (int8).
REDUCED = {
    "fp16": {"relative_rms": 0.02, "agreement": 0.95, "cosine": 0.999},
    "int8": {"relative_rms": 0.25, "agreement": 0.9, "cosine": 0.99},
}


@pytest.mark.slow
@pytest.mark.parametrize("head", EXPORT_HEADS)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_fp16_and_int8_exports_agree_with_fp32(assets, tmp_path, model_type, head):
    make_checkpoint(assets, model_type, head, tmp_path / "ckpt")
    config = BertConfig.from_json_file(tmp_path / "ckpt" / "config.json")
    ids, mask = random_batch(config)
    task = ["--task", "embed"] if head == "embed" else []
    for precision, bound in REDUCED.items():
        artifact = tmp_path / precision
        manifest = export(tmp_path / "ckpt", artifact, "--precision", precision, *task)
        assert manifest["precision"] == precision and manifest["parity"]["model"]["passed"] is True
        graph = onnx.load(str(artifact / "model.onnx"))
        weights = {init.data_type for init in graph.graph.initializer}
        counts = node_counts(artifact / "model.onnx")
        if precision == "fp16":
            assert onnx.TensorProto.FLOAT16 in weights
            assert contrib(counts, "Attention") == LAYERS  # still fused
            assert contrib(counts, "EmbedLayerNormalization") == EMBED_LAYER_NORM[model_type]
        else:
            assert onnx.TensorProto.INT8 in weights
            # attention unfused so that its QKV projection is int8 with one activation scale per row
            assert contrib(counts, "MultiHeadAttention") == LAYERS and contrib(counts, "QAttention") == 0
            assert contrib(counts, "QEmbedLayerNormalization") == EMBED_LAYER_NORM[model_type]
            assert contrib(counts, "MatMulIntegerToFloat") > 0
            assert contrib(counts, "SkipLayerNormalization") == 0  # split for the CPU (export/variants.py)
        # inputs int64, outputs float32, whatever runs inside
        assert {i.type.tensor_type.elem_type for i in graph.graph.input} == {onnx.TensorProto.INT64}
        assert {o.type.tensor_type.elem_type for o in graph.graph.output} == {onnx.TensorProto.FLOAT}
        fp32 = run_onnx(artifact / "model.portable.onnx", ids, mask)
        reduced = run_onnx(artifact / "model.onnx", ids, mask)
        for a, b in zip(fp32, reduced):
            rms = _relative_rms(a, b, mask, per_token=head in ("ner", "qa"))
            assert rms <= bound["relative_rms"], (precision, rms)
            _figure(f"{precision} {model_type} {head} relative RMS vs fp32", rms)
            if head == "embed":
                cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item()
                assert cosine >= bound["cosine"], (precision, cosine)
                _figure(f"{precision} {model_type} {head} min cosine vs fp32", cosine)
            else:
                agreement = _agreement(a, b, mask, head)
                assert agreement >= bound["agreement"], (precision, agreement)
                _figure(f"{precision} {model_type} {head} decision agreement vs fp32", agreement)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_portable_graph_converts_to_the_fp16_graph_tensorrt_builds(assets, tmp_path, model_type):
    """export.tensorrt's first step on each family's portable graph (TensorRT itself is not installed here: its
    build is tests/test_export_tensorrt.py's, on a GPU): standard ops only, int64 in, fp32 out, fp16 weights,
    LayerNormalization and Softmax kept fp32; it runs and agrees with the fp32 portable graph."""
    from export.tensorrt import fp16_onnx

    make_checkpoint(assets, model_type, "ner", tmp_path / "ckpt")
    export(tmp_path / "ckpt", tmp_path / "artifact")
    path = fp16_onnx(tmp_path / "artifact" / "model.portable.onnx", tmp_path / "fp16.onnx")
    graph = onnx.load(str(path))
    assert all(n.domain in ("", "ai.onnx") for n in graph.graph.node)
    assert {i.type.tensor_type.elem_type for i in graph.graph.input} == {onnx.TensorProto.INT64}
    assert {o.type.tensor_type.elem_type for o in graph.graph.output} == {onnx.TensorProto.FLOAT}
    assert onnx.TensorProto.FLOAT16 in {init.data_type for init in graph.graph.initializer}
    config = BertConfig.from_json_file(tmp_path / "ckpt" / "config.json")
    ids, mask = random_batch(config)
    (fp32,) = run_onnx(tmp_path / "artifact" / "model.portable.onnx", ids, mask)
    (half,) = run_onnx(path, ids, mask)
    rms = _relative_rms(fp32, half, mask, per_token=True)
    assert rms <= REDUCED["fp16"]["relative_rms"], rms
    assert _agreement(fp32, half, mask, "ner") >= REDUCED["fp16"]["agreement"]
    _figure(f"tensorrt-bound fp16 portable {model_type} ner relative RMS vs fp32", rms)


# ---- real weights: all-MiniLM-L6-v2 in RoBERTa's and DistilBERT's layouts, exported as embed ----------------


@pytest.mark.slow
@pytest.mark.minilm
@pytest.mark.parametrize("layout", ["roberta", "distilbert"])
def test_minilm_in_family_layout_exports_as_embed_with_every_layer_fused(tmp_path, minilm_dir, sst2_dev, layout):
    from family_layouts import rewrite
    from sentence_transformers import SentenceTransformer

    rewritten = rewrite(minilm_dir, tmp_path / layout, layout)
    manifest = export(rewritten, tmp_path / "artifact", "--max-seq", "128")  # auto: embed (sentence-transformers)
    assert manifest["task"] == "embed" and manifest["pooling"]["pooling"] == "mean"
    counts = node_counts(tmp_path / "artifact" / "model.onnx")
    assert contrib(counts, "Attention") == 6  # every layer
    assert manifest["fused_operators"]["SkipLayerNormalization"] == 12  # in the file: split, Add + LayerNormalization
    assert contrib(counts, "EmbedLayerNormalization") == EMBED_LAYER_NORM[layout]

    texts = [sentence for sentence, _ in sst2_dev[:64]]
    batch = BertTokenizer.from_dir(tmp_path / "artifact")(texts)
    session = ort.InferenceSession(str(tmp_path / "artifact" / "model.onnx"), providers=["CPUExecutionProvider"])
    (vectors,) = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    # sentence-transformers on the rewritten directory (transformers' RobertaModel / DistilBertModel underneath),
    # and on the original BERT-layout model
    for source, name in ((rewritten, f"{layout} layout"), (minilm_dir, "original BERT layout")):
        model = SentenceTransformer(str(source), device="cpu")
        if source == rewritten:
            assert model[0].auto_model.config.model_type == layout
        expected = model.encode(texts, batch_size=64, normalize_embeddings=True)
        worst = float(np.abs(vectors - expected).max())
        assert worst <= 2e-5, (name, worst)
        _figure(f"MiniLM {layout} layout ONNX embed max|diff| vs sentence-transformers on the {name}", worst)


# ---- fine-tuning from a family backbone with the training CLIs -------------------------------------------------

TRAIN_DATA = {
    "classify": ["--train-data", "classify-train.tsv", "--eval-data", "classify-dev.tsv"],
    "ner": ["--train-data", "ner-train.txt", "--eval-data", "ner-dev.txt"],
    "qa": [
        "--train-data",
        "qa-train.json",
        "--eval-data",
        "qa-dev.json",
        "--doc-stride",
        "32",
        "--max-query-length",
        "16",
    ],
    "rerank": ["--train-data", "rerank-train.tsv", "--eval-data", "rerank-dev.tsv"],
}
# the kind of calibration input each task's calibration file must hold (export/sensitivity.py CALIBRATION_SETS)
CALIBRATION_KIND = {"classify": "sentences", "ner": "sentences", "qa": "pairs", "rerank": "groups"}
COMMON = [
    "--max-steps",
    "3",
    "--batch-size",
    "8",
    "--learning-rate",
    "1e-3",
    "--max-train-examples",
    "24",
    "--max-eval-examples",
    "16",
    "--seed",
    "0",
    "--no-progress",
    "--torch-threads",
    "1",
    "--device",
    "cpu",
]
OUR_OUTPUTS = {"classify": "classify_logits", "ner": "ner_logits", "rerank": "rerank_logits"}


def backbone(assets: Path, model_type: str, directory: Path) -> Path:
    """A bare encoder of the family (transformers' AutoModel), the encoder a fine-tuning run starts from. Its
    config.json names 3 labels (id2label), as a checkpoint fine-tuned for another head would: a head the run makes
    must not inherit them (qa's two span outputs have none; transformers would size the head by them)."""
    make_checkpoint(assets, model_type, "embed", directory, seed=1)
    return directory


def data_args(assets: Path, names: list[str]) -> list[str]:
    return [str(assets / a) if a.endswith((".tsv", ".txt", ".json")) else a for a in names]


def assert_trained(backbone_dir: Path, trained: Path) -> None:
    """The run changed the encoder (optimizer steps happened): the backbone's first layer, as transformers saved
    a bare encoder (no prefix), against the trained checkpoint's (under the family's prefix)."""
    prefix = BertConfig.from_json_file(trained / "config.json").family.base_prefix + "."
    before, after = read_state_dict(backbone_dir), read_state_dict(trained)
    layer0 = [k for k in before if ".layer.0." in k and prefix + k in after]
    assert len(layer0) >= 12, (sorted(before)[:5], sorted(after)[:5])
    assert any(not torch.equal(before[k], after[prefix + k]) for k in layer0)


@pytest.mark.parametrize("task", list(TRAIN_DATA))
@pytest.mark.parametrize("model_type", FAMILIES)
def test_finetuned_from_family_backbone_loads_in_transformers_with_equal_logits(assets, tmp_path, model_type, task):
    from training import finetune
    from training.config import run

    start = backbone(assets, model_type, tmp_path / "backbone")
    out = tmp_path / "run"
    argv = ["--task", task, "--ckpt", str(start), "--output-dir", str(out), "--max-seq-length", "64"]
    argv += data_args(assets, TRAIN_DATA[task])
    assert run(finetune.main, [*argv, *COMMON]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["task"] == task
    best = out / "best"
    # the evaluation inputs it holds for export's int8 measure: text only, of the kind the task is judged on
    own = read_calibration(best / CALIBRATION_FILE)
    assert own[CALIBRATION_KIND[task]], own
    words = " ".join(map(str, own.values())).split()
    assert not any(t in ("<s>", "</s>", "[CLS]", "[SEP]") for t in words)
    assert max(map(len, words)) < 40  # words, not a sentence decoded without its spaces
    written = json.loads((best / "config.json").read_text())
    assert written["model_type"] == model_type
    assert written["architectures"] == [PREFIX[model_type] + TRAIN_ARCHITECTURES[task]]
    if task == "qa":
        assert "id2label" not in written  # not the backbone's 3 labels
    assert_trained(start, best)

    # transformers loads every tensor it needs, and nothing is left over: the family's own layout
    auto = HEADS["classify" if task == "rerank" else task][0]
    theirs, info = auto.from_pretrained(best, output_loading_info=True)
    theirs.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours, report = load_for_inference(best)
    assert not report.initialised and not report.dropped
    # and its tokenizer: transformers' fast tokenizer from best/ gives our ids
    text = "Alice moved from Paris to Berlin in 2019 to work at the museum."
    assert transformers.AutoTokenizer.from_pretrained(best)(text)["input_ids"] == (
        BertTokenizer.from_dir(best).encode_batch([text])[0].ids
    )

    ids, mask = inputs(ours.config, batch=4, width=20)
    if task in OUR_OUTPUTS:
        with torch.no_grad():
            mine = [ours(ids, mask).outputs[OUR_OUTPUTS[task]]]
        expected = [theirs(input_ids=ids, attention_mask=mask).logits.detach()]
        if task == "rerank":
            assert mine[0].shape == (4, 1)  # one relevance logit per pair
    else:  # qa
        mine, expected = our_outputs(ours, "qa", ids, mask), hf_outputs(theirs, "qa", ids, mask)
    worst = assert_close(mine, expected, mask, per_token=task in ("ner", "qa"), tol=1e-5)
    _figure(f"finetuned {model_type} {task} max|diff| ours vs transformers", worst)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_embedding_trained_with_a_teacher_loads_in_transformers_and_exports(assets, tmp_path, model_type):
    """embed has no head to fine-tune; the training CLIs train what /embed serves through training.multitask's
    --embed-teacher (the encoder's pooled embeddings held close to a teacher's while a head learns). From a family
    backbone, with that backbone as its own teacher: the encoder transformers loads from best/ gives, mean-pooled,
    our served embeddings (torch, 1e-5) and the exported graph's (ONNX fp32, 1e-4, Attention fused per layer)."""
    from bert.tasks.embed import read_pooling
    from training import multitask
    from training.config import run

    start = backbone(assets, model_type, tmp_path / "backbone")
    out = tmp_path / "run"
    argv = [
        "--ckpt",
        str(start),
        "--output-dir",
        str(out),
        "--embed-teacher",
        str(start),
        *data_args(assets, ["--classify-train", "classify-train.tsv", "--classify-eval", "classify-dev.tsv"]),
        "--classify-max-seq-length",
        "64",
    ]
    assert run(multitask.main, [*argv, *COMMON]) == 0
    best = out / "best"
    assert read_calibration(best / CALIBRATION_FILE)["sentences"]  # the classify evaluation sentences, written
    written = json.loads((best / "config.json").read_text())
    assert written["model_type"] == model_type and written["pooling"]["mode"] == "mean"
    assert_trained(start, best)

    theirs, info = transformers.AutoModel.from_pretrained(best, output_loading_info=True)
    theirs.eval()
    # the encoder whole; left over: the classify head, and RoBERTa's pooler (its layout keeps the first-token
    # layer in classifier.dense, which RobertaModel does not read)
    assert not info["mismatched_keys"]
    assert {k.rsplit(".", 1)[0] for k in info["missing_keys"]} <= {"pooler.dense"}, info
    assert all(k.startswith(("classifier.", "pre_classifier.")) for k in info["unexpected_keys"]), info
    ours, _ = load_for_inference(best)
    ours.set_pooling(read_pooling(best).mode)
    ids, mask = inputs(ours.config, batch=4, width=20)
    expected = [mean_pooled(theirs(input_ids=ids, attention_mask=mask).last_hidden_state.detach(), mask)]
    with torch.no_grad():
        mine = [ours(ids, mask).embedding]
    _figure(f"embed-trained {model_type} max|diff| ours vs transformers", assert_close(mine, expected, mask, False))

    # exported as the multi-task graph it is: its heads plus the pooled embedding
    manifest = export(best, tmp_path / "artifact")
    assert manifest["task"] == "multi" and "embed" in manifest["tasks"]
    assert manifest["fused_operators"]["Attention"] == LAYERS
    session_outputs = [o["name"] for o in manifest["outputs"]]
    got = run_onnx(tmp_path / "artifact" / "model.onnx", ids, mask)[session_outputs.index("embedding")]
    worst = assert_close([got], expected, mask, per_token=False, tol=1e-4)
    _figure(f"embed-trained {model_type} ONNX fp32 max|diff| vs transformers", worst)
