"""The graph we export: named int64 inputs, outputs named by task, dynamic batch and sequence axes.

`ExportWrapper` turns a bert model's small result object into a tuple in a fixed order, so the
ONNX graph has one output per name. `prepare_for_export` switches the model to the explicit
attention graph onnxruntime's BERT fusion recognises.
"""
from __future__ import annotations

import torch
from torch import nn

from bert.model import BertForMultiTask, BertModel, BertPreTrainedModel
from bert.tasks import TASKS

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")

def _axes(task: str) -> tuple[str, ...]:
    return ("batch", "sequence") if TASKS[task].per_token else ("batch",)


# output name -> (attribute of the model's result, which axes are dynamic). A graph for one task names its
# outputs as the registry's single-task names (the model's result fields: "logits", "start_logits", ...).
_OUTPUTS = {
    **{task: {name: (name, _axes(task)) for name in TASKS[task].single_graph_outputs} for task in TASKS},
    "encoder": {"last_hidden_state": ("last_hidden_state", ("batch", "sequence")),
                "pooler_output": ("pooler_output", ("batch",))},
    # every head's outputs under the registry's multi-task names, and the pooled embedding
    "multi": {name: (name, _axes(task)) for task in TASKS for name in TASKS[task].graph_outputs},
}


def output_spec(model: BertPreTrainedModel, task: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Output name -> (result attribute, dynamic axis names) for the heads this model has."""
    spec = dict(_OUTPUTS[task])
    if task == "encoder" and getattr(model, "pooler", None) is None:
        spec.pop("pooler_output")
    if task == "multi":  # the heads this model has, and the embedding when it pools
        served = set(model.config.task_labels or {}) | ({"embed"} if model.encoder_module().pooling else set())
        owner = {name: t for t in TASKS for name in TASKS[t].graph_outputs}
        spec = {name: v for name, v in spec.items() if owner[name] in served}
    return spec


def dynamic_axes(spec: dict) -> dict[str, dict[int, str]]:
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    for name, (_, dims) in spec.items():
        axes[name] = dict(enumerate(dims))
    return axes


class ExportWrapper(nn.Module):
    """model(input_ids, attention_mask, token_type_ids) -> tuple of outputs in `output_names` order."""

    def __init__(self, model: BertPreTrainedModel, task: str):
        super().__init__()
        if task == "multi" and not isinstance(model, BertForMultiTask):
            raise ValueError("task 'multi' needs a multi-task model")
        if task in ("encoder", "embed") and not isinstance(model, BertModel):
            raise ValueError(f"task {task!r} needs a BertModel")
        if task == "embed" and model.pooling is None:
            raise ValueError("task 'embed' needs a model with a pooling mode (set_pooling)")
        self.model = model
        self.task = task
        self.spec = output_spec(model, task)
        self.output_names = list(self.spec)
        self.eval()  # the TorchScript exporter restores the wrapper's mode afterwards: keep it eval

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
        result = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(getattr(result, attr) for attr, _ in self.spec.values())


def prepare_for_export(model: BertPreTrainedModel) -> BertPreTrainedModel:
    """Eval mode and explicit (fusable) attention. Numerically the same model."""
    model.eval()
    model.set_attention_implementation("eager")
    return model


def dummy_inputs(config, batch: int = 2, seq: int = 8) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: a padded row, so the mask path is traced with real values."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (batch, seq), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if batch > 1:
        attention_mask[-1, seq // 2:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2:] = min(1, config.type_vocab_size - 1)
    return input_ids, attention_mask, token_type_ids
