"""Feed-forward input kinds, one class each, chosen by the family (`Family.mlp` names one in MLPS). Both keep
BERT's name for the input projection (intermediate.dense); a family that stores a gated MLP's two halves as two
projections maps them onto it at the checkpoint's edge (bert/families/base.py's weight_layouts)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BertConfig
from .basics import activation


class PlainIntermediate(nn.Module):
    """BERT's: act(W1 x), W1 projecting H to the intermediate size."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias is not False)
        self.act = activation(config.hidden_act)
        # The GELU epilogue (cuBLASLt's GELU_BIAS on CUDA) is the tanh approximation: usable by models trained
        # with it, and on request (Packing.gelu_epilogue) by exact-GELU ones.
        self.epilogue_capable = (
            config.hidden_act in ("gelu", "gelu_new", "gelu_pytorch_tanh") and self.dense.bias is not None
        )

    def forward(self, x: torch.Tensor, gelu_epilogue: bool = False) -> torch.Tensor:
        if gelu_epilogue and self.epilogue_capable and x.dim() == 2:
            if x.is_cuda:  # the activation inside the GEMM: one pass over the 4H-wide activations fewer
                return torch._addmm_activation(self.dense.bias, x, self.dense.weight.t(), use_gelu=True)
            # the CPU kernel of that GEMM applies exact GELU, not the tanh approximation the epilogue stands for
            return F.gelu(self.dense(x), approximate="tanh")
        return self.act(self.dense(x))


class GatedIntermediate(nn.Module):
    """A GLU: W1 projects to twice the intermediate size, act(first half) * second half (ModernBERT's GeGLU; a
    SwiGLU with silu). No GELU epilogue: the activation is inside the gate."""

    def __init__(self, config: BertConfig):
        super().__init__()
        width = 2 * config.intermediate_size
        self.dense = nn.Linear(config.hidden_size, width, bias=config.mlp_bias is not False)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor, gelu_epilogue: bool = False) -> torch.Tensor:
        value, gate = self.dense(x).chunk(2, dim=-1)
        return self.act(value) * gate


MLPS: dict[str, type[nn.Module]] = {"plain": PlainIntermediate, "gated": GatedIntermediate}
