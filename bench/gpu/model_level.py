"""Model level on the GPU: bertserve's torch backend `run()` against transformers SDPA, same GPU, same run.

    python -m bench.gpu.model_level --windows .gpu-kit/squad_windows.json --out model.json --profile profile.txt
    python -m bench.gpu.model_level --dry-run ...        # CPU, tiny presets, a fraction of a second per row

Workloads (random-init weights, seeded; transformers loads the very checkpoint bertserve loads):
- BERT-large QA, fp16: fixed shapes 384 x batch 1, 8, 32, 128 (every token real), and real SQuAD windows
  (question + context, lengths from squad_windows.json: encoded by the serving QA codec) in batches of 32;
- BERT-base classification, fp16: 128 x batch 1 and 128.
Then bertserve's pieces one by one, and the same model with --precision int8 (and fp8 on compute capability 8.9+):
each activation row its own scale, int8 (fp8) GEMMs, agreement with transformers' fp16 beside the speed.

Both sides get the same numpy batch and return numpy logits: host-to-device copy, forward, device-to-host
copy, as a user's code and our server do. transformers gets what a user would give it: for the real
windows, padded to max_length 384 (the run_qa example's default) and, in a second row, padded to the
longest window of the batch (a DataCollatorWithPadding). bertserve gets the same arrays as each (its
packed path drops the padding itself). Speed-up = transformers' time / bertserve's on the same input.
bertserve's pieces are also measured one by one (padded path; packed without CUDA graphs) to show what
each adds. Every row is written to --out as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import REPO, machine, percentile

BAR = {"real_vs_max_length": 2.0, "fixed_384x32": 1.3}  # issue 15's bar


class Deadline:
    def __init__(self, at: float | None):
        self.at = at

    def left(self) -> float:
        return float("inf") if self.at is None else self.at - time.time()


# ----------------------------------------------------------------------------- inputs


def fixed_batch(rng, batch: int, seq: int, question: int = 16) -> dict[str, np.ndarray]:
    ids = rng.integers(1000, 30000, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, question + 1], ids[:, -1] = 101, 102, 102
    types = np.zeros((batch, seq), np.int64)
    types[:, question + 2 :] = 1
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}


def window_batches(
    rng, windows: list[list[int]], batch: int, width: int | str, multiple: int = 1
) -> list[dict[str, np.ndarray]]:
    """Batches of real (question, window) lengths, random ids; width: a number (pad to it) or 'longest'."""
    out = []
    for i in range(0, len(windows) - batch + 1, batch):
        chunk = windows[i : i + batch]
        longest = max(n for _, n in chunk)
        w = -(-longest // multiple) * multiple if width == "longest" else int(width)
        ids = np.zeros((batch, w), np.int64)
        mask = np.zeros((batch, w), np.int64)
        types = np.zeros((batch, w), np.int64)
        for row, (question, n) in enumerate(chunk):
            ids[row, :n] = rng.integers(1000, 30000, size=n)
            ids[row, 0], ids[row, question - 1], ids[row, n - 1] = 101, 102, 102
            mask[row, :n] = 1
            types[row, question:n] = 1
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    return out


def scaled_windows(windows: list[list[int]], seq: int) -> list[list[int]]:
    """The dry run's windows: the same distribution shrunk to `seq` tokens."""
    return [[max(2, q * seq // 384), max(4, n * seq // 384)] for q, n in windows]


# ----------------------------------------------------------------------------- the two sides


def make_checkpoint(preset: str, task: str, out: Path, dtype) -> Path:
    """Random-init weights, seeded (the same on every run): reused when an earlier run on this machine saved them."""
    from bert.checkpoint import init_model, save_checkpoint

    done = out / ".complete"
    if done.is_file() and done.read_text() == str(dtype):
        return out

    # QA too gets transformers' default two labels: a config without id2label is refused by some
    # versions of serving's model-spec reader.
    labels = {0: "negative", 1: "positive"} if task == "classify" else {0: "LABEL_0", 1: "LABEL_1"}
    model = init_model(preset, task, seed=0, id2label=labels)
    save_checkpoint(model, out, tokenizer=REPO / "serving" / "demo_model", dtype=dtype)
    done.write_text(str(dtype))
    return out


def transformers_runner(ckpt: Path, task: str, device: str, dtype):
    import torch
    import transformers

    cls = transformers.BertForQuestionAnswering if task == "qa" else transformers.BertForSequenceClassification
    model = cls.from_pretrained(ckpt, attn_implementation="sdpa", dtype=dtype).to(device).eval()

    @torch.inference_mode()
    def run(batch):
        out = model(**{k: torch.from_numpy(v).to(device) for k, v in batch.items()})
        if task == "qa":
            return {"qa_start": out.start_logits.float().cpu().numpy(), "qa_end": out.end_logits.float().cpu().numpy()}
        return {"classify": out.logits.float().cpu().numpy()}

    return run, model


def bertserve_backend(ckpt: Path, device: str, precision: str, **options):
    """The server's own backend object, made as the server makes it (settings -> create_backend)."""
    from runtime.backends import create_backend
    from runtime.backends.torch_backend import TorchBackend
    from runtime.model_dir import read_model_spec
    from serving.settings import Settings

    settings = Settings(device=device, precision=precision, backend="torch")
    spec = read_model_spec(ckpt)
    return TorchBackend(spec, settings, **options) if options else create_backend(spec, settings)


# ----------------------------------------------------------------------------- timing


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(run, batches: list[dict], seconds: float, warmup_passes: int = 1) -> dict:
    """Whole passes over `batches` until `seconds` have gone: sequences/s, and per-batch latency."""
    for _ in range(3 if len(batches) == 1 else warmup_passes):  # graph captures, lazy init, clocks
        for b in batches:
            run(b)
    sync()
    latencies, sequences = [], 0
    started = time.perf_counter()
    while True:
        for b in batches:
            t0 = time.perf_counter()
            run(b)  # returns host arrays: synchronised
            latencies.append(time.perf_counter() - t0)
            sequences += len(b["input_ids"])
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and len(latencies) >= 5:
            break
    return {
        "seq_per_s": sequences / elapsed,
        "p50_ms": 1e3 * percentile(latencies, 50),
        "p99_ms": 1e3 * percentile(latencies, 99),
        "mean_ms": 1e3 * sum(latencies) / len(latencies),
        "batches": len(latencies),
        "seconds": elapsed,
    }


def agreement(ours: dict, theirs: dict, batch: dict) -> dict:
    """How far bertserve's logits are from transformers' on the same batch (real tokens only)."""
    where = batch["attention_mask"] != 0
    worst, same = 0.0, []
    for key, want in theirs.items():
        got = ours[key]
        if want.ndim == 2 and want.shape == where.shape:  # per-token logits: real tokens only
            diff = np.abs(got - want)[where]
            worst = max(worst, float(diff.max()))
            masked = lambda a: np.where(where, a, -np.inf)  # noqa: E731
            same.append(masked(got).argmax(1) == masked(want).argmax(1))
        else:
            worst = max(worst, float(np.abs(got - want).max()))
            same.append(got.argmax(-1) == want.argmax(-1))
    return {"max_abs_diff": worst, "argmax_agree": float(np.mean(np.concatenate(same)))}


# ----------------------------------------------------------------------------- main


class Report:
    def __init__(self, path: Path, header: dict):
        self.path, self.data = path, dict(header, rows=[], agreement=[], backends={}, summary={})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.path)

    def row(self, **row) -> None:
        self.data["rows"].append(row)
        print(
            f"{row['model']:6s} {row['workload']:22s} {row['variant']:34s} {row['seq_per_s']:10.1f} seq/s  "
            f"p50 {row['p50_ms']:8.2f} ms  p99 {row['p99_ms']:8.2f} ms",
            flush=True,
        )
        self.save()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", default=str(REPO / ".gpu-kit" / "squad_windows.json"))
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu_model_level.json"))
    p.add_argument("--profile", help="write a torch.profiler table of the 384 x 32 and real-window runs here")
    p.add_argument("--seconds", type=float, default=2.0, help="measuring time per row")
    p.add_argument("--deadline", type=float, help="unix time to stop starting rows at")
    p.add_argument("--workdir", help="where the random-init checkpoints go (default: a temp dir)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny presets, fp32, tiny shapes")
    args = p.parse_args(argv)

    import torch

    deadline = Deadline(args.deadline)
    cuda = torch.cuda.is_available() and not args.dry_run
    device, precision = ("cuda", "fp16") if cuda else ("cpu", "fp32")
    dtype = torch.float16 if cuda else torch.float32
    if not cuda and not args.dry_run:
        raise SystemExit("model_level: no CUDA device (use --dry-run on CPU)")
    seconds = 0.05 if args.dry_run else args.seconds
    seq_large, seq_base = (64, 32) if args.dry_run else (384, 128)
    batches_large = (1, 4) if args.dry_run else (1, 8, 32, 128)
    batches_base = (1, 4) if args.dry_run else (1, 128)
    real_batch = 8 if args.dry_run else 32
    presets = ("tiny", "tiny") if args.dry_run else ("large", "base")
    windows = json.loads(Path(args.windows).read_text())["windows"]
    if args.dry_run:
        windows = scaled_windows(windows, seq_large)[: real_batch * 3]
    else:
        windows = windows[: real_batch * 64]  # 2048 windows: one pass is 64 batches
    # The packed path on CPU only in the dry run, to exercise it (on CPU the server runs padded).
    fast = {"packed": True} if args.dry_run else {}

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bertserve-gpu-model-"))
    report = Report(
        Path(args.out),
        {
            "machine": machine(),
            "torch": torch.__version__,
            "device": device,
            "precision": precision,
            "dry_run": args.dry_run,
            "bar": BAR,
            "seconds_per_row": seconds,
        },
    )
    try:
        import transformers

        report.data["transformers"] = transformers.__version__
    except ImportError:
        pass
    report.save()
    rng = np.random.default_rng(0)

    contexts: dict[str, dict] = {}

    def headline(name: str, preset: str, task: str, seq: int, batch_sizes, with_real: bool) -> None:
        """bertserve as served against transformers as a user runs it, every workload of one model."""
        if deadline.left() < 60 and not args.dry_run:
            report.data["summary"]["stopped_early"] = f"deadline reached before {name}"
            return
        ckpt = make_checkpoint(preset, task, workdir / name, dtype)
        hf, hf_model = transformers_runner(ckpt, task, device, dtype)
        ours = bertserve_backend(ckpt, device, precision, **fast)
        report.data["backends"][name] = {
            "preset": preset,
            "task": task,
            "fast_path": ours.fast_path,
            "params": sum(p.numel() for p in hf_model.parameters()),
        }
        fixed = {f"{seq}x{b}": [fixed_batch(rng, b, seq)] for b in batch_sizes}
        real_max = window_batches(rng, windows, real_batch, seq) if with_real else []
        real_longest = [
            {k: v[:, : max(1, int(b["attention_mask"].sum(1).max()))] for k, v in b.items()} for b in real_max
        ]
        workloads = dict(
            fixed, **({"squad-windows/max_length": real_max, "squad-windows/longest": real_longest} if real_max else {})
        )
        contexts[name] = {"ckpt": ckpt, "hf": hf, "ours": ours, "workloads": workloads, "seq": seq}
        last = f"{seq}x{batch_sizes[-1]}"
        report.data["agreement"].append(
            {"model": name, "workload": last, **agreement(ours.run(fixed[last][0]), hf(fixed[last][0]), fixed[last][0])}
        )
        if real_max:
            report.data["agreement"].append(
                {
                    "model": name,
                    "workload": "squad-windows",
                    **agreement(ours.run(real_max[0]), hf(real_max[0]), real_max[0]),
                }
            )
        report.save()
        for workload, batches in workloads.items():
            for variant, fn in (("transformers-sdpa", hf), ("bertserve", ours.run)):
                if deadline.left() < 4 * seconds + 10:
                    report.data["summary"]["stopped_early"] = f"deadline reached before {name} {workload} {variant}"
                    return
                report.row(
                    model=name,
                    workload=workload,
                    variant=variant,
                    batch=len(batches[0]["input_ids"]),
                    **measure(fn, batches, seconds),
                )
        if ours.runner is not None:
            report.data["backends"][name].update(
                graphs_captured=ours.runner.captures,
                capture_failures=ours.runner.capture_failures,
                buckets=[list(k) for k in ours.runner.buckets],
            )
        summarise(report)

    def pieces(name: str, workloads: list[str]) -> None:
        """bertserve's pieces one by one on the same inputs: the padded path, and packed without graphs."""
        context = contexts.get(name)
        if context is None:
            return
        variants = [
            ("bertserve-padded", precision, {"packed": False}),
            ("bertserve-packed-no-graphs", precision, {"packed": True, "cuda_graphs": False}),
            # opt-in, not the default: tanh-approximate GELU in the GEMM's epilogue
            ("bertserve-gelu-epilogue", precision, {"packed": True, "gelu_epilogue": True}),
            # --precision int8 / fp8: each activation row its own scale (bert/precision.py), the all-int8 export's
            # arithmetic through cuBLASLt's int8 GEMMs, and the same in fp8 (torch._scaled_mm, row-wise scales)
            ("bertserve-int8", "int8", fast),
        ]
        if cuda and torch.cuda.get_device_capability() >= (8, 9):
            variants.append(("bertserve-fp8", "fp8", fast))
        for variant, variant_precision, options in variants:
            if deadline.left() < 8 * seconds + 30:
                report.data["summary"]["stopped_early"] = f"deadline reached before {name} {variant}"
                return
            try:
                piece = bertserve_backend(context["ckpt"], device, variant_precision, **options)
            except Exception as e:  # noqa: BLE001 - a kernel this torch or GPU lacks: recorded, the rest goes on
                report.data["backends"][f"{name}/{variant}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                report.save()
                continue
            report.data["backends"][f"{name}/{variant}"] = piece.fast_path
            context[variant] = piece
            first = context["workloads"][workloads[0]][0]
            report.data["agreement"].append(
                {
                    "model": name,
                    "workload": workloads[0],
                    "variant": variant,
                    **agreement(piece.run(first), context["hf"](first), first),
                }
            )
            for workload in workloads:
                batches = context["workloads"].get(workload)
                if not batches:
                    continue
                if deadline.left() < 4 * seconds + 10:
                    report.data["summary"]["stopped_early"] = f"deadline reached before {name} {variant} {workload}"
                    return
                report.row(
                    model=name,
                    workload=workload,
                    variant=variant,
                    batch=len(batches[0]["input_ids"]),
                    **measure(piece.run, batches, seconds),
                )

    headline("large", presets[0], "qa", seq_large, batches_large, with_real=True)
    headline("base", presets[1], "classify", seq_base, batches_base, with_real=False)
    large = contexts.get("large")
    if args.profile and large and deadline.left() > 40:
        middle = f"{seq_large}x{batches_large[min(2, len(batches_large) - 1)]}"  # 384 x 32 on the GPU
        write_profile(
            Path(args.profile),
            {"transformers-sdpa": large["hf"], "bertserve": large["ours"].run},
            {
                middle: large["workloads"][middle][0],
                "squad-windows/max_length": large["workloads"]["squad-windows/max_length"][0],
            },
            cuda,
        )
        report.data["profile"] = str(args.profile)
    pieces(
        "large",
        [f"{seq_large}x{batches_large[min(2, len(batches_large) - 1)]}", f"{seq_large}x1", "squad-windows/max_length"],
    )
    if not args.dry_run:
        pieces("base", [f"{seq_base}x1", f"{seq_base}x{batches_base[-1]}"])
    if args.profile and large and "bertserve-packed-no-graphs" in large and deadline.left() > 20:
        # Inside a CUDA graph the profiler sees one launch; the eager packed run shows its kernels.
        middle = f"{seq_large}x{batches_large[min(2, len(batches_large) - 1)]}"
        write_profile(
            Path(args.profile),
            {"bertserve-packed-no-graphs": large["bertserve-packed-no-graphs"].run},
            {middle: large["workloads"][middle][0]},
            cuda,
            append=True,
        )
    summarise(report)
    report.data["status"] = "interrupted" if report.data["summary"].get("stopped_early") else "ok"
    report.save()
    print(json.dumps(report.data["summary"], indent=2))
    return 3 if report.data["status"] == "interrupted" else 0


def summarise(report: Report) -> None:
    """Speed-ups (transformers time / bertserve time, from sequences/s on the same input) and the bar."""
    rows = report.data["rows"]
    by = {(r["model"], r["workload"], r["variant"]): r for r in rows}
    speedups = {}
    for (model, workload, variant), r in by.items():
        if variant != "bertserve":
            continue
        base = by.get((model, workload, "transformers-sdpa"))
        if base:
            speedups[f"{model} {workload}"] = r["seq_per_s"] / base["seq_per_s"]
    summary = report.data["summary"]
    summary["speedup"] = speedups
    large_fixed = [k for k in speedups if k.startswith("large ") and k.endswith("x32")]
    checks = {}
    if "large squad-windows/max_length" in speedups:
        checks["real_vs_max_length"] = {
            "speedup": speedups["large squad-windows/max_length"],
            "bar": BAR["real_vs_max_length"],
        }
    if "large squad-windows/longest" in speedups:
        checks["real_vs_longest"] = {"speedup": speedups["large squad-windows/longest"], "bar": None}
    if large_fixed:
        checks["fixed_384x32"] = {"speedup": speedups[large_fixed[0]], "bar": BAR["fixed_384x32"]}
    for check in checks.values():
        check["met"] = None if check["bar"] is None else check["speedup"] >= check["bar"]
    summary["bar"] = checks
    report.save()


def write_profile(path: Path, runners: dict, batches: dict, cuda: bool, append: bool = False) -> None:
    """torch.profiler tables (by device time) of each side on each workload: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    parts = []
    for workload, batch in batches.items():
        if batch is None:
            continue
        for name, run in runners.items():
            run(batch)
            sync()
            with profile(activities=activities) as prof:
                for _ in range(3):
                    run(batch)
                sync()
            parts.append(
                f"==== {name} on {workload} (3 runs) ====\n"
                + prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=70)
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as f:
        f.write("\n\n".join(parts) + "\n")
    print(f"profile: {path}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
