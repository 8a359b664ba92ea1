"""The torch backend's packed path (runtime/backends/torch_packed.py).

On CPU: packing, buckets, the packed encoder with its bucket padding (empty sequences, filler tokens)
and every head equal the padded model; the load-time probe turns a wrong fast path off. The attention
kernel there is the per-sequence reference, and buckets run eagerly instead of as CUDA graphs.
On a GPU (marker `gpu`, skipped without CUDA): the flash varlen kernels, CUDA graphs, fp16/bf16 against
an fp32 reference, many shapes, concurrent callers, and SDPA's flash kernel on unpadded batches.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bert.config import BertConfig  # noqa: E402
from bert.model import activation  # noqa: E402
from bert.tasks.registry import TASKS  # noqa: E402
from runtime.backends import torch_backend  # noqa: E402
from runtime.backends.torch_packed import (  # noqa: E402
    PackedEncoder,
    PackedRunner,
    attention_reference,
    batch_bucket,
    pack,
    pack_sequences,
    token_bucket,
)

CUDA = torch.cuda.is_available()
TOKENIZER = Path(__file__).resolve().parents[1] / "serving" / "demo_model"  # part of the checkout, wherever it runs
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False)"
NER = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def tiny_model(kind: str, *, hidden=32, layers=2, heads=2, seed=0):
    """What the torch backend serves: every checkpoint as a BertForMultiTask (single-task heads at transformers'
    names), here randomly initialised."""
    from bert.model import BertForMultiTask

    common = dict(
        vocab_size=1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
    )
    if kind == "multi":
        config = BertConfig(**common, task_labels={"classify": ["a", "b"], "ner": NER, "qa": []})
    elif kind == "qa":
        config = BertConfig(**common, task="qa")
    else:
        config = BertConfig(**common, task=kind, id2label=dict(enumerate(["a", "b"] if kind == "classify" else NER)))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BertForMultiTask(config)
    with torch.no_grad():  # decisive heads, so that wrong rows show
        for name, p in model.named_parameters():
            if "classifier" in name or "qa_outputs" in name:
                p.mul_(20)
    return model.eval()


def random_batch(lengths, width=None, seed=0, vocab=1000):
    rng = np.random.default_rng(seed)
    width = width or max(lengths)
    ids = rng.integers(5, vocab, size=(len(lengths), width))
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    types = ((np.arange(width)[None, :] >= np.array(lengths)[:, None] // 2) * mask).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


def ours(table: dict) -> dict:
    """A model's output table (graph-output names) under the backend's output names."""
    names = {name: out for task in TASKS.values() for name, out in task.graph_outputs.items()}
    return {names[k]: v for k, v in table.items()}


def padded_outputs(model, batch, device="cpu", dtype=torch.float32) -> dict[str, np.ndarray]:
    """What the padded model gives, under the backend's output names."""
    with torch.inference_mode():
        out = model.to(device=device, dtype=dtype)(**{k: torch.from_numpy(v).to(device) for k, v in batch.items()})
    return ours({k: v.float().cpu().numpy() for k, v in out.outputs.items()})


def served_reference(path, backend):
    """The checkpoint in fp32 on the CPU, as the backend serves it: with the pooled embedding the backend's model
    also returns (the spec's pooling), so that both give the same outputs."""
    from bert.checkpoint import load_checkpoint

    reference, _ = load_checkpoint(path)
    reference.set_pooling(backend.model.encoder_module().pooling)
    return reference


def assert_close(got, want, batch, atol, rtol=0.0):
    where = batch["attention_mask"] != 0
    problem = torch_backend.mismatch(got, want, atol, rtol, where=where)
    assert not problem, problem


# ----------------------------------------------------------------------------- packing and buckets


def test_pack_keeps_real_tokens_row_after_row():
    batch = random_batch([3, 5, 1], width=8)
    packed = pack(batch)
    assert packed.cu_seqlens.tolist() == [0, 3, 8, 9]
    assert packed.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]
    assert packed.ids.tolist() == (
        batch["input_ids"][0, :3].tolist() + batch["input_ids"][1, :5].tolist() + batch["input_ids"][2, :1].tolist()
    )
    assert packed.max_len == 5 and packed.batch == 3 and packed.tokens == 9
    assert packed.ids.dtype == np.int32 and packed.cu_seqlens.dtype == np.int32


