"""PyTorch backend: a checkpoint dir on CPU (fp32/bf16/int8) or CUDA (fp16/bf16/int8/fp8).

The only runtime module that imports torch (with torch_packed.py, its fast path). Two ways to run a batch:
- padded: the model's own forward on the (B, T) batch, SDPA attention (with no mask when no row is
  padded, so that SDPA may pick its flash kernel). The CPU default, and the fallback everywhere.
- packed (the CUDA default): only the real tokens (the batch's sequences packed as they come, never padded
  first; outputs answered packed, whole), varlen flash attention, a CUDA graph per shape
  bucket (torch_packed.py says why each piece). Chosen at load time only after it has run a probe
  batch on this device and matched the padded path; each piece that fails is left out and said so in
  `fast_path` (what /info-style reports and the GPU kit record).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from bert.precision import INT8_KINDS, bf16_matmuls, low_precision_matmuls
from bert.tasks import TASKS, Features, pad_batch
from runtime.backends.base import Backend, BatchOutputs, threads_per_run
from runtime.backends.outputs import task_outputs
from runtime.backends.torch_packed import (
    CUDA_ATTENTIONS,
    PackedEncoder,
    PackedRunner,
    attention_reference,
    pack,
    pack_sequences,
)
from runtime.model_dir import ModelError, ModelSpec

log = logging.getLogger("bertserve")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Largest difference from the padded path that the packed path may show on the probe batch, as
# (absolute, relative to the largest output): fp32 differs by summation order only; fp16/bf16 by
# rounding in a different attention kernel (measured differences are far below these); int8/fp8 by a value that
# summation order tips across a rounding boundary (then its row moves by a step).
TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (3e-2, 2e-2), "bf16": (6e-2, 4e-2), "int8": (6e-2, 4e-2)}
TOLERANCE["fp8"] = TOLERANCE["int8"]


class TorchBackend(Backend):
    name = "torch"
    concurrent_runs = True  # inference under no_grad keeps no state between calls (the packed runner locks)
    cpu_batch_requests = 32  # each operator's Python and dispatch cost is paid once per batch
    cpu_batch_tokens = 3072  # 32 texts of up to 96 tokens, 6 windows of 512

    def __init__(
        self,
        spec: ModelSpec,
        settings,
        *,
        packed: bool | None = None,
        cuda_graphs: bool | None = None,
        gelu_epilogue: bool | None = None,
    ):
        """packed / cuda_graphs: None = the device's default (both on for CUDA, off for CPU); gelu_epilogue: see
        PackedEncoder (None = only for tanh-GELU models). The arguments win over the settings `torch_packed`,
        `torch_cuda_graphs`, `torch_gelu_epilogue` (--torch-packed ...), which win over the defaults."""
        super().__init__(spec)
        from bert.checkpoint import load_for_inference

        if settings.device == "cuda" and not torch.cuda.is_available():
            raise ModelError("--device cuda was asked for, but torch sees no CUDA device")
        threads = threads_per_run(settings, torch.get_num_threads())
        if threads:
            torch.set_num_threads(threads)
        self.precision = artifact_precision(spec, settings)
        self.device = torch.device(settings.device)
        # Every checkpoint loads as one class, whose outputs are one table under the graph-output names.
        if self.precision == "bf16" and self.device.type == "cpu":
            # bf16 matmuls, everything else fp32 (bert/precision.py): the speed of the CPU's bf16 units without
            # rounding the residual stream, LayerNorms and heads
            self.model, _ = load_for_inference(spec.path, dtype=torch.float32, device=self.device)
            bf16_matmuls(self.model)
        elif self.precision in INT8_KINDS:
            # int8 (fp8) matrix products with each activation row its own scale, the rest fp32 (bert/precision.py):
            # the arithmetic of the all-int8 export, answers independent of the batch
            self.model, _ = load_for_inference(spec.path, dtype=torch.float32, device=self.device)
            try:
                low_precision_matmuls(self.model, self.model.config, self.precision)
            except ValueError as e:
                raise ModelError(f"--precision {self.precision}: {e}") from None
        else:
            self.model, _ = load_for_inference(spec.path, dtype=DTYPES[self.precision], device=self.device)
        missing = [t for t in spec.headed_tasks if t not in self.model.heads]
        if missing:
            raise ModelError(f"{spec.path}: the model has no head for task(s) {', '.join(missing)}")
        self.model.set_attention_implementation("sdpa")
        if any(TASKS[t].head is None for t in self.tasks):  # pooled states come out of the heads' forward pass
            self.model.set_pooling(spec.pooling.mode)
        self.model.gives_token_states = any(
            TASKS[t].head is None and TASKS[t].encoder_output == "last_hidden_state" for t in self.tasks
        )
        self.model.eval()

        cuda = self.device.type == "cuda"
        packed = _choice(packed, settings.torch_packed, cuda)
        cuda_graphs = _choice(cuda_graphs, settings.torch_cuda_graphs, cuda) and packed
        if gelu_epilogue is None:
            gelu_epilogue = settings.torch_gelu_epilogue
        self.fast_path: dict = {"packed": False, "attention": None, "cuda_graphs": False, "notes": []}
        self.runner: PackedRunner | None = None
        if packed:
            self.runner = self._packed_runner(cuda_graphs, gelu_epilogue)
        if cuda:
            # One batch at a time on the GPU (the settings' default there): the GPU runs one forward at a
            # time anyway, and a graph capture must not share the device with a padded run.
            self.concurrent_runs = False

    # ---- the two paths ------------------------------------------------------------------------
    def run_batch(self, sequences: list[Features]) -> BatchOutputs:
        """Packed as they are when the packed path is on and the batch fits its positions (never padded), else
        padded (and then never packed again): the batch's outputs whole, per-token ones packed over its real
        tokens."""
        if self.runner is None:
            return super().run_batch(sequences)
        lengths = [len(s) for s in sequences]
        if sequences and min(lengths) > 0:
            packed = pack_sequences(sequences)
            if packed.max_len <= self.runner.encoder.max_positions:
                table = self._named(self.runner.run_packed(packed))
                return BatchOutputs(table, lengths, packed.cu_seqlens.tolist())
        return BatchOutputs(self.run_padded(pad_batch(sequences, self.pad_token_id, self.pad_to_multiple_of)), lengths)

    @torch.inference_mode()
    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.runner is not None:
            packed = pack(batch)
            if packed is not None and packed.max_len <= self.runner.encoder.max_positions:
                return self._named(self.runner.run(packed))
        return self.run_padded(batch)

    def _named(self, table: dict) -> dict[str, np.ndarray]:
        """The model's output table (graph-output names) under our output names, as every backend maps them."""
        return task_outputs(table, self.tasks)

    @torch.inference_mode()
    def run_padded(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = {
            k: torch.from_numpy(np.ascontiguousarray(batch[k])).to(self.device, non_blocking=True)
            for k in ("input_ids", "attention_mask", "token_type_ids")
        }
        if np.all(batch["attention_mask"]):  # nothing padded: no mask, so SDPA may use its flash kernel
            inputs["attention_mask"] = None
        table = self.model(**inputs).outputs
        return self._named(
            {
                name: (value.float() if value.is_floating_point() else value).cpu().numpy()
                for name, value in table.items()
            }
        )

    # ---- choosing the packed path on this device ----------------------------------------------
    def _packed_runner(self, cuda_graphs: bool, gelu_epilogue: bool | None) -> PackedRunner | None:
        """The fastest packed runner that matches the padded path on a probe batch here, or None."""
        notes = self.fast_path["notes"]
        try:
            encoder = PackedEncoder(self.model, gelu_epilogue=gelu_epilogue)
        except TypeError as e:
            notes.append(f"packed path off: {e}")
            return None
        config = self.model.config
        windows = [w for w in map(config.attention_window, range(config.num_hidden_layers)) if w is not None]
        probe = probe_batch(config.vocab_size, encoder.max_positions, max(windows, default=None))
        reference = self.run_padded(probe)
        attentions = CUDA_ATTENTIONS if self.device.type == "cuda" else [attention_reference]
        # Most preferred first: each piece that fails here is dropped, the others kept.
        candidates = [
            (gelu, attention, graphs)
            for gelu in dict.fromkeys([encoder.gelu_epilogue, False])
            for attention in attentions
            for graphs in dict.fromkeys([cuda_graphs, False])
        ]
        for gelu, attention, graphs in candidates:
            encoder.attention, encoder.gelu_epilogue = attention, gelu
            label = f"{attention.__name__}{' + CUDA graphs' if graphs else ''}{' + GELU epilogue' if gelu else ''}"
            try:
                runner = PackedRunner(encoder, self.device, graphs=graphs)
                # Twice: the second run replays the captured graph on other inputs of the same bucket.
                runner.run(pack(probe))
                got = self._named(runner.run(pack(probe)))
            except Exception as e:  # noqa: BLE001 - a kernel this torch/GPU lacks: try the next
                notes.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")
                continue
            problem = mismatch(got, reference, *TOLERANCE[self.precision], where=probe["attention_mask"] != 0)
            if graphs and runner.capture_failures:
                problem = f"graph capture failed: {runner.capture_failures[0]}"
            if problem:
                notes.append(f"{label}: {problem}")
                continue
            self.fast_path.update(packed=True, attention=attention.__name__, cuda_graphs=graphs, gelu_epilogue=gelu)
            log.info("torch backend: packed path, %s", label)
            return runner
        log.warning("torch backend: packed path off (%s); running padded batches", "; ".join(notes))
        return None

    def close(self) -> None:
        self.runner = None


def _choice(explicit: bool | None, from_settings: bool | None, default: bool) -> bool:
    return bool(explicit if explicit is not None else from_settings if from_settings is not None else default)


def probe_batch(vocab_size: int, max_positions: int, window: int | None = None) -> dict[str, np.ndarray]:
    """Three right-padded rows of different lengths (the longest unpadded), seeded: what the packed path must match.
    A model with windowed layers (window: the widest, in tokens each way) gets a fourth row long enough that the
    window bounds its middle tokens on both sides: the packed kernels bound windows themselves (FlashAttention's
    window_size), and a kernel that ignored or misread it would otherwise pass on rows no longer than 64 tokens
    (ModernBERT's window is 64 each way)."""
    rng = np.random.default_rng(0)
    lengths = [min(n, max_positions) for n in (61, 64, 5, *([2 * window + 2] if window else []))]
    width = max(lengths)
    ids = rng.integers(min(1000, vocab_size // 2), min(vocab_size, 30000), size=(len(lengths), width), dtype=np.int64)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    types = (np.arange(width)[None, :] >= np.array(lengths)[:, None] // 2).astype(np.int64) * mask
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def mismatch(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], atol: float, rtol: float, where: np.ndarray | None = None
) -> str:
    """'' when every output agrees within atol + rtol * max|want| (per-token outputs compared on real
    tokens only), else what differs."""
    if set(got) != set(want):
        return f"outputs {sorted(got)} instead of {sorted(want)}"
    for key, expected in want.items():
        actual = got[key]
        if actual.shape != expected.shape:
            return f"{key}: shape {actual.shape} instead of {expected.shape}"
        if where is not None and actual.ndim >= 2 and actual.shape[:2] == where.shape:
            actual, expected = actual[where], expected[where]
        if not np.isfinite(actual).all():
            return f"{key}: not finite"
        error = float(np.abs(actual - expected).max()) if actual.size else 0.0
        limit = atol + rtol * float(np.abs(expected).max() if expected.size else 0.0)
        if error > limit:
            return f"{key}: differs by {error:.3g} (limit {limit:.3g})"
    return ""


def artifact_precision(spec: ModelSpec, settings) -> str:
    """--precision when given; else what an exported torch artifact was chosen and verified in (its manifest's
    precision, e.g. bf16: export/bf16.py); else the device's default."""
    manifest = spec.manifest or {}
    if (
        getattr(settings, "precision", None) is None
        and manifest.get("runtime") == "torch"
        and manifest.get("precision") in DTYPES
    ):
        return manifest["precision"]
    return settings.effective_precision
