"""The one output-name mapping every backend hands its model's outputs through (runtime/backends/outputs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bert.tasks import TASKS
from runtime.backends.outputs import HIDDEN_STATES, task_outputs
from runtime.model_dir import ModelError


def test_one_output_feeds_every_task_it_serves_and_multi_task_names_map_one_to_one():
    logits = np.arange(3, dtype=np.float32)[:, None]
    out = task_outputs({"logits": logits}, ["classify", "rerank"])
    assert set(out) == {"classify", "rerank"} and out["classify"] is out["rerank"]
    table = {name: np.zeros((3, 2), np.float32) for task in ("classify", "qa") for name in TASKS[task].graph_outputs}
    assert set(task_outputs(table, ["classify", "qa"])) == {"classify", "qa_start", "qa_end"}


def test_floats_become_float32_token_ids_stay_integers_and_unknown_outputs_are_dropped():
    named = {
        "fill_mask_scores": np.zeros((2, 4, 5), np.float16),
        "fill_mask_ids": np.zeros((2, 4, 5), np.int64),
        "some_other_output": np.zeros(2, np.float32),
    }
    out = task_outputs(named, ["fill_mask"])
    assert out["fill_mask_scores"].dtype == np.float32 and out["fill_mask_ids"].dtype == np.int64
    assert set(out) == {"fill_mask_scores", "fill_mask_ids"}


def test_an_encoder_graph_s_token_states_are_pooled_for_a_task_without_a_head():
    """A task without a head gets the encoder output it declares: the token states pooled, or the states as they
    are (per token)."""
    hidden = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    headless = [t for t in TASKS if TASKS[t].head is None]
    out = task_outputs({HIDDEN_STATES: hidden}, headless, mask)
    pooled = [t for t in headless if TASKS[t].encoder_output != HIDDEN_STATES]
    assert pooled and set(headless) - set(pooled)
    for task in headless:
        expected = [hidden[0].mean(axis=0), hidden[1, 0]] if task in pooled else hidden
        for name in TASKS[task].outputs:
            np.testing.assert_array_equal(out[name], expected)


def test_a_task_whose_outputs_are_missing_is_an_error_naming_it():
    with pytest.raises(ModelError, match="qa"):
        task_outputs({"logits": np.zeros((1, 2), np.float32)}, ["classify", "qa"])