def features_of(batch: dict) -> list:
    from bert.tasks import Features

    lengths = batch["attention_mask"].sum(axis=1)
    return [
        Features(batch["input_ids"][i, :n].tolist(), batch["token_type_ids"][i, :n].tolist())
        for i, n in enumerate(lengths)
    ]


def test_unpadded_sequences_pack_as_their_padded_batch_does():
    batch = random_batch([3, 5, 1, 7], width=8, seed=2)
    direct, stripped = pack_sequences(features_of(batch)), pack(batch)
    for field in ("ids", "types", "positions", "cu_seqlens"):
        got, want = getattr(direct, field), getattr(stripped, field)
        assert got.dtype == want.dtype and np.array_equal(got, want), field
    assert direct.max_len == stripped.max_len and direct.where is None


def test_pack_refuses_masks_it_cannot_represent():
    holes = random_batch([4, 4], width=6)
    holes["attention_mask"][0, 1] = 0  # a hole: not right padding
    assert pack(holes) is None
    assert pack(random_batch([0, 3], width=4)) is None  # an empty row


def test_buckets_round_up_by_at_most_an_eighth_or_64_tokens():
    assert [batch_bucket(b) for b in (1, 2, 3, 5, 8, 9, 32, 33, 128)] == [1, 2, 4, 8, 8, 16, 32, 64, 128]
    previous = 0
    for tokens in range(1, 50_000, 7):
        bucket = token_bucket(tokens)
        assert bucket >= tokens and bucket >= previous  # covers the tokens; never shrinks as they grow
        assert bucket - tokens < max(64, tokens // 8 + 1)
        previous = bucket
    # The shapes the benchmark uses are their own buckets: no filler at fixed 384 x B.
    assert all(token_bucket(384 * b) == 384 * b for b in (1, 8, 32, 128))
    assert all(token_bucket(128 * b) == 128 * b for b in (1, 128))
    assert len({token_bucket(t) for t in range(4096, 8193)}) == 9  # 8 buckets per doubling (+ the top)


# ----------------------------------------------------------------------------- the packed encoder on CPU


@pytest.mark.parametrize("kind", ["multi", "qa", "classify", "ner", "sparse"])
def test_packed_runner_equals_padded_model_for_every_head(kind):
    model = tiny_model(kind)
    runner = PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False)
    # 5 rows -> a bucket of 8 (3 empty sequences); 77 tokens -> a bucket of 128 (51 filler tokens)
    batch = random_batch([1, 30, 17, 24, 5], width=32, seed=1)
    assert runner.key(pack(batch)) == (8, 128)
    got = ours(runner.run(pack(batch)))
    want = padded_outputs(model, batch)
    assert set(got) == set(want)
    assert_close(got, want, batch, atol=2e-5)


def test_packed_path_runs_the_models_own_modules():
    """The packed forward is bert/model.py's (a Packing in place of the mask): the encoder holds no weights of
    its own, every layer module of the model runs, and the only extra tensors are the fused QKV weights."""
    model = tiny_model("multi")
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    encoder = PackedEncoder(model)
    held = [
        name
        for name, value in vars(encoder).items()
        if isinstance(value, (torch.Tensor, torch.nn.Module)) and value is not model
    ]
    assert held == []
    calls = []
    for module in [
        *model.bert.encoder.layer,
        model.bert.embeddings,
        model.bert.pooler,
        model.classifier,
        model.token_classifier,
        model.qa_outputs,
    ]:
        module.register_forward_hook(lambda m, args, out: calls.append(type(m).__name__))
    batch = random_batch([4, 9, 2], seed=3)
    got = ours(PackedRunner(encoder, torch.device("cpu"), graphs=False).run(pack(batch)))
    assert calls.count("BertLayer") == 2 and {"BertEmbeddings", "BertPooler", "Linear"} <= set(calls)
    assert_close(got, padded_outputs(model, batch), batch, atol=2e-5)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before  # no copies, no moves
    extra = [a.fused_qkv for a in model.modules() if isinstance(a, torch.nn.Module) and hasattr(a, "fused_qkv")]
    assert len(extra) == 2 and all(w.shape == (3 * 32, 32) for w, _ in extra)
    assert not any("fused" in key for key in model.state_dict())  # not a parameter: checkpoints unchanged


