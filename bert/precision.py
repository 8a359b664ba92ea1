"""bf16 matmuls on CPUs that multiply bfloat16 natively (AMX, AVX512-BF16), with everything else kept fp32.

A model cast to bfloat16 whole rounds its residual stream, LayerNorms and heads to 8 bits of mantissa at every
layer; casting only the encoder layers' Linear weights (and each call's input) keeps the time those units save (the
matmuls are almost all of it) while the embeddings, LayerNorms, residual additions and heads stay fp32: a Linear's
bf16 output added to the fp32 residual stream gives fp32 (docs/export.md, "bf16").

int8 and fp8 matmuls (low_precision_matmuls, below): the all-int8 export's arithmetic in torch, each activation row
its own scale, for the torch backend's --precision int8 / fp8 (docs/serving.md, "Backends")."""

from __future__ import annotations

from pathlib import Path

# CPU flags (Linux /proc/cpuinfo) of units that multiply bfloat16 in hardware: the AMX tiles, or AVX512-BF16's dot
# products alone; elsewhere bf16 is emulated and slow.
BF16_UNITS = ("amx_bf16", "avx512_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where they cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def bf16_units(flags: frozenset[str] | None = None) -> list[str]:
    """The bf16 units among `flags` (default: this CPU's), in BF16_UNITS' order; empty where there are none."""
    flags = cpu_flags() if flags is None else flags
    return [flag for flag in BF16_UNITS if flag in flags]


def _cast_input(module, args):
    x = args[0]
    return (x.to(module.weight.dtype), *args[1:]) if x.dtype != module.weight.dtype else None


def bf16_matmuls(model):
    """Cast the encoder layers' Linear modules of `model` (a bert.model class, fp32) to bfloat16, each casting its
    input on the way in; returns the model. The embeddings, pooler, LayerNorms and task heads stay as they are."""
    import torch

    layers = model.encoder_module().encoder
    for module in layers.modules():
        if isinstance(module, torch.nn.Linear):
            module.to(torch.bfloat16)
            module.register_forward_pre_hook(_cast_input)
    return model


# ------------------------------------------------------------------------------------------ int8 and fp8 GEMMs
# The arithmetic of the all-int8 ONNX graph (export/pertoken.py, export/variants.py quantize_int8 scope all) and of
# --int8-distill's student (export/distill.py), in real low-precision matrix products: each weight int8 with one
# symmetric scale per output channel (max|w| / 127), each activation row (one token of one text) quantised at run
# time with its own scale, so that a text's answer does not depend on the batch it rides in. A row is symmetric
# (max|x| / 127) except where a GELU feeds it (each plain feed-forward output projection), where it takes its own
# range, zero included ((max - min) / 255 and a zero point). The int32 products go through torch._int_mm (oneDNN
# on CPU, cuBLASLt on CUDA). fp8 (CUDA, compute capability 8.9 or later): e4m3 weights and rows, each with its own
# scale (amax / 448), through torch._scaled_mm with row-wise scales.
GELU_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh")
INT8_KINDS = ("int8", "fp8")
E4M3_MAX = 448.0
TINY_SCALE = 1e-12  # the floor on a row's scale (export/pertoken.py's)


def asymmetric_linears(model, config) -> set[int]:
    """ids of the Linears a GELU feeds (each plain feed-forward output projection): their rows take their own range.
    A gated MLP's product or a non-GELU activation feeds them through a Mul or ReLU: symmetric."""
    from torch import nn

    from bert.blocks.mlp import PlainIntermediate

    if config.hidden_act not in GELU_ACTS:
        return set()
    found = set()
    for module in model.modules():
        intermediate = getattr(module, "intermediate", None)
        output = getattr(module, "output", None)
        if isinstance(intermediate, PlainIntermediate) and isinstance(getattr(output, "dense", None), nn.Linear):
            found.add(id(output.dense))
    return found


def quantised_linears(model) -> list:
    """The Linears the int8 graph quantises: every one called on token states (a MatMul there), and one without a
    bias called on one vector per text (ModernBERT's head: a MatMul too); a Linear with a bias called only on one
    vector per text (a pooler, a classifier on [CLS]) is a Gemm there, kept fp32. Which is which shows in the rank
    of its input in a padded forward (what the graph is traced from), so `model` runs once on two short texts;
    a packed batch hands every Linear rows alone, so the choice is made here, once, not per call."""
    import torch
    from torch import nn

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    ranks: dict[int, set[int]] = {}
    hooks = [
        m.register_forward_pre_hook(lambda m, args: ranks.setdefault(id(m), set()).add(args[0].dim())) for m in linears
    ]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(
                torch.full((2, 4), 5, dtype=torch.long, device=device),
                torch.ones(2, 4, dtype=torch.long, device=device),
            )
    finally:
        for hook in hooks:
            hook.remove()
    return [m for m in linears if m.bias is None or max(ranks.get(id(m), {3})) >= 3]


def int8_weights(w):
    """A Linear's weight (out, in) as the int8 graph holds it: its integers (float, -127..127) and one symmetric
    scale per output channel (out, 1)."""
    import torch

    scale = w.abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.clamp(torch.round(w / scale), -127, 127), scale


def int8_rows(x, asymmetric: bool):
    """Each row of x (its last axis) as the int8 graph quantises it at run time: the integers (float, -128..127),
    the row's scale and, asymmetric, its shift: x ~ scale * (steps + shift), where shift is 128 + the row's zero
    offset (None: symmetric, 0)."""
    import torch

    if not asymmetric:
        # max |x| (two plain reductions: faster on CPU than abs().amax(), linalg's norm or aminmax)
        largest = torch.maximum(x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True).neg_())
        scale = torch.clamp(largest * (1 / 127), min=TINY_SCALE)
        return (x / scale).round_().clamp_(-128, 127), scale, None
    low, high = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    scale = torch.clamp((high.clamp(min=0.0) - low.clamp(max=0.0)) * (1 / 255), min=TINY_SCALE)
    shift = torch.round(low.clamp(max=0.0) / scale) + 128
    # the uint8 row clamp(round(x / s) - offset, 0, 255), less 128: the same integers, as int8
    return (x / scale).round_().sub_(shift).clamp_(-128, 127), scale, shift


