"""Pooling (bert/pooling.py): one arithmetic for numpy arrays, torch tensors and packed torch states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bert.pooling import PACKED_POOLINGS, POOLINGS, pool, pool_packed

LENGTHS = [5, 2, 7]


def states(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((len(LENGTHS), max(LENGTHS), 8)).astype(np.float32)
    mask = (np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]).astype(np.int64)
    hidden[mask == 0] = 100.0  # padding that would win a max and move a mean if it were counted
    return hidden, mask


def by_hand(hidden: np.ndarray, mode: str) -> np.ndarray:
    rows = [hidden[i, :n] for i, n in enumerate(LENGTHS)]
    return np.stack([r[0] if mode == "cls" else r.mean(0) if mode == "mean" else r.max(0) for r in rows])


@pytest.mark.parametrize("mode", POOLINGS)
def test_numpy_and_torch_pool_the_real_tokens_alike(mode):
    hidden, mask = states()
    want = by_hand(hidden, mode)
    got_numpy = pool(hidden, mask, mode)
    got_torch = pool(torch.from_numpy(hidden), torch.from_numpy(mask), mode)
    assert got_numpy.dtype == np.float32 and got_torch.dtype == torch.float32
    np.testing.assert_allclose(got_numpy, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_torch.numpy(), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", POOLINGS)
def test_no_mask_means_every_token_is_real(mode):
    hidden, _ = states()
    full = np.ones(hidden.shape[:2], dtype=np.int64)
    np.testing.assert_allclose(pool(hidden, None, mode), pool(hidden, full, mode), rtol=0, atol=1e-5)
    tensor = torch.from_numpy(hidden)
    np.testing.assert_allclose(pool(tensor, None, mode).numpy(), pool(hidden, full, mode), rtol=0, atol=1e-5)


def test_float16_graph_states_come_back_float32():
    hidden, mask = states()
    assert pool(hidden.astype(np.float16), mask, "mean").dtype == np.float32


@pytest.mark.parametrize("mode", PACKED_POOLINGS)
def test_packed_states_pool_as_the_padded_ones(mode):
    hidden, mask = states()
    packed = torch.from_numpy(hidden[mask != 0])
    cu = torch.tensor(np.concatenate([[0], np.cumsum(LENGTHS)]), dtype=torch.int32)
    got = pool_packed(packed, cu, cu[:-1].long(), mode)
    np.testing.assert_allclose(got.numpy(), by_hand(hidden, mode), rtol=0, atol=1e-6)


def test_an_unknown_mode_and_packed_max_are_refused():
    hidden, mask = states()
    with pytest.raises(ValueError, match="one of cls, mean, max"):
        pool(hidden, mask, "sum")
    with pytest.raises(ValueError, match="no packed form"):
        pool_packed(torch.from_numpy(hidden[mask != 0]), torch.tensor([0, 5, 7, 14]), torch.tensor([0, 5, 7]), "max")


def test_packed_mean_ignores_a_buckets_filler_tokens_and_empty_sequences():
    """A CUDA-graph bucket holds more token rows and sequences than the batch: filler tokens past the last bound
    and empty sequences (their bounds repeat the last one) must not touch the real sequences' means."""
    hidden, mask = states()
    real = hidden[mask != 0]
    filler = np.full((9, real.shape[1]), 1e4, dtype=real.dtype)
    bounds = np.concatenate([[0], np.cumsum(LENGTHS)])
    cu = torch.tensor(np.concatenate([bounds, [bounds[-1]] * 2]), dtype=torch.int32)
    got = pool_packed(torch.from_numpy(np.concatenate([real, filler])), cu, cu[:-1].long(), "mean").numpy()
    np.testing.assert_allclose(got[: len(LENGTHS)], by_hand(hidden, "mean"), rtol=0, atol=1e-6)
    assert np.all(got[len(LENGTHS) :] == 0)