def test_packed_runner_runs_int8_products_as_the_padded_model_does():
    """With int8 matrix products (bert/precision.py) the packed path stacks query, key and value as int8 (a stacked
    fp32 QKV weight would bypass them) and, each row quantised on its own, answers as the padded batch does."""
    from bert.precision import low_precision_matmuls

    model = tiny_model("multi")
    fp32 = padded_outputs(model, random_batch([1, 30, 17, 24, 5], width=32, seed=1))
    low_precision_matmuls(model, model.config)
    runner = PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False)
    stacked = [a.fused_qkv for a in model.modules() if hasattr(a, "fused_qkv")]
    assert len(stacked) == 2 and all(callable(f) for f in stacked)  # int8 products, not a stacked fp32 weight
    batch = random_batch([1, 30, 17, 24, 5], width=32, seed=1)
    got, want = ours(runner.run(pack(batch))), padded_outputs(model, batch)
    assert_close(got, want, batch, atol=1e-4, rtol=1e-4)  # float summation order only (decisive heads: x20)
    assert any(not np.allclose(want[k], fp32[k], atol=1e-3) for k in want)  # int8 ran: not the fp32 answers


@pytest.mark.parametrize("mode", ["cls", "mean"])
def test_packed_pooling_equals_padded_pooling(mode):
    model = tiny_model("classify")
    model.set_pooling(mode)
    batch = random_batch([7, 31, 1, 12], seed=5)
    got = ours(PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False).run(pack(batch)))
    want = padded_outputs(model, batch)
    assert set(got) == {"classify", "embed"} == set(want)
    assert_close(got, want, batch, atol=2e-5)
    model.set_pooling("max")
    with pytest.raises(TypeError, match="max pooling"):
        PackedEncoder(model)


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_gelu_inside_the_feed_forward_gemm(act):
    """The GELU-epilogue GEMM (torch._addmm_activation) computes the feed-forward layer: on by default only
    for tanh-GELU models, on request for exact-GELU ones (on CUDA the epilogue is the tanh approximation)."""
    model = tiny_model("multi")
    model.config.hidden_act = act
    for block in model.bert.encoder.layer:
        block.intermediate.act = activation(act)
    assert PackedEncoder(model).gelu_epilogue is (act == "gelu_new")
    encoder = PackedEncoder(model, gelu_epilogue=True)
    assert encoder.gelu_epilogue
    batch = random_batch([9, 32, 3], seed=8)
    got = ours(PackedRunner(encoder, torch.device("cpu"), graphs=False).run(pack(batch)))
    assert_close(got, padded_outputs(model, batch), batch, atol=5e-3, rtol=1e-3)


def test_a_bucket_reused_by_a_smaller_batch_forgets_the_larger_one():
    model = tiny_model("multi")
    runner = PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False)
    big, small = random_batch([31, 30, 29, 4], seed=2), random_batch([3, 40, 30], seed=3)
    assert runner.key(pack(big)) == runner.key(pack(small)) == (4, 128)  # the same static buffers
    runner.run(pack(big))
    assert_close(ours(runner.run(pack(small))), padded_outputs(model, small), small, atol=2e-5)
    assert len(runner.buckets) == 1


def test_runner_keeps_at_most_max_buckets():
    model = tiny_model("classify")
    runner = PackedRunner(PackedEncoder(model), torch.device("cpu"), graphs=False, max_buckets=2)
    for rows in (1, 2, 4, 8):
        runner.run(pack(random_batch([5] * rows)))
    assert list(runner.buckets) == [(4, 64), (8, 64)]


