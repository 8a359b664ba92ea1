"""ONNX models for infinity's optimum engine, made with optimum in infinity's own venv.

    bench/.peers/infinity-venv/bin/python bench/peers/infinity_onnx.py --model DIR --task classify --out OUT

infinity cannot export or quantize a model itself (its `--engine optimum` loads the .onnx files it
finds in the model directory), so the bench does it by hand, the way optimum's documentation does:
export, graph optimisation at -O2 (fused attention, LayerNorm and GELU), then for int8 dynamic
quantization of the MatMuls with optimum's AVX-512 VNNI or AVX2 preset. Each precision goes to its
own directory with exactly one .onnx file, so infinity has no choice to make.

Runs in infinity's venv (optimum, torch, transformers of its pinned versions): imports nothing of bertserve.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ORT_CLASSES = {
    "classify": "ORTModelForSequenceClassification",
    "rerank": "ORTModelForSequenceClassification",
    "embed": "ORTModelForFeatureExtraction",
}
EXPORT_TASKS = {"classify": "text-classification", "rerank": "text-classification", "embed": "feature-extraction"}
KEEP = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return set()


def quantize(optimized: Path, out: Path) -> Path:
    """Dynamic int8 with the settings of optimum's AutoQuantizationConfig.avx512_vnni (or .avx2) preset.

    Called through onnxruntime rather than optimum's ORTQuantizer: on the -O2 graph, shape inference
    cannot type the outputs of the fused com.microsoft operators and ORTQuantizer offers no way to pass
    onnxruntime's DefaultTensorType option, which says they are float."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out.mkdir(parents=True, exist_ok=True)
    vnni = "avx512_vnni" in cpu_flags()
    quantize_dynamic(
        optimized,
        out / "model_quantized.onnx",
        per_channel=True,
        reduce_range=not vnni,
        weight_type=QuantType.QInt8,
        extra_options={
            "WeightSymmetric": True,
            "ActivationSymmetric": False,
            "DefaultTensorType": onnx.TensorProto.FLOAT,
        },
    )
    return out


def export(model: Path, task: str, out: Path, precision: str, optimized: Path | None = None) -> Path:
    """model's ONNX for infinity in `out`; with `optimized` (an -O2 graph this function made at fp32), int8
    quantises that graph instead of exporting and optimising again."""
    import optimum.onnxruntime as ortm
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTOptimizer
    from optimum.onnxruntime.configuration import AutoOptimizationConfig

    work = Path(tempfile.mkdtemp(prefix="infinity-onnx-"))
    if optimized is not None and precision == "int8":
        return _finish(model, quantize(optimized, work / "quantized"), out, work)
    # library_name: a sentence-transformers directory would otherwise export token_embeddings and
    # sentence_embedding, while infinity's optimum embedder reads last_hidden_state and pools itself.
    main_export(
        str(model),
        output=work / "exported",
        task=EXPORT_TASKS[task],
        opset=17,
        device="cpu",
        library_name="transformers",
    )
    ort_model = getattr(ortm, ORT_CLASSES[task]).from_pretrained(work / "exported")
    optimizer = ORTOptimizer.from_pretrained(ort_model)
    optimizer.optimize(AutoOptimizationConfig.O2(), save_dir=work / "optimized")
    final = work / "optimized"
    if precision == "int8":
        final = quantize(final / "model_optimized.onnx", work / "quantized")
    return _finish(model, final, out, work)


def _finish(model: Path, final: Path, out: Path, work: Path) -> Path:
    onnx_files = sorted(final.glob("*.onnx"))
    if len(onnx_files) != 1:
        raise SystemExit(f"expected one .onnx file in {final}, found {[p.name for p in onnx_files]}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copyfile(onnx_files[0], out / "model.onnx")
    for name in KEEP:  # tokenizer and config from the source: what infinity reads besides the graph
        if (model / name).is_file():
            shutil.copyfile(model / name, out / name)
    if (model / "1_Pooling").is_dir():
        shutil.copytree(model / "1_Pooling", out / "1_Pooling")
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, type=Path, help="a transformers model directory")
    p.add_argument("--task", choices=sorted(ORT_CLASSES), required=True)
    p.add_argument("--precision", choices=("fp32", "int8"), required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--optimized", type=Path, help="int8: quantise this -O2 graph (this script's fp32 output)")
    args = p.parse_args(argv)
    print(export(args.model, args.task, args.out, args.precision, args.optimized))
    return 0


if __name__ == "__main__":
    sys.exit(main())
