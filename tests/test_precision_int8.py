"""bert/precision.py low_precision_matmuls: a model's Linears through real int8 matrix products (torch._int_mm) with
the all-int8 graph's scheme (per-channel weights, each activation row its own scale, asymmetric behind a GELU):
the same numbers as --int8-distill's fake-quantised student, a text's answer independent of the batch it rides in,
and fp8 refused in one line where the GPU cannot multiply it. On a GPU (marker `gpu`, skipped without CUDA): int8
through cuBLASLt and fp8 through torch._scaled_mm."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bert.checkpoint import init_model  # noqa: E402
from bert.config import BertConfig  # noqa: E402
from bert.precision import low_precision_matmuls  # noqa: E402

CUDA = torch.cuda.is_available()


def tiny(hidden_act: str = "gelu", task: str = "ner") -> torch.nn.Module:
    """Two layers, weights 10x wider than BERT's 0.02 so that int8 moves the answers; NER: one row per token."""
    config = BertConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_act=hidden_act,
        task=task,
        id2label=dict(enumerate("OABCD")),
        initializer_range=0.2,
    )
    return init_model(config, seed=0).eval()


def batch(texts: int = 16, width: int = 10, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 300, (texts, width), generator=g)
    mask = torch.ones_like(ids)
    mask[1::2, 6:] = 0  # every other text padded
    return ids * mask, mask


def logits(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        return model(ids, mask).logits.float().cpu().numpy()


def same_texts(a: np.ndarray, b: np.ndarray, mask, tolerance: float = 1e-4) -> int:
    """Texts whose every real token's logits agree within `tolerance` of the output's scale: float summation
    order may tip one value across a rounding boundary, which then moves the rest of its text (only its text)."""
    scale = float(np.abs(b).max())
    real = mask.bool().cpu().numpy()
    return sum(bool(np.abs(a[t][r] - b[t][r]).max() <= tolerance * scale + 1e-6) for t, r in enumerate(real))


@pytest.mark.parametrize("hidden_act", ["gelu", "relu"])  # asymmetric rows behind the GELU; symmetric everywhere
def test_int8_products_compute_what_the_fake_quantised_student_computes(hidden_act):
    from export import distill

    model = tiny(hidden_act)
    ids, mask = batch()
    fp32 = logits(model, ids, mask)
    with distill.fake_quantised(model, model.config, tables=False):
        fake = logits(model, ids, mask)
    int8 = logits(low_precision_matmuls(copy.deepcopy(model), model.config), ids, mask)
    assert same_texts(int8, fake, mask) >= 14
    assert same_texts(fp32, fake, mask, tolerance=2e-3) <= 4  # and int8 is not fp32
    assert np.array_equal(logits(model, ids, mask), fp32)  # the original model is left as it was


def test_a_texts_int8_answer_does_not_depend_on_its_batch():
    model = low_precision_matmuls(tiny(), tiny().config)
    ids, mask = batch()
    together = logits(model, ids, mask)
    for text in range(len(ids)):
        width = int(mask[text].sum())
        alone = logits(model, ids[text : text + 1, :width], mask[text : text + 1, :width])
        assert np.abs(alone[0] - together[text, :width]).max() <= 1e-5


def test_unknown_kinds_and_fp8_without_a_capable_gpu_are_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        low_precision_matmuls(tiny(), tiny().config, kind="int4")
    if not CUDA:
        with pytest.raises(ValueError, match="compute capability 8.9"):
            low_precision_matmuls(tiny(), tiny().config, kind="fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")
def test_int8_on_cuda_equals_int8_on_cpu_and_fp8_stays_near_fp32():
    model = tiny()
    ids, mask = batch()
    fp32 = logits(model, ids, mask)
    cpu = logits(low_precision_matmuls(copy.deepcopy(model), model.config), ids, mask)
    gpu = copy.deepcopy(model).cuda()
    cuda = logits(low_precision_matmuls(gpu, model.config), ids.cuda(), mask.cuda())
    assert same_texts(cuda, cpu, mask) >= 14
    if torch.cuda.get_device_capability() >= (8, 9):
        fp8 = logits(low_precision_matmuls(copy.deepcopy(model).cuda(), model.config, "fp8"), ids.cuda(), mask.cuda())
        real = mask.bool().numpy()
        error = np.sqrt(np.mean((fp8[real] - fp32[real]) ** 2) / np.mean(fp32[real] ** 2))
        assert error < 0.1, error


@pytest.mark.skipif(CUDA, reason="a CUDA machine may multiply fp8")
def test_a_server_asked_for_fp8_on_a_cpu_says_so_in_one_line_and_exits_2(capsys):
    from pathlib import Path

    from serving.__main__ import main

    demo = Path(__file__).resolve().parents[1] / "serving" / "demo_model"
    try:
        code = main(["--model", str(demo), "--backend", "torch", "--precision", "fp8", "--port", "0"])
    except SystemExit as e:
        code = e.code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--precision fp8" in lines[0] and "compute capability 8.9" in lines[0]
