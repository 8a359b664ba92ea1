"""sentence-transformers' encode of a file of texts, timed, on its ONNX backend with optimum's dynamic int8
(`backend="onnx"`, `export_dynamic_quantized_onnx_model`), or on torch where optimum is missing. Runs in whichever
environment has sentence-transformers (bench/batch_bench.py starts it with the infinity venv's python when ours
lacks optimum); it imports nothing of bertserve.

    python bench/st_encode.py MODEL_DIR TEXTS.json WORK_DIR [--torch [--bf16]]   ->  one JSON line on stdout
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def quantized(model_dir: Path, work: Path):
    """The model on ONNX + optimum's int8 (made once in `work`): the configuration of this CPU's best kernels."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    config = "avx512_vnni" if "avx512_vnni" in flags else "avx512" if "avx512f" in flags else "avx2"
    target = work / f"st-onnx-{model_dir.name}"
    name = f"onnx/model_qint8_{config}.onnx"
    if not (target / name).is_file():
        shutil.rmtree(target, ignore_errors=True)
        model = SentenceTransformer(str(model_dir), device="cpu", backend="onnx")  # optimum exports fp32 ONNX
        model.save(str(target))
        export_dynamic_quantized_onnx_model(model, config, str(target))
    return SentenceTransformer(str(target), device="cpu", backend="onnx", model_kwargs={"file_name": name}), (
        f"onnx + optimum int8 ({config})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("texts")
    parser.add_argument("work")
    parser.add_argument("--torch", action="store_true", help="the torch backend, not ONNX int8")
    parser.add_argument("--bf16", action="store_true", help="with --torch: the model in bfloat16 (AMX / AVX512-BF16)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    texts = json.loads(Path(args.texts).read_text())
    started = time.perf_counter()
    if args.torch:
        from sentence_transformers import SentenceTransformer

        if args.bf16:
            import torch

            kwargs = {"model_kwargs": {"torch_dtype": torch.bfloat16}}
        else:
            kwargs = {}
        model, backend = SentenceTransformer(args.model, device="cpu", **kwargs), "torch bf16" if args.bf16 else "torch"
    else:
        model, backend = quantized(Path(args.model), Path(args.work))
    loaded = time.perf_counter()
    model.encode(texts[:64], batch_size=args.batch_size, normalize_embeddings=True)  # warm-up
    began = time.perf_counter()
    model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)
    elapsed = time.perf_counter() - began
    print(json.dumps({"backend": backend, "seconds": elapsed, "load_seconds": loaded - started}))


if __name__ == "__main__":
    main()