class _LowPrecisionLinear:
    """A Linear's forward through int8 (or fp8) matrix products, from a quantised copy of its weight (out, in) and
    its bias (or None)."""

    def __init__(self, weight, bias, kind: str, asymmetric: bool):
        import torch

        self.kind, self.asymmetric = kind, asymmetric
        w = weight.detach().float()
        if kind == "int8":
            q, scale = int8_weights(w)
            self.weight = q.to(torch.int8).t().contiguous()  # (in, out) for torch._int_mm
            self.column_sums = q.sum(dim=1).view(1, -1) if asymmetric else None
        else:
            scale = torch.clamp(w.abs().amax(dim=1, keepdim=True) / E4M3_MAX, min=TINY_SCALE)
            self.weight = (w / scale).to(torch.float8_e4m3fn).t()  # column-major (in, out), as _scaled_mm takes it
        self.weight_scale = scale.view(1, -1)
        self.bias = None if bias is None else bias.detach().float()

    def __call__(self, x):
        import torch
        import torch.nn.functional as F

        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()
        if self.kind == "fp8":
            scale = torch.clamp(rows.abs().amax(dim=-1, keepdim=True) / E4M3_MAX, min=TINY_SCALE)
            q = (rows / scale).to(torch.float8_e4m3fn)
            out = torch._scaled_mm(
                q, self.weight, scale_a=scale, scale_b=self.weight_scale, out_dtype=torch.bfloat16
            ).float()
        else:
            steps, scale, shift = int8_rows(rows, self.asymmetric)
            q = steps.to(torch.int8)
            padded = q.shape[0]
            if q.is_cuda and padded <= 16:  # cuBLASLt's int8 product wants more than 16 rows
                q = F.pad(q, (0, 0, 0, 17 - padded))
            out = torch._int_mm(q, self.weight)[:padded].float()
            if shift is not None:  # the rows' zero offsets, added back through the weights' column sums
                out.addr_(shift.view(-1), self.column_sums.view(-1))
            out.mul_(scale * self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*shape[:-1], out.shape[-1]).to(x.dtype)


def low_precision_matmuls(model, config, kind: str = "int8"):
    """Run `model`'s Linears (a bert.model class, fp32) through `kind` ("int8" or "fp8") matrix products as the
    all-int8 graph does (above); returns the model. Embedding tables, LayerNorms, attention scores and Gemm heads
    stay fp32. fp8 needs CUDA with compute capability 8.9 or later (ValueError otherwise)."""
    import torch

    if kind not in INT8_KINDS:
        raise ValueError(f"kind must be one of {INT8_KINDS}, got {kind!r}")
    if kind == "fp8":
        device = next(model.parameters()).device
        if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
            raise ValueError("fp8 matrix products need a CUDA GPU of compute capability 8.9 or later (Ada, Hopper)")
    asymmetric = asymmetric_linears(model, config) if kind == "int8" else set()
    quantised = quantised_linears(model)
    for module in quantised:
        module.forward = _LowPrecisionLinear(module.weight, module.bias, kind, id(module) in asymmetric)
        module.low_precision = kind  # read by the blocks that would otherwise multiply the fp32 weight themselves
    for module in model.modules():
        if getattr(module, "epilogue_capable", False):  # the GELU-in-GEMM epilogue multiplies the fp32 weight
            module.epilogue_capable = False
        if hasattr(module, "fused_qkv"):  # one product for query, key and value: one row scale serves all three
            linears = (module.query, module.key, module.value)
            if all(m in quantised and id(m) not in asymmetric for m in linears):
                bias = None if module.query.bias is None else torch.cat([m.bias for m in linears])
                module.fused_qkv = _LowPrecisionLinear(torch.cat([m.weight for m in linears]), bias, kind, False)
            else:
                module.fused_qkv = None
    return model