def test_graph_capture_code_runs_against_torch_cuda_api(monkeypatch):
    """Every line of the capture path runs here against stand-ins for torch.cuda's graph API (whose real
    signatures must take the arguments passed): a typo cannot wait for the GPU machine to show."""
    import contextlib
    import inspect

    from runtime.backends.torch_packed import _Bucket

    assert {"pool", "capture_error_mode"} <= set(inspect.signature(torch.cuda.graph.__init__).parameters)
    assert hasattr(torch.cuda.CUDAGraph, "replay") and callable(torch.cuda.graph_pool_handle)
    calls = []

    class Graph:
        def replay(self):
            calls.append("replay")

    class Stream:
        def wait_stream(self, other):
            calls.append("wait")

        def synchronize(self):
            calls.append("sync")

    @contextlib.contextmanager
    def graph(g, pool=None, capture_error_mode="global"):
        calls.append(("capture", pool, capture_error_mode))
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    encoder = PackedEncoder(tiny_model("multi"))
    with torch.inference_mode():
        bucket = _Bucket(encoder, torch.device("cpu"), 4, 64, graph=True, pool="shared")
        assert ("capture", "shared", "thread_local") in calls and bucket.graph is not None
        outputs = bucket.run(pack(random_batch([3, 9, 5])))
    assert calls[-1] == "replay"
    assert outputs["ner_logits"].shape == (17, len(NER)) and outputs["classify_logits"].shape == (3, 2)


# ----------------------------------------------------------------------------- the backend and its probe


@pytest.fixture(scope="module")
def multi_checkpoint(tmp_path_factory):
    from bert.checkpoint import save_checkpoint

    return save_checkpoint(
        tiny_model("multi", hidden=32), tmp_path_factory.mktemp("packed") / "multi", tokenizer=TOKENIZER
    )


def make_backend(path, device="cpu", precision="fp32", **options):
    from runtime.model_dir import read_model_spec

    settings = SimpleNamespace(
        device=device,
        precision=precision,
        effective_precision=precision,
        threads=None,
        effective_inference_workers=1,
        torch_packed=None,
        torch_cuda_graphs=None,
        torch_gelu_epilogue=None,
    )
    return torch_backend.TorchBackend(read_model_spec(path), settings, **options)


def test_cpu_backend_is_padded_by_default_and_packed_on_request(multi_checkpoint):
    padded = make_backend(multi_checkpoint)
    packed = make_backend(multi_checkpoint, packed=True)
    assert padded.fast_path["packed"] is False and padded.runner is None
    assert packed.fast_path == {
        "packed": True,
        "attention": "attention_reference",
        "cuda_graphs": False,
        "gelu_epilogue": False,
        "notes": [],
    }
    batch = random_batch([7, 40, 1, 19], width=40, seed=4)
    assert_close(packed.run(batch), padded.run(batch), batch, atol=2e-5)
    holes = random_batch([6, 6], width=6, seed=5)
    holes["attention_mask"][1, 2] = 0  # not right-padded: the packed backend runs it padded
    assert_close(packed.run(holes), padded.run(holes), holes, atol=0)


def test_the_server_flags_choose_the_packed_path(multi_checkpoint, monkeypatch):
    """--torch-packed / --torch-gelu-epilogue as `python -m serving` reads them reach the backend; an argument
    given to the backend wins over them."""
    from bert import options
    from runtime.model_dir import read_model_spec
    from serving.settings import Settings

    monkeypatch.delenv("BERTSERVE_TORCH_PACKED", raising=False)
    values = options.read(Settings, ["--torch-packed", "--torch-gelu-epilogue"], environ={})
    settings = Settings(**{k: v for k, v in values.items() if values.sources[k] != "default"})
    spec = read_model_spec(multi_checkpoint)
    packed = torch_backend.TorchBackend(spec, settings)
    assert packed.fast_path["packed"] is True and packed.runner.encoder.gelu_epilogue is True
    assert torch_backend.TorchBackend(spec, settings, packed=False).runner is None


