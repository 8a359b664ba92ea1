"""bf16 matmuls on CPUs that multiply bfloat16 natively (AMX, AVX512-BF16), with everything else kept fp32.

A model cast to bfloat16 whole rounds its residual stream, LayerNorms and heads to 8 bits of mantissa at every
layer; casting only the encoder layers' Linear weights (and each call's input) keeps the time those units save (the
matmuls are almost all of it) while the embeddings, LayerNorms, residual additions and heads stay fp32: a Linear's
bf16 output added to the fp32 residual stream gives fp32 (docs/export.md, "bf16")."""

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
