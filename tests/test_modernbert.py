"""ModernBERT (model_type "modernbert", bert/families/modernbert.py) through bertserve: what only this family has
(the attention pattern and rotary bases read from its config, the window, a mean-pooled classifier, a masked LM
without a decoder bias, ONNX exports, served answers, its byte-level BPE, masked-LM pretraining, the rotary and
windowed blocks on a BERT layout). What every family with blocks of its own must do against transformers (padded
and packed logits, ours loaded back, fine-tuning from a backbone, an embedding teacher) is tests/
test_family_transformers.py, over this file's `Case`.

Tiny random models made with transformers (initializer_range 0.2, so that inputs are told apart), three layers
(global, windowed, global) with a 16-token window, and inputs of up to 1,100 tokens: the window and the rotary
positions both matter far past where a 512-position BERT would stop.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_families import CORPUS  # noqa: E402  (the texts the other families' served tests use)

from bert.checkpoint import load_checkpoint, load_for_inference, save_checkpoint  # noqa: E402
from bert.config import BertConfig  # noqa: E402

VOCAB = 320  # byte-level BPE: 256 bytes, 5 specials, merges
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=2,
    local_attention=16,
    global_attn_every_n_layers=2,
    max_position_embeddings=1200,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
)
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
HEADS = {  # our task -> transformers' class, its outputs, our graph outputs
    "classify": (transformers.ModernBertForSequenceClassification, ("logits",), ("classify_logits",)),
    "ner": (transformers.ModernBertForTokenClassification, ("logits",), ("ner_logits",)),
    "qa": (
        transformers.ModernBertForQuestionAnswering,
        ("start_logits", "end_logits"),
        ("qa_start_logits", "qa_end_logits"),
    ),
    "mlm": (transformers.ModernBertForMaskedLM, ("logits",), None),
    "embed": (transformers.ModernBertModel, ("last_hidden_state",), None),
}
LENGTHS = (1100, 300, 40)  # the first reaches past 1,024 positions; every one is longer than the window


def write_tokenizer(directory) -> None:
    """A byte-level BPE with ModernBERT's shape: [CLS] text [SEP] (pairs: [CLS] a [SEP] b [SEP]), as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    ).save_pretrained(directory)


def make_hf(head: str, directory, seed: int = 0, **overrides):
    config = transformers.ModernBertConfig(**{**TINY, "num_labels": 2 if head == "qa" else 3, **overrides})
    torch.manual_seed(seed)
    model = HEADS[head][0](config).eval()
    model.save_pretrained(directory)
    write_tokenizer(directory)
    return HEADS[head][0].from_pretrained(directory, attn_implementation="eager").eval()