def test_sequences_come_back_each_with_its_own_rows_packed_or_padded(multi_checkpoint):
    """What the batcher calls: unpadded sequences in, the batch's outputs out, whole. The packed backend packs them
    as they are and answers its outputs packed (per-token rows over the batch's real tokens), never cut per sequence;
    each sequence's rows read from them are those of its padded batch, and within fp32 summation order of the padded
    model's. A batch whose longest sequence is past the packed path's positions runs padded, packing never tried
    twice."""
    from runtime.backends.base import BatchOutputs

    padded = make_backend(multi_checkpoint)
    packed = make_backend(multi_checkpoint, packed=True)
    batch = random_batch([7, 40, 1, 19], width=40, seed=4)
    sequences, lengths = features_of(batch), [7, 40, 1, 19]
    got = packed.run_batch(sequences)
    assert got.offsets == [0, 7, 47, 48, 67] and got.arrays["ner"].shape[0] == sum(lengths)
    same_path = BatchOutputs(packed.run(batch), lengths)
    reference = padded.run_batch(sequences)
    assert reference.offsets is None and reference.arrays["ner"].shape[:2] == (4, 40)
    assert len(got) == len(sequences)
    for row, length in enumerate(lengths):
        mine, theirs = got.sequence(row), reference.sequence(row)
        assert set(mine) == set(theirs)
        assert mine["ner"].shape[0] == length and mine["qa_start"].shape == (length,)
        for name, value in mine.items():
            np.testing.assert_array_equal(value, same_path.sequence(row)[name])
            np.testing.assert_allclose(value, theirs[name], rtol=0, atol=2e-5)


def test_probe_turns_a_wrong_packed_path_off(multi_checkpoint, monkeypatch):
    def shuffled(q, k, v, cu, max_len, cu_host=None):  # attends across sequences: wrong
        return attention_reference(q, k, v, torch.tensor([0, q.shape[0]], dtype=torch.int32), max_len, [0, q.shape[0]])

    shuffled.__name__ = "attention_shuffled"
    monkeypatch.setattr(torch_backend, "attention_reference", shuffled)
    backend = make_backend(multi_checkpoint, packed=True)
    assert backend.fast_path["packed"] is False and backend.runner is None
    assert "attention_shuffled" in backend.fast_path["notes"][0] and "differs" in backend.fast_path["notes"][0]


def test_unpadded_batches_run_without_a_mask(multi_checkpoint):
    """model(attention_mask=None) is the all-ones mask (what lets SDPA pick flash on a GPU)."""
    model = tiny_model("multi")
    batch = random_batch([12, 12], seed=6)
    with torch.inference_mode():
        ids, types = torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["token_type_ids"])
        with_mask = model(ids, torch.ones_like(ids), types)
        without = model(ids, None, types)
        model.set_attention_implementation("eager")
        eager = model(ids, None, types)
    for field in ("classify_logits", "ner_logits", "qa_start_logits"):
        assert torch.allclose(getattr(with_mask, field), getattr(without, field), atol=1e-5)
        assert torch.allclose(getattr(eager, field), getattr(without, field), atol=1e-5)


def test_mismatch_names_what_differs():
    want = {"classify": np.array([[1.0, 2.0]])}
    assert torch_backend.mismatch({"classify": np.array([[1.0, 2.0005]])}, want, 1e-3, 0) == ""
    assert "differs" in torch_backend.mismatch({"classify": np.array([[1.0, 2.5]])}, want, 1e-3, 0)
    assert "not finite" in torch_backend.mismatch({"classify": np.array([[1.0, np.nan]])}, want, 1e-3, 0)
    assert "outputs" in torch_backend.mismatch({"ner": want["classify"]}, want, 1e-3, 0)


