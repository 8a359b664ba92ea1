"""DeBERTa-v2/v3 (model_type "deberta-v2", bert/families/deberta_v2.py) through bertserve: what only this family
has (log buckets, the v3 settings read from its config, the relative terms used, other settings and the refused
ones, ONNX and reduced-precision exports, served answers and zero-shot, its SentencePiece-style Unigram tokenizer,
the unused absolute table, pretraining a v3 config). What every family with blocks of its own must do against
transformers (padded and packed logits, ours loaded back, fine-tuning from a backbone, an embedding teacher) is
tests/test_family_transformers.py, over this file's `Case`.

Tiny random models made with transformers in DeBERTa-v3's settings (relative attention, c2p and p2c, 256
position buckets, a LayerNorm over the relative embeddings, shared attention keys, no absolute positions, no
token types), initializer_range 0.2 so that inputs are told apart, and inputs of 1 to 512 tokens: distances past
128 fall in the log buckets.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_families import CORPUS, _squad_contexts, _sst2_sentences, qa_windows_equal  # noqa: E402
from test_family_transformers import served  # noqa: E402
from test_modernbert import batch, worst  # noqa: E402

from bert.checkpoint import CheckpointError, load_checkpoint, load_for_inference  # noqa: E402
from bert.config import BertConfig, ConfigError  # noqa: E402

FULL = os.environ.get("BERTSERVE_TEST_FULL") == "1"
V3 = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=256,
    max_relative_positions=-1,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    position_biased_input=False,
    type_vocab_size=0,
)
TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=512,
    initializer_range=0.2,
    pad_token_id=0,
    **V3,
)
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # DeBERTa-v3's ids 0-3 (its [MASK] is last)
NLI_LABELS = ["entailment", "neutral", "contradiction"]
HEADS = {  # our task -> transformers' class, its outputs, our graph outputs
    "classify": (transformers.DebertaV2ForSequenceClassification, ("logits",), ("classify_logits",)),
    "ner": (transformers.DebertaV2ForTokenClassification, ("logits",), ("ner_logits",)),
    "qa": (
        transformers.DebertaV2ForQuestionAnswering,
        ("start_logits", "end_logits"),
        ("qa_start_logits", "qa_end_logits"),
    ),
    "mlm": (transformers.DebertaV2ForMaskedLM, ("logits",), None),
    "embed": (transformers.DebertaV2Model, ("last_hidden_state",), None),
}
LENGTHS = (512, 300, 40, 1)
# Several spaces, tabs, newlines and non-Latin scripts: DeBERTa-v3's normalizer folds whitespace runs
HARD_TEXTS = [
    "Hugging  Face   is based in\tNew York\t\tCity.",
    "  leading and trailing spaces  ",
    "line one\nline two\r\nline three",
    "Москва — столица России.",
    "東京は日本の首都です。",
    "القاهرة هي عاصمة مصر",
    "naïve café, Zürich; Ελλάδα and हिन्दी",
    "tab\tseparated\tvalues\t",
]


def train_tokenizer(directory, corpus: list[str], vocab_size: int = 600):
    """A Unigram tokenizer with Metaspace (▁ word starts), saved as transformers' DeBERTa-v2 tokenizer saves it;
    loaded once more and saved again, so that tokenizer.json holds the pipeline transformers itself runs
    (DebertaV2Tokenizer builds its own normalizer and pre-tokenizer around the vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(
        corpus,
        trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="[UNK]", show_progress=False),
    )
    transformers.DebertaV2TokenizerFast(
        tokenizer_object=tok,
        vocab=[(piece, score) for piece, score in json.loads(tok.to_str())["model"]["vocab"]],
        unk_id=SPECIALS.index("[UNK]"),
    ).save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(directory).save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)


def make_hf(head: str, directory, tokenizer_dir, vocab: int, seed: int = 0, **overrides):
    labels = NLI_LABELS if head == "classify" else ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    options = {}
    if head in ("classify", "ner"):
        options = dict(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    config = transformers.DebertaV2Config(**{**TINY, "vocab_size": vocab, **options, **overrides})
    torch.manual_seed(seed)
    model = HEADS[head][0](config).eval()
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).write_bytes((tokenizer_dir / name).read_bytes())
    return HEADS[head][0].from_pretrained(directory).eval()