def batch(lengths=LENGTHS, seed: int = 1, vocab: int = VOCAB):
    """Right-padded ids (no pad id among them) of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def theirs_out(model, head: str, ids, mask) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return [getattr(out, n) for n in HEADS[head][1]]


def worst(ours: list, theirs: list, mask, per_token: bool) -> float:
    """Max abs difference over the real tokens (a padded position is no output)."""
    found = 0.0
    for a, b in zip(ours, theirs):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        if per_token:
            keep = mask.bool()
            a, b = a[keep], b[keep]
        found = max(found, (a - b).abs().max().item())
    return found


_BUILT: dict = {}  # made once per test process, whichever file asks first (test_family_transformers.py too)


def built_checkpoints(tmp_path_factory):
    """head -> (directory, transformers' eager model)."""
    if "checkpoints" not in _BUILT:
        root = tmp_path_factory.mktemp("modernbert")
        _BUILT["checkpoints"] = {head: (root / head, make_hf(head, root / head)) for head in HEADS}
    return _BUILT["checkpoints"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return built_checkpoints(tmp_path_factory)


def our_padded(directory, head: str, ids, mask, implementation: str = "sdpa", outputs=None) -> list[torch.Tensor]:
    if head in ("mlm", "embed"):
        model, report = load_checkpoint(directory)
    else:
        model, report = load_for_inference(directory)
    assert not report, report
    model.set_attention_implementation(implementation)
    with torch.no_grad():
        if head == "mlm":
            return [model(ids, mask).mlm_logits]
        if head == "embed":
            return [model(ids, mask).last_hidden_state]
        out = model(ids, mask)
    return [out.outputs[n] for n in outputs or HEADS[head][2]]


class Case:
    """What the tests shared with the other families (tests/test_family_transformers.py) need of this one."""

    model_type = "modernbert"
    heads = HEADS
    loading = {"attn_implementation": "eager"}  # transformers' reference kernels, as make_hf loads them
    teacher_tasks = ("classify", "qa")  # the heads trained beside the kept embeddings

    def __init__(self, tmp_path_factory):
        self.checkpoints = built_checkpoints(tmp_path_factory)
        self.embed_texts = [TEXT, QUESTION]

    def batch(self, lengths=LENGTHS):
        return batch(lengths)

    our_padded = staticmethod(our_padded)
    theirs_out = staticmethod(theirs_out)

    @staticmethod
    def check_written(written: dict, reloaded, theirs) -> None:
        assert reloaded.config.layer_types == theirs.config.layer_types

    @staticmethod
    def trained_weight(model) -> torch.Tensor:
        """A weight fine-tuning changes, of a transformers model of this family (any head)."""
        return model.base_model.layers[1].attn.Wqkv.weight


def test_config_maps_the_attention_pattern_and_positions(checkpoints):
    config = BertConfig.from_json_file(checkpoints["classify"][0])
    assert config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert [config.attention_window(i) for i in range(3)] == [None, 8, None]
    assert [config.layer_rope_theta(i) for i in range(3)] == [160000.0, 10000.0, 160000.0]
    assert config.max_position_embeddings == 1200 and config.type_vocab_size == 0


def test_the_window_matters(checkpoints, tmp_path):
    """The same weights with every layer global give other logits: the windowed layer is not a global one."""
    directory, theirs = checkpoints["ner"]
    ids, mask = batch()
    data = json.loads((directory / "config.json").read_text())
    data["layer_types"] = ["full_attention"] * 3
    (tmp_path / "config.json").write_text(json.dumps(data))
    (tmp_path / "model.safetensors").symlink_to(directory / "model.safetensors")
    expected = theirs_out(theirs, "ner", ids, mask)
    assert worst(our_padded(tmp_path, "ner", ids, mask), expected, mask, per_token=True) > 1e-2


def test_mean_pooled_classifier(tmp_path):
    theirs = make_hf("classify", tmp_path, classifier_pooling="mean")
    ids, mask = batch()
    diff = worst(our_padded(tmp_path, "classify", ids, mask), theirs_out(theirs, "classify", ids, mask), mask, False)
    assert diff <= 1e-5, diff


def test_masked_lm_without_a_decoder_bias(tmp_path):
    """decoder_bias false (transformers' ModernBertForMaskedLM then has no decoder.bias): loads, gives their
    logits, serves its fill-mask head, and is written back without the bias."""
    theirs = make_hf("mlm", tmp_path / "theirs", decoder_bias=False)
    ids, mask = batch((300, 40))
    expected = theirs_out(theirs, "mlm", ids, mask)
    assert worst(our_padded(tmp_path / "theirs", "mlm", ids, mask), expected, mask, per_token=True) <= 1e-5
    served, report = load_for_inference(tmp_path / "theirs")
    assert not report, report
    with torch.no_grad():
        scores = served(ids, mask).outputs["fill_mask_scores"]
    top = expected[0].softmax(-1).topk(scores.shape[-1], dim=-1).values
    assert worst([scores], [top], mask, per_token=True) <= 1e-5
    model, _ = load_checkpoint(tmp_path / "theirs")
    save_checkpoint(model, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["decoder_bias"] is False
    reloaded, info = HEADS["mlm"][0].from_pretrained(
        tmp_path / "ours", output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert worst(theirs_out(reloaded.eval(), "mlm", ids, mask), expected, mask, per_token=True) == 0.0


@pytest.mark.parametrize("head", ["classify", "ner", "qa"])
def test_onnx_export_gives_their_logits(checkpoints, tmp_path, head):
    """python -m export.onnx: fp32 within 1e-4 of transformers; the manifest's fused counts are what the graph
    holds (onnxruntime's BERT Attention pattern has no rotary or windowed form: no Attention fusion is claimed)."""
    import onnx
    import onnxruntime as ort
    from test_serving_support import export_artifact

    directory, theirs = checkpoints[head]
    artifact = export_artifact(directory, tmp_path / "artifact")
    manifest = json.loads((artifact / "manifest.json").read_text())
    graph = onnx.load(str(artifact / "model.onnx"))
    ops = [node.op_type for node in graph.graph.node]
    # the manifest counts the fusion; the fp32 graph then splits each SkipLayerNormalization (Add + LayerNormalization)
    fused = dict(manifest["fused_operators"])
    fused["LayerNormalization"] += fused["SkipLayerNormalization"]
    fused["SkipLayerNormalization"] = 0
    assert fused == {op: ops.count(op) for op in fused}
    assert manifest["fused_operators"]["Attention"] == 0
    ids, mask = batch()
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    diff = worst([torch.from_numpy(g) for g in got], theirs_out(theirs, head, ids, mask), mask, head != "classify")
    assert diff <= 1e-4, diff
    if head == "classify":  # and served from the artifact by the onnxruntime backend, as transformers' pipeline
        import httpx
        from test_serving_support import Server

        with Server("--model", str(artifact)) as server:
            assert httpx.get(server.url + "/info").json()["backend"] == "onnxruntime"
            answer = httpx.post(server.url + "/classify", json={"inputs": [TEXT, LONG], "top_k": 3}, timeout=60)
        assert answer.status_code == 200, answer.text
        pipe = transformers.pipeline("text-classification", model=str(directory), top_k=3)
        for ours, expected in zip(answer.json(), pipe([TEXT, LONG])):
            assert [a["label"] for a in ours] == [b["label"] for b in expected]
            assert np.allclose([a["score"] for a in ours], [b["score"] for b in expected], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_fp16_and_int8_exports_pass_the_exporters_parity_check(checkpoints, tmp_path, precision):
    """Reduced precision runs (same fusions as fp32) and stays near transformers' logits (scale about 3)."""
    import onnxruntime as ort
    from test_serving_support import export_artifact

    directory, theirs = checkpoints["ner"]
    artifact = export_artifact(directory, tmp_path / "artifact", precision)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["parity"]["verified"] is True and manifest["fused_operators"]["Attention"] == 0
    ids, mask = batch()
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    diff = worst([torch.from_numpy(got[0]).float()], theirs_out(theirs, "ner", ids, mask), mask, True)
    assert diff <= (1e-2 if precision == "fp16" else 0.3), diff


# ---- through a real server, with its tokenizer ---------------------------------------------------------------

TEXT = "Hugging Face is based in New York City and Paris."
QUESTION, CONTEXT = "Where does Alice work?", "Alice moved from Paris to Berlin in 2019 to work at the museum."
LONG = " ".join(CORPUS[:5] * 8)  # 1,138 tokens: past BERT's 512, inside this model's 1,200


def test_tokenizer_offsets_equal_transformers(checkpoints):
    from bert.tokenizer import BertTokenizer

    directory = checkpoints["ner"][0]
    ours, theirs = BertTokenizer.from_dir(directory), transformers.AutoTokenizer.from_pretrained(directory)
    assert 1000 < len(ours.encode_batch([LONG])[0].ids) <= 1200
    for text in (TEXT, CONTEXT, LONG):
        encoding = ours.encode_batch([text])[0]
        expected = theirs(text, return_offsets_mapping=True)
        assert encoding.ids == expected["input_ids"]
        assert [tuple(o) for o in encoding.offsets] == [tuple(o) for o in expected["offset_mapping"]]
    pair = ours.encode_batch([(QUESTION, CONTEXT)])[0]
    assert pair.ids == theirs(QUESTION, CONTEXT)["input_ids"]


@pytest.mark.slow
def test_served_answers_equal_transformers_pipelines(checkpoints):
    import httpx
    from test_serving_support import Server

    dirs = {head: directory for head, (directory, _) in checkpoints.items()}
    args = ["--classify-model", str(dirs["classify"]), "--ner-model", str(dirs["ner"])]
    args += ["--qa-model", str(dirs["qa"]), "--fill-mask-model", str(dirs["mlm"])]
    with Server(*args) as server:

        def post(path, body):
            response = httpx.post(server.url + path, json=body, timeout=60)
            assert response.status_code == 200, response.text
            return response.json()

        texts = [TEXT, QUESTION, LONG]
        classified = post("/classify", {"inputs": texts, "top_k": 3})
        pipe = transformers.pipeline("text-classification", model=str(dirs["classify"]), top_k=3)
        for ours, theirs in zip(classified, pipe(texts)):
            assert [a["label"] for a in ours] == [b["label"] for b in theirs]
            assert np.allclose([a["score"] for a in ours], [b["score"] for b in theirs], atol=1e-5)

        entities = post("/ner", {"inputs": [TEXT, CONTEXT, LONG], "aggregation": "first"})
        pipe = transformers.pipeline("token-classification", model=str(dirs["ner"]), aggregation_strategy="first")
        for text, ours, theirs in zip([TEXT, CONTEXT, LONG], entities, pipe([TEXT, CONTEXT, LONG])):
            assert [(e["entity_group"], e["start"], e["end"]) for e in ours] == [
                (e["entity_group"], e["start"], e["end"]) for e in theirs
            ]
            assert np.allclose([e["score"] for e in ours], [float(e["score"]) for e in theirs], atol=1e-5)
            assert all(e["word"].strip() == text[e["start"] : e["end"]].strip() for e in ours)

        masked = "Alice moved from Paris to [MASK] in 2019."
        filled = post("/fill-mask", {"inputs": masked, "top_k": 5})
        pipe = transformers.pipeline("fill-mask", model=str(dirs["mlm"]), top_k=5)
        ours = filled[0] if filled and isinstance(filled[0], list) else filled
        assert [c["token"] for c in ours] == [c["token"] for c in pipe(masked)]
        assert np.allclose([c["score"] for c in ours], [c["score"] for c in pipe(masked)], atol=1e-5)

        # QA: the span the model's own logits rank first, over the context's tokens
        answer = post("/qa", {"question": QUESTION, "context": CONTEXT})
        theirs = checkpoints["qa"][1]
        tokenizer = transformers.AutoTokenizer.from_pretrained(dirs["qa"])
        encoded = tokenizer(QUESTION, CONTEXT, return_offsets_mapping=True, return_tensors="pt")
        with torch.no_grad():
            out = theirs(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
        context_tokens = [i for i, s in enumerate(encoded.sequence_ids(0)) if s == 1]
        start, end = out.start_logits[0], out.end_logits[0]
        best = max(
            ((s, e) for s in context_tokens for e in context_tokens if s <= e < s + 30),
            key=lambda se: (start[se[0]] + end[se[1]]).item(),
        )
        offsets = encoded["offset_mapping"][0]
        assert (answer["start"], answer["end"]) == (int(offsets[best[0]][0]), int(offsets[best[1]][1]))
        assert answer["answer"] == CONTEXT[answer["start"] : answer["end"]]


# ---- training from a ModernBERT backbone ----------------------------------------------------------------------

TRAIN = ["--max-steps", "3", "--batch-size", "8", "--learning-rate", "1e-3", "--max-train-examples", "24"]
TRAIN += ["--max-eval-examples", "16", "--seed", "0", "--no-progress", "--torch-threads", "1", "--device", "cpu"]


def training_data(data_dir, root, task: str) -> list[str]:
    """Slices of the real data (SST-2, CoNLL-2003, SQuAD) as a task's --train-data / --eval-data."""
    import gzip

    if task == "classify":
        sst2 = (data_dir / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
        (root / "train.tsv").write_text("\n".join(sst2[:65]) + "\n")
        (root / "dev.tsv").write_text("\n".join([sst2[0], *sst2[65:97]]) + "\n")
        return ["--train-data", str(root / "train.tsv"), "--eval-data", str(root / "dev.tsv")]
    if task == "ner":
        conll = (data_dir / "conll2003" / "train.txt").read_text(encoding="utf-8").split("\n\n")
        (root / "train.txt").write_text("\n\n".join(conll[:60]) + "\n")
        (root / "dev.txt").write_text("\n\n".join(conll[60:90]) + "\n")
        return ["--train-data", str(root / "train.txt"), "--eval-data", str(root / "dev.txt")]
    with gzip.open(data_dir / "squad-train" / "train-v1.1.part-01.json.gz", "rt", encoding="utf-8") as f:
        articles = [{**a, "paragraphs": a["paragraphs"][:3]} for a in json.load(f)["data"][:3]]
    if task == "rerank":  # (question, a sentence of its paragraph, 1 where the answer starts in it)
        for name, part in (("train", articles[:2]), ("dev", articles[2:])):
            rows = ["query\ttext\tlabel"]
            for paragraph in (p for a in part for p in a["paragraphs"]):
                context = paragraph["context"]
                cuts = [0, *(i + 2 for i in range(len(context)) if context.startswith(". ", i)), len(context)]
                for qa in paragraph["qas"][:3]:
                    start = qa["answers"][0]["answer_start"]
                    rows += [
                        f"{qa['question']}\t{context[a:b].strip()}\t{int(a <= start < b)}"
                        for a, b in zip(cuts, cuts[1:])
                    ]
            (root / f"{name}.tsv").write_text("\n".join(rows) + "\n")
        return ["--train-data", str(root / "train.tsv"), "--eval-data", str(root / "dev.tsv")]
    (root / "train.json").write_text(json.dumps({"version": "1.1", "data": articles[:2]}))
    (root / "dev.json").write_text(json.dumps({"version": "1.1", "data": articles[2:]}))
    return ["--train-data", str(root / "train.json"), "--eval-data", str(root / "dev.json")] + [
        "--doc-stride",
        "32",
        "--max-query-length",
        "16",
    ]


def test_mlm_pretraining_without_nsp_continues_a_masked_lm_that_transformers_loads(checkpoints, tmp_path):
    from training import pretrain

    corpus = tmp_path / "corpus.txt"
    documents = ["\n".join(f"{sentence} Part {i}." for sentence in CORPUS[:5]) for i in range(20)]
    corpus.write_text("\n\n".join(documents) + "\n")
    out = tmp_path / "pretrained"
    pretrain.main(
        ["--corpus", str(corpus), "--ckpt", str(checkpoints["mlm"][0]), "--no-nsp", "--output-dir", str(out)]
        + ["--max-seq-length", "48", "--max-predictions-per-seq", "8", "--dupe-factor", "2"]
        + ["--heldout-percent", "20", "--batch-size", "8", "--max-steps", "3", "--seed", "0", "--no-progress"]
        + ["--torch-threads", "1", "--device", "cpu"]
    )
    best = out / "best"
    assert json.loads((best / "config.json").read_text())["architectures"] == ["ModernBertForMaskedLM"]
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(best, attn_implementation="eager").eval()
    before = checkpoints["mlm"][1]
    assert not torch.equal(before.model.layers[0].mlp.Wi.weight, theirs.model.layers[0].mlp.Wi.weight)  # trained
    ids, mask = batch((300, 40))
    diff = worst(our_padded(best, "mlm", ids, mask), theirs_out(theirs, "mlm", ids, mask), mask, True)
    assert diff <= 1e-5, diff


# ---- the building blocks on their own: any family may pick them by config key ------------------------------


def test_rotary_and_windowed_blocks_on_a_bert_layout_pack_as_they_pad():
    """A BERT-layout model given rotary positions and a windowed layer by config alone: no position table, and the
    packed varlen path (window bounded per sequence) gives the padded path's answers."""
    from bert.model import BertForMultiTask
    from runtime.backends.torch_packed import PackedEncoder, PackedRunner, pack

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=1200,
        initializer_range=0.2,
        task="ner",
        id2label={0: "O", 1: "B-X", 2: "I-X"},
        rope_theta=10000.0,
        layer_types=["sliding_attention", "full_attention"],
        local_attention=16,
    )
    torch.manual_seed(0)
    model = BertForMultiTask(config).eval()
    assert model.bert.embeddings.position_embeddings is None
    ids, mask = batch()
    with torch.no_grad():
        padded = model(ids, mask).outputs["ner_logits"]
    packed = pack({"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": 0 * ids.numpy()})
    table = PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False).run(packed)
    assert worst([table["ner_logits"]], [padded], mask, per_token=True) <= 2e-5
    # and the window is real: the same weights with both layers global answer otherwise
    import dataclasses

    wide = BertForMultiTask(dataclasses.replace(config, layer_types=["full_attention"] * 2)).eval()
    wide.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert worst([wide(ids, mask).outputs["ner_logits"]], [padded], mask, per_token=True) > 1e-2


def test_no_weight_decay_on_any_norm_of_a_pre_norm_model(checkpoints):
    from training.loop import no_decay

    model, _ = load_checkpoint(checkpoints["classify"][0])
    norms = [f"{name}.weight" for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 8  # embeddings, 2 attention + 3 MLP pre-norms, final, pooler
    assert all(no_decay(n) for n in norms)
    projections = [n for n, _ in model.named_parameters() if n.endswith(("query.weight", "key.weight", "value.weight"))]
    assert len(projections) == 9 and not any(no_decay(n) for n in projections)