# ----------------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def medium_checkpoint(tmp_path_factory):
    """4 layers, hidden 256, 4 heads of 64 (BERT's head size): the flash kernels' real case."""
    from bert.checkpoint import save_checkpoint

    model = tiny_model("multi", hidden=256, layers=4, heads=4)
    return save_checkpoint(model, tmp_path_factory.mktemp("packed-gpu") / "multi", tokenizer=TOKENIZER)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_backend_chooses_flash_varlen_and_graphs(medium_checkpoint):
    backend = make_backend(medium_checkpoint, device="cuda", precision="fp16")
    fast = backend.fast_path
    assert fast["packed"] and fast["cuda_graphs"], fast["notes"]
    assert fast["attention"] in ("attention_varlen", "attention_aten_flash"), fast


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("precision,atol,rtol", [("fp16", 3e-2, 2e-2), ("bf16", 8e-2, 4e-2)])
def test_cuda_packed_matches_fp32_reference_over_many_shapes(medium_checkpoint, precision, atol, rtol):
    backend = make_backend(medium_checkpoint, device="cuda", precision=precision)
    assert backend.fast_path["packed"], backend.fast_path["notes"]
    reference = served_reference(medium_checkpoint, backend)
    rng = np.random.default_rng(7)
    for trial in range(12):
        rows = int(rng.choice([1, 2, 3, 7, 16, 33]))
        lengths = rng.integers(1, 385, size=rows).tolist()
        batch = random_batch(lengths, width=-(-max(lengths) // 8) * 8, seed=trial)
        assert_close(backend.run(batch), padded_outputs(reference, batch), batch, atol, rtol)
    assert backend.runner.captures == len(backend.runner.buckets) >= 3


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_gelu_epilogue_stays_within_fp16_of_exact_gelu(medium_checkpoint):
    backend = make_backend(medium_checkpoint, device="cuda", precision="fp16", gelu_epilogue=True)
    assert backend.fast_path["packed"] and backend.fast_path["gelu_epilogue"], backend.fast_path["notes"]
    reference = served_reference(medium_checkpoint, backend)
    for seed, lengths in enumerate(([384] * 4, [17, 250, 3, 96])):
        batch = random_batch(lengths, seed=seed)
        assert_close(backend.run(batch), padded_outputs(reference, batch), batch, 3e-2, 2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_graph_replays_equal_eager_packed_runs(medium_checkpoint):
    graphs = make_backend(medium_checkpoint, device="cuda", precision="fp16")
    eager = make_backend(medium_checkpoint, device="cuda", precision="fp16", cuda_graphs=False)
    assert graphs.fast_path["cuda_graphs"] and not eager.fast_path["cuda_graphs"]
    for seed, lengths in enumerate(([384] * 8, [1], [200, 3, 384, 17, 90], [5] * 64, [128] * 3)):
        batch = random_batch(lengths, seed=seed)
        for _ in range(2):  # the second run replays the graph captured by the first
            assert_close(graphs.run(batch), eager.run(batch), batch, atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_varlen_kernels_ignore_empty_sequences_and_filler():
    from runtime.backends.torch_packed import CUDA_ATTENTIONS

    torch.manual_seed(0)
    n, heads, size = 100, 4, 64
    q, k, v = (torch.randn(n, heads, size, device="cuda", dtype=torch.float16) for _ in range(3))
    cu_host = [0, 30, 30, 81, 81, 81]  # empty sequences between and after; tokens 81..99 are filler
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    want = attention_reference(q.float(), k.float(), v.float(), cu, 51, cu_host)[:81]
    worked = []
    for attention in CUDA_ATTENTIONS:
        try:
            got = attention(q, k, v, cu, 128, cu_host)[:81].float()
        except Exception as e:  # noqa: BLE001 - a kernel this torch lacks; the backend skips it too
            print(f"{attention.__name__}: {type(e).__name__}: {e}")
            continue
        assert torch.allclose(got, want, atol=2e-3), attention.__name__
        worked.append(attention.__name__)
    assert worked, "no varlen flash kernel ran"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_concurrent_callers_each_get_their_own_answer(medium_checkpoint):
    backend = make_backend(medium_checkpoint, device="cuda", precision="fp16")
    batches = [
        random_batch([int(x) for x in np.random.default_rng(s).integers(1, 200, size=4)], seed=s) for s in range(8)
    ]
    expected = [backend.run(b) for b in batches]
    failures = []

    def worker(i):
        for _ in range(5):
            problem = torch_backend.mismatch(
                backend.run(batches[i]), expected[i], 1e-3, 1e-3, where=batches[i]["attention_mask"] != 0
            )
            if problem:
                failures.append(problem)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_unpadded_padded_path_runs_on_sdpa_flash(medium_checkpoint):
    """With no padding the padded path passes no mask, so SDPA's flash kernel alone can run it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = make_backend(medium_checkpoint, device="cuda", precision="fp16", packed=False)
    full = random_batch([96] * 4, seed=9)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = backend.run(full)
    assert np.isfinite(out["classify"]).all()
