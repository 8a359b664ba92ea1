"""The graph we export: named int64 inputs, outputs named by task, dynamic batch and sequence axes.

`ExportWrapper` turns a bert model's small result object into a tuple in a fixed order, so the
ONNX graph has one output per name. `prepare_for_export` switches the model to the explicit
attention graph onnxruntime's BERT fusion recognises.
"""

from __future__ import annotations

import torch
from torch import nn

from bert import heads
from bert.model import BertForMultiTask, BertModel, BertPreTrainedModel
from bert.tasks import TASKS

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# A bare encoder's graph (layout "encoder"): its token states, and the pooled [CLS] when it has a pooler.
ENCODER_OUTPUTS = {"last_hidden_state": ("batch", "sequence"), "pooler_output": ("batch",)}
POOLED = "embedding"  # the encoder output (EncoderOutput.embedding) that the pooled tasks without a head read


def _axes(task: str) -> tuple[str, ...]:
    """An output's dynamic axes: batch, and the sequence for a per-token output (any further axis, labels or
    candidates, has the model's fixed width)."""
    return ("batch", "sequence") if TASKS[task].per_token else ("batch",)


def output_spec(model: BertPreTrainedModel, task: str) -> dict[str, tuple[str, tuple[str, ...], str | None]]:
    """Graph output name -> (where the model's result holds it, dynamic axis names, the task it belongs to).

    - a task with a head, on a BertForMultiTask: the task's single-task names ("logits", "start_logits");
    - "multi": every head's outputs under the tasks' multi-task names ("classify_logits"), and the pooled
      embedding when the model pools;
    - a task without a head, on a pooling BertModel: its outputs from the pooled states;
    - "encoder": the token states (and pooler output)."""
    if task == "encoder":
        return {
            name: (name, dims, None)
            for name, dims in ENCODER_OUTPUTS.items()
            if name != "pooler_output" or getattr(model, "pooler", None) is not None
        }
    if task == "multi":  # the heads and the pooled tasks: per-token states are a graph of their own
        pooled = [t for t in TASKS if TASKS[t].head is None and TASKS[t].encoder_output == POOLED]
        pooled = pooled if model.encoder_module().pooling else []
        return {name: (name, _axes(t), t) for t in [*model.heads, *pooled] for name in TASKS[t].graph_outputs}
    declared = TASKS[task]
    if declared.head is None:  # the encoder output it reads
        return {name: (declared.encoder_output, _axes(task), task) for name in declared.single_graph_outputs}
    table_key = {ours: name for name, ours in declared.graph_outputs.items()}  # the model's table is keyed so
    return {name: (table_key[ours], _axes(task), task) for name, ours in declared.single_graph_outputs.items()}


def dynamic_axes(spec: dict) -> dict[str, dict[int, str]]:
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    for name, (_, dims, _) in spec.items():
        axes[name] = dict(enumerate(dims))
    return axes


def _fixed_axes(model, name: str, dims: tuple, task: str | None) -> list[int]:
    """An output's axes after its dynamic ones, from its rank the task declares: a label per score, hidden
    units, a masked-LM head's candidates."""
    config = model.config
    if task is None:  # an encoder graph's states
        return [config.hidden_size]
    declared = TASKS[task]
    ours = {**declared.graph_outputs, **declared.single_graph_outputs}[name]
    if declared.output_ranks[declared.outputs.index(ours)] == len(dims):
        return []
    if declared.head is None:
        return [config.hidden_size]
    return heads.get(declared.head.kind).row_axes(config, declared.head_width(model.task_labels[task]))


class ExportWrapper(nn.Module):
    """model(input_ids, attention_mask, token_type_ids) -> tuple of outputs in `output_names` order."""

    def __init__(self, model: BertPreTrainedModel, task: str):
        super().__init__()
        if task == "encoder" or (task in TASKS and TASKS[task].head is None):
            if not isinstance(model, BertModel):
                raise ValueError(f"task {task!r} needs a BertModel")
            if task != "encoder" and model.pooling is None:
                raise ValueError(f"task {task!r} needs a model with a pooling mode (set_pooling)")
        elif not isinstance(model, BertForMultiTask):
            raise ValueError(f"task {task!r} needs a BertForMultiTask (bert.checkpoint.load_for_inference)")
        elif task != "multi" and task not in model.heads:
            raise ValueError(f"the model has no head for task {task!r} (it has {', '.join(model.heads) or 'none'})")
        self.model = model
        self.task = task
        self.spec = output_spec(model, task)
        self.output_names = list(self.spec)
        # the tasks the graph serves: those whose outputs it has (one head of one kind may serve several tasks)
        if task == "multi" or task not in getattr(model, "attributes", {}):
            self.tasks = list(dict.fromkeys(t for _, _, t in self.spec.values() if t is not None))
        else:
            self.tasks = [
                t
                for t, a in model.attributes.items()
                if a == model.attributes[task] and model.heads[t].kind == model.heads[task].kind
            ]
        self.shapes = {
            name: list(dims) + _fixed_axes(model, name, dims, owner) for name, (_, dims, owner) in self.spec.items()
        }
        self.eval()  # the TorchScript exporter restores the wrapper's mode afterwards: keep it eval

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
        result = self.model(input_ids, attention_mask, token_type_ids)
        table = getattr(result, "outputs", None)  # a BertForMultiTask's output table, else an EncoderOutput
        return tuple(table[key] if table is not None else getattr(result, key) for key, _, _ in self.spec.values())


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
        attention_mask[-1, seq // 2 :] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2 :] = max(0, min(1, config.type_vocab_size - 1))  # DistilBERT has no types
    return input_ids, attention_mask, token_type_ids
