"""bf16 for CPUs that multiply in bfloat16 natively (AMX or AVX512-BF16): the checkpoint's own weights served by the
torch backend with the encoder layers' matmuls in bfloat16 (bert/precision.py), on those units through oneDNN, and
everything else fp32: `--precision bf16` (docs/export.md, "bf16"). It is not a candidate of `--precision auto`:
served, it measured slower than the default ONNX export at 1, 8 and 32 clients (docs/benchmarks.md).

The artifact holds model.safetensors (the checkpoint's tensors and names) instead of model.onnx; its manifest
says `"precision": "bf16"` and `"runtime": "torch"`, and `python -m serving --model DIR` serves it with the torch
backend in bf16. model.portable.onnx (fp32, for TensorRT) is written as for every precision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .manifest import WEIGHTS_FILE

RUNTIME = "torch"


def unavailable(source, task_of_checkpoint: str | None) -> str | None:
    """Why this export cannot be served as bf16 weights (None when it can): the artifact keeps the checkpoint's own
    tensors, so it must be the checkpoint's own task (what serving the checkpoint directly gives)."""
    if source.random_init or source.checkpoint_dir is None:
        return "a random-init preset has no checkpoint weights to keep"
    if task_of_checkpoint != source.task:
        return f"bf16 keeps the checkpoint as it is, which serves {task_of_checkpoint}, not --task {source.task}"
    return None


def write_weights(checkpoint_dir: Path, out: Path) -> Path:
    """The checkpoint's tensors as they are, under their own names, as one safetensors file (the server casts the
    encoder layers' Linear weights to bfloat16 when it loads them: bert/precision.py)."""
    from safetensors.torch import save_file

    from bert.checkpoint import read_state_dict

    state = {k: v.contiguous() for k, v in read_state_dict(checkpoint_dir).items()}
    path = out / WEIGHTS_FILE
    save_file(state, str(path), metadata={"format": "pt"})
    return path


class Bf16Model:
    """The artifact's directory loaded as the torch backend serves it (bf16, sdpa attention), giving the graph's
    outputs by name for padded numpy batches. `outputs`: graph output name -> the model's output table key."""

    def __init__(self, directory: Path, outputs: dict[str, str], pooling: str | None):
        import torch

        from bert.checkpoint import load_for_inference
        from bert.precision import bf16_matmuls

        self.torch = torch
        self.model, _ = load_for_inference(directory, dtype=torch.float32)
        bf16_matmuls(self.model)
        self.model.set_attention_implementation("sdpa")
        if pooling is not None:
            self.model.set_pooling(pooling)
        self.model.eval()
        self.outputs = outputs

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            inputs = {k: torch.from_numpy(np.ascontiguousarray(batch[k])) for k in ("input_ids", "attention_mask")}
            inputs["token_type_ids"] = torch.from_numpy(
                np.ascontiguousarray(batch.get("token_type_ids", np.zeros_like(batch["input_ids"])))
            )
            table = self.model(**inputs).outputs
        values = {name: table.get(key, table.get(name)) for name, key in self.outputs.items()}
        missing = [name for name, value in values.items() if value is None]
        if missing:
            raise KeyError(f"the torch model gives no output {', '.join(missing)} (it gives {', '.join(table)})")
        return {n: (v.float() if v.is_floating_point() else v).numpy() for n, v in values.items()}


class Bf16Session:
    """An onnxruntime session's `run(names, feed)` over a bf16 artifact directory, for tools that compare an
    export's outputs with another's (evals/int8_agreement.py): the outputs its manifest's task gives, by graph
    output name."""

    def __init__(self, directory: Path):
        import json

        from .wrapper import output_spec

        manifest = json.loads((Path(directory) / "manifest.json").read_text())
        pooling = manifest.get("pooling")
        mode = pooling.get("pooling") if isinstance(pooling, dict) else None  # Pooling.describe()
        self.runner = Bf16Model(Path(directory), {}, mode)
        spec = output_spec(self.runner.model, manifest["task"])
        self.runner.outputs = {name: key for name, (key, _, _) in spec.items()}

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self.runner(feed)
        return [outputs[name] for name in names]

    def get_outputs(self) -> list:
        """The outputs by name, as onnxruntime's session lists them (objects with a `name`)."""
        return _named(self.runner.outputs)

    def get_inputs(self) -> list:
        """The inputs it reads, as onnxruntime's session lists them (token types: zeros where not given)."""
        return _named(("input_ids", "attention_mask", "token_type_ids"))


def _named(names) -> list:
    from types import SimpleNamespace

    return [SimpleNamespace(name=name) for name in names]


def session(directory: Path, options=None):
    """onnxruntime's session on the artifact's model.onnx, or a Bf16Session where the artifact is bf16 weights."""
    directory = Path(directory)
    if not (directory / "model.onnx").is_file() and (directory / WEIGHTS_FILE).is_file():
        return Bf16Session(directory)
    import onnxruntime as ort

    return ort.InferenceSession(str(directory / "model.onnx"), options, providers=["CPUExecutionProvider"])