_BUILT: dict = {}  # made once per test process, whichever file asks first (test_family_transformers.py too)


def built_tokenizer_dir(tmp_path_factory):
    if "tokenizer" not in _BUILT:
        directory = tmp_path_factory.mktemp("deberta-tokenizer")
        train_tokenizer(directory, CORPUS + HARD_TEXTS * 2)
        _BUILT["tokenizer"] = directory
    return _BUILT["tokenizer"]


def built_checkpoints(tmp_path_factory):
    """head -> (directory, transformers' model)."""
    if "checkpoints" not in _BUILT:
        tokenizer_dir = built_tokenizer_dir(tmp_path_factory)
        root = tmp_path_factory.mktemp("deberta")
        vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
        _BUILT["checkpoints"] = {
            head: (root / head, make_hf(head, root / head, tokenizer_dir, vocab)) for head in HEADS
        }
    return _BUILT["checkpoints"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return built_tokenizer_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return built_checkpoints(tmp_path_factory)


def vocab_of(checkpoints) -> int:
    return checkpoints["embed"][1].config.vocab_size


def theirs_out(model, head: str, ids, mask) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return [getattr(out, n) for n in HEADS[head][1]]


def our_padded(directory, head: str, ids, mask, implementation: str = "sdpa", outputs=None) -> list[torch.Tensor]:
    model, report = (load_checkpoint if head in ("mlm", "embed") else load_for_inference)(directory)
    assert not report, report
    model.set_attention_implementation(implementation)
    with torch.no_grad():
        out = model(ids, mask)
    if head == "mlm":
        return [out.mlm_logits]
    if head == "embed":
        return [out.last_hidden_state]
    return [out.outputs[n] for n in outputs or HEADS[head][2]]


class Case:
    """What the tests shared with the other families (tests/test_family_transformers.py) need of this one."""

    model_type = "deberta-v2"
    heads = HEADS
    loading: dict = {}
    teacher_tasks = ("classify",)  # the heads trained beside the kept embeddings

    def __init__(self, tmp_path_factory):
        self.checkpoints = built_checkpoints(tmp_path_factory)
        self.embed_texts = [TEXT, LONG, HARD_TEXTS[3]]

    def batch(self, lengths=LENGTHS):
        return batch(lengths, vocab=vocab_of(self.checkpoints))

    our_padded = staticmethod(our_padded)
    theirs_out = staticmethod(theirs_out)

    @staticmethod
    def check_written(written: dict, reloaded, theirs) -> None:
        for key, value in V3.items():
            assert written[key] == value, key

    @staticmethod
    def trained_weight(model) -> torch.Tensor:
        """A weight fine-tuning changes, of a transformers model of this family (any head)."""
        return model.base_model.encoder.layer[1].attention.self.query_proj.weight


# ---- the model: padded, packed, written back, exported --------------------------------------------------------


@pytest.mark.parametrize("buckets, max_position", [(256, 512), (64, 512), (32, 100)])
def test_relative_buckets_equal_transformers(buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    from bert.blocks.positions import relative_index

    states = torch.zeros(1, 512, 8)
    theirs = build_relative_position(states, states, bucket_size=buckets, max_position=max_position)[0]
    ours = relative_index(512, buckets, buckets, max_position, "cpu") - buckets
    assert torch.equal(ours, theirs.clamp(-buckets, buckets - 1))
    assert len(theirs.unique()) > buckets  # distances past buckets // 2 share log buckets, but many stay apart


def test_config_maps_the_v3_settings(checkpoints):
    config = BertConfig.from_json_file(checkpoints["classify"][0])
    assert config.relative_span == 256 and config.pos_att_type == ["p2c", "c2p"]
    assert not config.position_table and config.type_vocab_size == 0
    assert config.classifier_activation == "gelu" and config.layer_norm_eps == 1e-7
    model, _ = load_for_inference(checkpoints["classify"][0])
    names = {name for name, _ in model.named_parameters()}
    assert "bert.encoder.rel_embeddings.weight" in names and "bert.encoder.rel_embeddings_norm.weight" in names
    assert not any("position_embeddings" in n or "token_type_embeddings" in n for n in names)


def test_relative_attention_matters(checkpoints):
    """The same model with the relative terms left out gives other logits: the disentangled scores are used."""
    from bert.blocks.attention import DisentangledAttention

    directory, theirs = checkpoints["ner"]
    ids, mask = batch(LENGTHS, vocab=vocab_of(checkpoints))
    model, _ = load_for_inference(directory)
    for module in model.modules():
        if isinstance(module, DisentangledAttention):
            module.relative_terms = ()
    with torch.no_grad():
        ours = model(ids, mask).outputs["ner_logits"]
    assert worst([ours], theirs_out(theirs, "ner", ids, mask), mask, per_token=True) > 1e-2


@pytest.mark.parametrize(
    "overrides",
    [
        dict(share_att_key=False, pos_att_type=["c2p"], position_buckets=64),
        dict(share_att_key=False, position_biased_input=True, type_vocab_size=2, norm_rel_ebd="none"),
        dict(relative_attention=False, position_biased_input=True, pos_att_type="c2p|p2c"),
        dict(attention_head_size=16, conv_kernel_size=0),
    ],
    ids=["own-position-keys-c2p-only", "absolute-and-types", "v2-no-relative", "head-size-given-no-conv"],
)
def test_other_deberta_settings_give_their_logits(tokenizer_dir, tmp_path, overrides):
    """DeBERTa-v2's other settings: separate position projections, one term, absolute positions and token types."""
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    theirs = make_hf("classify", tmp_path, tokenizer_dir, vocab, seed=3, **overrides)
    ids, mask = batch((300, 7), vocab=vocab)
    for implementation in ("sdpa", "eager"):
        ours = our_padded(tmp_path, "classify", ids, mask, implementation)
        diff = worst(ours, theirs_out(theirs, "classify", ids, mask), mask, per_token=False)
        assert diff <= 1e-5, (implementation, diff)


@pytest.mark.parametrize(
    "key, value",
    [("conv_kernel_size", 3), ("attention_head_size", 8), ("pooler_hidden_size", 16), ("embedding_size", 16)],
)
def test_unsupported_switches_are_one_line_naming_the_key(checkpoints, tmp_path, key, value):
    data = json.loads((checkpoints["classify"][0] / "config.json").read_text())
    data[key] = value
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        BertConfig.from_json_file(tmp_path)
    message = str(caught.value)
    assert key in message and "\n" not in message


def test_masked_lm_outside_the_legacy_layout_is_refused(checkpoints, tmp_path):
    data = json.loads((checkpoints["mlm"][0] / "config.json").read_text())
    data["legacy"] = False
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="legacy"):
        BertConfig.from_json_file(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("head", ["classify", "ner", "qa"])
def test_onnx_export_gives_their_logits(checkpoints, tmp_path, head):
    """python -m export.onnx: fp32 within 1e-4 of transformers on 1 to 512 tokens. onnxruntime's BERT Attention
    fusion has no pattern with the relative scores, so no Attention is claimed; the manifest's counts are the graph's."""
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
    ids, mask = batch(LENGTHS, vocab=vocab_of(checkpoints))
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    diff = worst([torch.from_numpy(g) for g in got], theirs_out(theirs, head, ids, mask), mask, head != "classify")
    assert diff <= 1e-4, diff


@pytest.mark.slow
def test_fp16_export_stays_within_2e_3_relative_rms_of_fp32(checkpoints, tmp_path):
    """fp16 (input-independent relative-position projections kept fp32 and folded by onnxruntime) against the
    fp32 export, over the real tokens of 1 to 512-token inputs."""
    import onnxruntime as ort
    from test_serving_support import export_artifact

    directory, _ = checkpoints["ner"]
    ids, mask = batch(LENGTHS, vocab=vocab_of(checkpoints))
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    logits = {}
    for precision in ("fp32", "fp16"):
        artifact = export_artifact(directory, tmp_path / precision, precision)
        session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
        got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]
        logits[precision] = got.astype(np.float32)[mask.bool().numpy()]
    error = np.sqrt(((logits["fp16"] - logits["fp32"]) ** 2).mean()) / np.sqrt((logits["fp32"] ** 2).mean())
    assert 0 < error <= 2e-3, error


# ---- served, with the Unigram tokenizer -----------------------------------------------------------------------

TEXT = "Hugging Face is based in New York City and Paris."
QUESTION, CONTEXT = "Where does Alice work?", "Alice moved from Paris to Berlin in 2019 to work at the museum."
LONG = " ".join(CORPUS[:5] * 3)  # about 480 tokens with this tokenizer: distances in the log buckets


@pytest.mark.slow
def test_served_answers_equal_transformers_pipelines(checkpoints):
    import httpx
    from test_serving_support import Server

    dirs = {head: directory for head, (directory, _) in checkpoints.items()}
    args = ["--classify-model", str(dirs["classify"]), "--ner-model", str(dirs["ner"])]
    args += ["--qa-model", str(dirs["qa"]), "--fill-mask-model", str(dirs["mlm"])]
    args += ["--zero-shot-model", str(dirs["classify"])]
    texts = [TEXT, QUESTION, LONG, HARD_TEXTS[0], HARD_TEXTS[3]]
    tokens = transformers.AutoTokenizer.from_pretrained(dirs["classify"])(LONG)["input_ids"]
    assert 300 < len(tokens) <= 512  # distances in the log buckets
    with Server(*args) as server:

        def post(path, body):
            response = httpx.post(server.url + path, json=body, timeout=60)
            assert response.status_code == 200, response.text
            return response.json()

        classified = post("/classify", {"inputs": texts, "top_k": 3})
        pipe = transformers.pipeline("text-classification", model=str(dirs["classify"]), top_k=3)
        for ours, theirs in zip(classified, pipe(texts)):
            assert [a["label"] for a in ours] == [b["label"] for b in theirs]
            assert np.allclose([a["score"] for a in ours], [b["score"] for b in theirs], atol=1e-5)

        entities = post("/ner", {"inputs": texts, "aggregation": "first"})
        pipe = transformers.pipeline("token-classification", model=str(dirs["ner"]), aggregation_strategy="first")
        found = 0
        for ours, theirs in zip(entities, pipe(texts)):
            assert [(e["entity_group"], e["start"], e["end"]) for e in ours] == [
                (e["entity_group"], e["start"], e["end"]) for e in theirs
            ]
            assert np.allclose([e["score"] for e in ours], [float(e["score"]) for e in theirs], atol=1e-5)
            found += len(ours)
        assert found > 5

        masked = "Alice moved from Paris to [MASK] in 2019."
        filled = post("/fill-mask", {"inputs": masked, "top_k": 5})
        pipe = transformers.pipeline("fill-mask", model=str(dirs["mlm"]), top_k=5)
        ours = filled[0] if filled and isinstance(filled[0], list) else filled
        assert [c["token"] for c in ours] == [c["token"] for c in pipe(masked)]
        assert np.allclose([c["score"] for c in ours], [c["score"] for c in pipe(masked)], atol=1e-5)

        candidates = ["travel", "art", "science"]
        zero = post("/zero-shot", {"inputs": [TEXT, CONTEXT], "candidate_labels": candidates})
        pipe = transformers.pipeline("zero-shot-classification", model=str(dirs["classify"]))
        for ours, text in zip(zero, [TEXT, CONTEXT]):
            theirs = pipe(text, candidate_labels=candidates)
            assert ours["labels"] == theirs["labels"] and ours["sequence"] == theirs["sequence"]
            assert np.allclose(ours["scores"], theirs["scores"], atol=1e-5)

        # QA: the answer bertserve's decoding (transformers' v4 pipeline: spans widened to whole words, equal
        # texts merged) gives over transformers' own logits for the same window
        from bert.tasks import qa
        from bert.tokenizer import BertTokenizer

        answer = post("/qa", {"question": QUESTION, "context": CONTEXT})
        window = qa.encode(BertTokenizer.from_dir(dirs["qa"]), QUESTION, CONTEXT, max_length=512, doc_stride=128)
        assert len(window) == 1
        ids = torch.tensor([window[0].input_ids])
        start, end = theirs_out(checkpoints["qa"][1], "qa", ids, torch.ones_like(ids))
        expected = qa.decode(CONTEXT, window, [start[0].numpy()], [end[0].numpy()])[0]
        assert (answer["start"], answer["end"], answer["answer"]) == (
            expected["start"],
            expected["end"],
            expected["answer"],
        )
        assert abs(answer["score"] - expected["score"]) <= 1e-5


# ---- the tokenizer: DeBERTa-v3's SentencePiece-derived Unigram ------------------------------------------------


def _conll_sentences(data_dir, count: int) -> list[list[str]]:
    sentences, words = [], []
    with open(data_dir / "conll2003" / "valid.txt", encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append(words)
                    words = []
                    if len(sentences) == count:
                        break
                continue
            words.append(line.split()[0])
    return sentences


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    from bert.tokenizer import BertTokenizer

    directory = tmp_path_factory.mktemp("deberta-unigram")
    corpus = _sst2_sentences(data_dir, "train")[:20000] + [c for _, c in _squad_contexts(data_dir, 300)] + HARD_TEXTS
    theirs = train_tokenizer(directory, corpus, vocab_size=2000)
    assert type(theirs).__name__ in ("DebertaV2Tokenizer", "DebertaV2TokenizerFast")
    return BertTokenizer.from_dir(directory), theirs


def _same(ours, theirs, firsts, seconds=None) -> int:
    mine = ours.encode_batch(firsts, seconds)
    ref = (
        theirs(firsts, seconds, return_offsets_mapping=True) if seconds else theirs(firsts, return_offsets_mapping=True)
    )
    for e, ids, offsets in zip(mine, ref["input_ids"], ref["offset_mapping"], strict=True):
        assert e.ids == ids and [tuple(o) for o in e.offsets] == [tuple(o) for o in offsets]
    return len(mine)


def test_unigram_ids_and_offsets_equal_transformers(trained, data_dir):
    """SST-2 dev, SQuAD contexts alone and as (question, context) pairs, CoNLL sentences, and texts with runs of
    spaces, tabs, newlines and non-Latin scripts (every SST-2 dev sentence, 1,000 SQuAD contexts and 200 CoNLL
    sentences with BERTSERVE_TEST_FULL=1; a sample of each otherwise)."""
    ours, theirs = trained
    assert ours.pad_token_id == theirs.pad_token_id and ours.cls_token_id == theirs.cls_token_id
    assert ours.pair_template[:3] == ([theirs.cls_token_id], [theirs.sep_token_id], [theirs.sep_token_id])
    sst2 = _sst2_sentences(data_dir, "dev")
    pairs = _squad_contexts(data_dir, 1000 if FULL else 100)
    conll = [" ".join(words) for words in _conll_sentences(data_dir, 200 if FULL else 40)]
    counted = _same(ours, theirs, HARD_TEXTS)
    counted += _same(ours, theirs, sst2 if FULL else sst2[::8])
    counted += _same(ours, theirs, [c for _, c in pairs])
    counted += _same(ours, theirs, [q for q, _ in pairs], [c for _, c in pairs])
    counted += _same(ours, theirs, conll)
    assert counted >= (872 + 2000 + 200 if FULL else 100)


def test_unigram_qa_windows_and_ner_words_equal_transformers(trained, data_dir):
    """QA windows (only_second truncation with a stride) and pre-split CoNLL words: ids, offsets and word ids."""
    ours, theirs = trained
    compared = qa_windows_equal(ours, theirs, _squad_contexts(data_dir, 1000 if FULL else 50))
    assert compared > (50 if not FULL else 1000)
    words = _conll_sentences(data_dir, 200 if FULL else 40)
    mine = ours.encode_batch(words, is_split_into_words=True)
    ref = theirs(words, is_split_into_words=True)
    for k, e in enumerate(mine):
        assert e.ids == ref["input_ids"][k] and e.word_ids == ref.word_ids(k)


# ---- fine-tuned from a DeBERTa backbone, exported int8 ----------------------------------------------------------


@pytest.mark.slow
def test_int8_export_passes_the_exporters_parity_check(checkpoints, tmp_path):
    """Dynamic int8 (the default scope) runs and stays near transformers' logits (scale about 3)."""
    import onnxruntime as ort
    from test_serving_support import export_artifact

    directory, theirs = checkpoints["ner"]
    artifact = export_artifact(directory, tmp_path / "artifact", "int8")
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["parity"]["verified"] is True and manifest["fused_operators"]["Attention"] == 0
    ids, mask = batch(LENGTHS, vocab=vocab_of(checkpoints))
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    diff = worst([torch.from_numpy(got[0]).float()], theirs_out(theirs, "ner", ids, mask), mask, True)
    assert diff <= 0.3, diff


# ---- the checkpoints transformers' users have ------------------------------------------------------------------


def test_an_unused_absolute_position_table_is_skipped_with_a_log_line(checkpoints, tmp_path, caplog):
    """DeBERTa-v3's released checkpoints carry deberta.embeddings.position_embeddings.weight although
    position_biased_input false never reads it (transformers skips it on load): it loads, for inference and as a
    backbone, with one log line naming the key and transformers' logits; a model that does read a table still
    refuses a checkpoint without one."""
    import logging
    import shutil

    from safetensors.torch import load_file, save_file

    directory, theirs = checkpoints["classify"]
    shutil.copytree(directory, tmp_path / "hub")
    weights = load_file(tmp_path / "hub" / "model.safetensors")
    key = "deberta.embeddings.position_embeddings.weight"
    assert key not in weights
    weights[key] = torch.randn(512, TINY["hidden_size"])
    save_file(weights, tmp_path / "hub" / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.INFO, logger="bert.checkpoint"):
        ids, mask = batch((300, 7), vocab=vocab_of(checkpoints))
        diff = worst(
            our_padded(tmp_path / "hub", "classify", ids, mask), theirs_out(theirs, "classify", ids, mask), mask, False
        )
        assert diff <= 1e-5, diff
        model, report = load_checkpoint(tmp_path / "hub", from_backbone=True)
    lines = [r.getMessage() for r in caplog.records if "position_embeddings" in r.getMessage()]
    assert lines and "skipped" in lines[0] and "\n" not in lines[0], lines
    assert model.bert.embeddings.position_embeddings is None and not report.dropped

    data = json.loads((tmp_path / "hub" / "config.json").read_text())
    (tmp_path / "absolute").mkdir()
    (tmp_path / "absolute" / "config.json").write_text(json.dumps({**data, "position_biased_input": True}))
    del weights[key]
    save_file(weights, tmp_path / "absolute" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="position_embeddings"):
        load_for_inference(tmp_path / "absolute")


def test_nli_finetuned_from_backbone_serves_zero_shot_as_the_pipeline(checkpoints, data_dir, tmp_path):
    """python -m training.finetune --task classify on (premise, hypothesis) pairs from a DeBERTa-v3 backbone: the
    NLI classifier loads in transformers with its logits, and /zero-shot answers as transformers'
    zero-shot-classification pipeline on the written weights, on a text past the log buckets too."""
    from test_modernbert import TRAIN
    from test_task_zero_shot import _nli_from_sst2, _sst2

    from serving.settings import Settings
    from training import finetune
    from training.config import run

    _nli_from_sst2(tmp_path / "train.tsv", _sst2(data_dir / "SST-2" / "train.tsv")[:24])
    _nli_from_sst2(tmp_path / "dev.tsv", _sst2(data_dir / "SST-2" / "dev.tsv")[:8])
    out = tmp_path / "run"
    argv = ["--task", "classify", "--ckpt", str(checkpoints["embed"][0]), "--output-dir", str(out)]
    argv += ["--train-data", str(tmp_path / "train.tsv"), "--eval-data", str(tmp_path / "dev.tsv")]
    argv += ["--text-column", "0", "--pair-column", "1", "--label-column", "2", "--header", "yes"]
    assert run(finetune.main, [*argv, "--max-seq-length", "64", *TRAIN]) == 0
    best = out / "best"
    theirs, info = transformers.DebertaV2ForSequenceClassification.from_pretrained(best, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert sorted(theirs.config.id2label.values()) == ["contradiction", "entailment"]
    ids, mask = batch((300, 40), vocab=vocab_of(checkpoints))
    diff = worst(our_padded(best, "classify", ids, mask), theirs_out(theirs.eval(), "classify", ids, mask), mask, False)
    assert diff <= 1e-5, diff

    texts, candidates = [TEXT, LONG], ["travel", "art", "science"]
    answers = served(
        Settings(zero_shot_model=[str(best)]), "/zero-shot", {"inputs": texts, "candidate_labels": candidates}
    )
    pipe = transformers.pipeline("zero-shot-classification", model=str(best))
    for ours, text in zip(answers, texts, strict=True):
        expected = pipe(text, candidate_labels=candidates)
        assert ours["labels"] == expected["labels"] and np.allclose(ours["scores"], expected["scores"], atol=1e-5)


# ---- pretraining a DeBERTa-v3 -----------------------------------------------------------------------------------

PRETRAIN = ["--max-seq-length", "48", "--max-predictions-per-seq", "8", "--dupe-factor", "2", "--heldout-percent", "20"]
PRETRAIN += ["--batch-size", "8", "--max-steps", "3", "--seed", "0", "--no-progress", "--torch-threads", "1"]
PRETRAIN += ["--device", "cpu"]


def test_pretraining_a_deberta_v3_config_with_masked_lm_and_a_unigram_vocabulary(tmp_path, capsys):
    """python -m training.pretrain --preset a DeBERTa-v3 config.json --vocab-model unigram --no-nsp: a masked LM
    transformers loads with equal logits, and a vocabulary whose ids and offsets are transformers' for the
    tokenizer it wrote (texts with runs of spaces, tabs and non-Latin scripts included). With next-sentence
    prediction left on, the run is refused in one line before any work."""
    from training import pretrain

    corpus = tmp_path / "corpus.txt"
    documents = ["\n".join(f"{sentence} Part {i}." for sentence in CORPUS + HARD_TEXTS) for i in range(12)]
    corpus.write_text("\n\n".join(documents) + "\n")
    config = tmp_path / "deberta-v3.json"
    config.write_text(json.dumps({"model_type": "deberta-v2", **TINY, "vocab_size": 1}))
    out = tmp_path / "pretrained"
    argv = ["--corpus", str(corpus), "--preset", str(config), "--vocab-size", "300", "--output-dir", str(out)]
    with pytest.raises(SystemExit) as refused:
        pretrain.main([*argv, "--vocab-model", "unigram", *PRETRAIN])
    error = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and "--no-nsp" in error and "\n" not in error and not out.exists(), error
    assert pretrain.main([*argv, "--vocab-model", "unigram", "--no-nsp", *PRETRAIN]) == 0
    best = out / "best"
    theirs = transformers.DebertaV2ForMaskedLM.from_pretrained(best).eval()
    assert json.loads((best / "config.json").read_text())["architectures"] == ["DebertaV2ForMaskedLM"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(best)
    assert theirs.config.vocab_size == len(tokenizer) and not theirs.config.position_biased_input
    ids, mask = batch((300, 40), vocab=len(tokenizer))
    diff = worst(our_padded(best, "mlm", ids, mask), theirs_out(theirs, "mlm", ids, mask), mask, True)
    assert diff <= 1e-5, diff

    from bert.tokenizer import BertTokenizer

    texts = [*HARD_TEXTS, *CORPUS]
    assert _same(BertTokenizer.from_dir(best), tokenizer, texts) == len(texts)
    assert _same(BertTokenizer.from_dir(best), tokenizer, texts[:5], texts[5:10]) == 5
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("Paris is based in Berlin")["input_ids"])
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]" and pieces[1].startswith("\u2581")  # ▁ word starts
