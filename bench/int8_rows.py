"""int8 activation scales per row against per tensor, on an fp32 artifact's fused graph (an embedding model):

    python -m export.onnx --ckpt PATH --task embed --precision fp32 --out /tmp/fp32
    python -m bench.int8_rows /tmp/fp32 [--sentences 872] [--threads 2] [--also ARTIFACT ...]

Builds every-group-int8 twice from the same fused graph, onnxruntime's dynamic quantisation (one activation scale
per batch) and export's per-row scales (quantize_int8 scope all), and reports for each, on the SST-2 dev sentences
in batches of 8: cosine with fp32 (smallest, share >= 0.99), the largest change of a text's vector between alone and
in its batch, and rows/s with the graphs run in turn batch by batch (a shared machine's busy moments fall on all).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

KEYS = ("input_ids", "attention_mask", "token_type_ids")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_rows")
    parser.add_argument("artifact", help="an fp32 artifact directory of an embedding model")
    parser.add_argument("--data", default="/work/shared/data/SST-2/dev.tsv")
    parser.add_argument("--sentences", type=int, default=872)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--also", metavar="DIR", action="append", default=[], help="another artifact's model.onnx")
    args = parser.parse_args(argv)

    import onnxruntime as ort

    from bert.tokenizer import BertTokenizer
    from export.variants import quantize_dynamic_graph, quantize_int8, save, split_skip_layer_norm

    artifact = Path(args.artifact)
    fused = artifact / "model.onnx"
    tokenizer = BertTokenizer.from_dir(artifact)
    with open(args.data, encoding="utf-8") as f:
        next(f)
        sentences = [line.split("\t")[0] for line in f][: args.sentences]

    def encode(texts):
        encoded = tokenizer(texts, max_length=128, truncation=True)
        return {k: np.asarray(encoded[k], np.int64) for k in KEYS}

    batches = [encode(sentences[i : i + args.batch]) for i in range(0, len(sentences), args.batch)]
    with tempfile.TemporaryDirectory() as scratch:
        import onnx

        per_tensor = Path(scratch) / "per-tensor.onnx"
        quantize_dynamic_graph(fused, per_tensor)
        model = onnx.load(str(per_tensor))
        split_skip_layer_norm(model)  # as the export's int8 graphs: the faster LayerNorm pair
        save(model, per_tensor)
        per_row = Path(scratch) / "per-row.onnx"
        quantize_int8(fused, per_row, "all")
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        paths = {"fp32": fused, "int8 per-tensor": per_tensor, "int8 per-row": per_row}
        paths |= {str(d): Path(d) / "model.onnx" for d in args.also}
        sessions = {
            k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for k, p in paths.items()
        }

        def run(session, feed):
            names = {i.name for i in session.get_inputs()}
            return session.run(None, {k: v for k, v in feed.items() if k in names})[0]

        outputs = {k: np.concatenate([run(s, b) for b in batches]) for k, s in sessions.items()}
        seconds = {k: 0.0 for k in sessions}
        for _ in range(args.passes):
            for b in batches:
                for k, s in sessions.items():
                    start = time.perf_counter()
                    run(s, b)
                    seconds[k] += time.perf_counter() - start
        alone_count = min(64, len(sentences))
        report = {}
        for k, s in sessions.items():
            alone = np.concatenate([run(s, encode([t])) for t in sentences[:alone_count]])
            a, r = outputs[k], outputs["fp32"]
            cosine = (a * r).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(r, axis=-1)
            report[k] = {
                "rows_per_s": round(args.passes * len(sentences) / seconds[k], 1),
                "min_cosine": round(float(cosine.min()), 5),
                "share_cosine_0.99": round(float((cosine >= 0.99).mean()), 4),
                "alone_vs_batch_max_abs": float(np.abs(alone - outputs[k][:alone_count]).max()),
            }
    print(json.dumps({"sentences": len(sentences), "batch": args.batch, "threads": args.threads, **report}, indent=1))


if __name__ == "__main__":
    main()
