"""python -m export.tensorrt: an artifact's portable ONNX -> a serialized FP16 TensorRT engine (model.plan).

Precision lives in the graph (strongly typed network): the portable fp32 graph is converted to fp16
with fp32 inputs/outputs and fp32 LayerNormalization/Softmax, then built with the STRONGLY_TYPED
flag. That is the only way on TensorRT 11 (weak-typing flags such as BuilderFlag.FP16 are gone)
and the recommended one on 10.12+. One optimisation profile spans the manifest's shape range
(min/opt/max batch and sequence for every input). A timing cache file makes rebuilds fast.
After the build the engine is checked against onnxruntime on the shipped sample text.
An engine that lands in its artifact is added as export.onnx writes: a copy of the artifact (hard links) gains
model.plan and the manifest's entry for it, and replaces the artifact by one rename once verified
(bert/atomic.py); an engine written elsewhere is renamed into place whole. A kill leaves the previous state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bert import options
from bert.atomic import fsync_dir, publish_dir, write_file_atomic
from bert.options import option
from bert.tensorrt_runtime import INSTALL_HINT

from .cli import Progress, ResultError, UsageError, run
from .manifest import MANIFEST_FILE, PLAN_FILE, PORTABLE_FILE, file_entry, read_manifest, write_manifest

# Engine outputs vs onnxruntime fp32 on the sample text (fp16 engine).
TRT_TOLERANCE = {"relative_rms": 0.02, "label_agreement": 0.95}


def import_tensorrt():
    try:
        import tensorrt
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return tensorrt


@dataclass
class TensorRTOptions:
    """python -m export.tensorrt's options (bert/options.py: each is also an env var BERTSERVE_TENSORRT_<NAME>)."""

    env_prefix = "BERTSERVE_TENSORRT_"  # bert/options.py: an env var belongs to one command

    artifact: str | None = option(
        None,
        metavar="DIR",
        required=True,
        one_of="source",
        help=("artifact directory written by python -m export.onnx (its model.portable.onnx is built); or --onnx"),
    )
    onnx: str | None = option(
        None,
        metavar="FILE",
        required=True,
        one_of="source",
        help=(
            "an ONNX file with standard ops only (e.g. DIR/model.portable.onnx); the manifest next to it, if any, gives "
            "the shape range and the parity check; or --artifact"
        ),
    )
    out: str | None = option(
        None,
        metavar="PLAN",
        help=(
            "engine file to write, or an existing directory that receives model.plan (default: DIR/model.plan; the "
            "manifest is updated only when the plan lands in the artifact)"
        ),
    )
    max_batch: int | None = option(
        None, metavar="N", help="profile max batch (default: the manifest's, else 32)", minimum=1
    )
    max_seq: int | None = option(
        None, metavar="N", help="profile max sequence (default: the manifest's, else 512)", minimum=1
    )
    opt_batch: int | None = option(
        None, metavar="N", help="profile opt batch (default: the manifest's, else 8)", minimum=1
    )
    opt_seq: int | None = option(
        None, metavar="N", help="profile opt sequence (default: the manifest's, else 128)", minimum=1
    )
    workspace_gb: float = option(
        4.0, metavar="GB", help=("largest GPU scratch memory TensorRT may use while building and running"), above=0
    )
    timing_cache: str | None = option(
        None,
        metavar="FILE",
        help=(
            "timing cache to read if present and write back after the build (default: DIR/timing.cache); reuse it "
            "across builds on the same GPU"
        ),
    )
    no_verify: bool = option(False, help="skip the parity check against onnxruntime")


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser(
        TensorRTOptions,
        prog="python -m export.tensorrt",
        description="Build a serialized FP16 TensorRT engine from an artifact directory's model.portable.onnx, "
        "with one optimisation profile over the manifest's shape range, and check it against "
        "onnxruntime. Needs the tensorrt package and an NVIDIA GPU.",
        epilog="Exit status: 0 built and verified; 1 build failed or outputs out of tolerance; 2 bad request "
        "or TensorRT not installed.",
    )


def fp16_onnx(portable: Path, out: Path) -> Path:
    """Portable fp32 graph -> mixed fp16 graph (standard ops, fp32 I/O, fp32 norms and softmax)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from .variants import FP16_OP_BLOCK_LIST

    model = onnx.load(str(portable))
    model = convert_float_to_float16(model, keep_io_types=True, op_block_list=list(FP16_OP_BLOCK_LIST))
    onnx.save_model(model, str(out))
    return out


def profile_shapes(manifest: dict) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    r = manifest["shape_range"]
    return (r["min_batch"], r["min_seq"]), (r["opt_batch"], r["opt_seq"]), (r["max_batch"], r["max_seq"])


def build_engine(
    onnx_path: Path,
    manifest: dict,
    *,
    workspace_gb: float,
    timing_cache: Path | None,
    progress: Progress | None = None,
    timing_cache_out: Path | None = None,
) -> bytes:
    """The serialized engine. The timing cache is read from `timing_cache` and written, whole, to
    `timing_cache_out` (default: the same file)."""
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)  # required 10.x, ignored 11.x
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ResultError(f"TensorRT could not parse {onnx_path}: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    minimum, optimum, maximum = profile_shapes(manifest)
    profile = builder.create_optimization_profile()
    for spec in manifest["inputs"]:
        profile.set_shape(spec["name"], minimum, optimum, maximum)
    config.add_optimization_profile(profile)

    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    if progress:
        progress.note(
            f"profile min {minimum} opt {optimum} max {maximum}; workspace {workspace_gb} GB; "
            f"timing cache {'reused' if cache_bytes else 'new'}"
        )

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ResultError("TensorRT failed to build the engine (see the TensorRT log above)")
    if timing_cache_out or timing_cache:
        write_file_atomic(timing_cache_out or timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    return bytes(memoryview(serialized))


def verify_engine(plan: Path, artifact: Path, manifest: dict) -> dict:
    """Engine (fp16) vs onnxruntime running the portable fp32 graph, on the sample text."""
    from bert.tensorrt_runtime import TrtEngine
    from bert.tokenizer import BertTokenizer

    from . import parity

    tokenizer = BertTokenizer.from_dir(artifact)
    max_batch, max_seq = manifest["shape_range"]["max_batch"], manifest["shape_range"]["max_seq"]
    batches = parity.sample_batches(tokenizer, max_seq, batch_size=min(8, max_batch))
    batches = parity.row_by_row([{k: v[:max_batch] for k, v in b.items()} for b in batches])
    names = [o["name"] for o in manifest["outputs"]]
    sess = parity.session(artifact / PORTABLE_FILE)
    reference = parity.onnx_outputs(sess, batches, names)
    engine = TrtEngine(plan)
    candidate = [{n: engine.run(b)[n].astype("float32") for n in names} for b in batches]
    token_level = {o["name"]: "sequence" in o["shape"] for o in manifest["outputs"]}
    scores = {
        n: (
            "positions"
            if n.endswith(("start_logits", "end_logits"))
            else "none"
            if manifest["task"] == "encoder"
            else "labels"
        )
        for n in names
    }
    figures = parity.compare(reference, candidate, batches, token_level, scores)
    problems = []
    for name, f in figures.items():
        if f.relative_rms > TRT_TOLERANCE["relative_rms"]:
            problems.append(f"{name}: relative RMS error {f.relative_rms:.3g} > {TRT_TOLERANCE['relative_rms']}")
        if f.label_agreement is not None and f.label_agreement < TRT_TOLERANCE["label_agreement"]:
            problems.append(f"{name}: label agreement {f.label_agreement:.3f} < {TRT_TOLERANCE['label_agreement']}")
    return {
        "reference": "onnxruntime fp32, model.portable.onnx",
        "precision": "fp16",
        "tolerance": TRT_TOLERANCE,
        "passed": not problems,
        "problems": problems,
        "outputs": {n: vars(f) for n, f in figures.items()},
        "max_abs_diff": max(f.max_abs_diff for f in figures.values()),
    }


def resolve_request(args) -> tuple[Path, Path, dict, bool]:
    """(onnx file, artifact dir, manifest with the effective shape range, whether a real manifest exists)."""
    import onnx

    if args.artifact:
        artifact = Path(args.artifact)
        manifest = read_manifest(artifact)
        onnx_path = artifact / PORTABLE_FILE
        if not onnx_path.is_file():
            raise UsageError(f"{artifact} has no {PORTABLE_FILE}; re-export it with python -m export.onnx")
        has_manifest = True
    else:
        onnx_path = Path(args.onnx)
        if not onnx_path.is_file():
            raise UsageError(f"--onnx {onnx_path}: no such file")
        artifact = onnx_path.parent
        has_manifest = (artifact / "manifest.json").is_file()
        if has_manifest:
            manifest = read_manifest(artifact)
        else:
            graph = onnx.load(str(onnx_path), load_external_data=False).graph
            manifest = {
                "task": None,
                "inputs": [{"name": i.name} for i in graph.input],
                "outputs": [],
                "shape_range": {
                    "min_batch": 1,
                    "opt_batch": 8,
                    "max_batch": 32,
                    "min_seq": 1,
                    "opt_seq": 128,
                    "max_seq": 512,
                },
            }
    domains = {n.domain for n in onnx.load(str(onnx_path), load_external_data=False).graph.node} - {"", "ai.onnx"}
    if domains:
        raise UsageError(
            f"{onnx_path} uses onnxruntime-only operators ({', '.join(sorted(domains))}); TensorRT needs "
            f"the portable graph: --onnx DIR/{PORTABLE_FILE} or --artifact DIR"
        )
    r = dict(manifest["shape_range"])
    for key in ("max_batch", "max_seq", "opt_batch", "opt_seq"):
        if getattr(args, key) is not None:
            r[key] = getattr(args, key)
    if not (1 <= r["opt_batch"] <= r["max_batch"] and 1 <= r["opt_seq"] <= r["max_seq"]):
        raise UsageError(
            f"shape range must satisfy 1 <= opt <= max: batch {r['opt_batch']}/{r['max_batch']}, "
            f"sequence {r['opt_seq']}/{r['max_seq']}"
        )
    manifest["shape_range"] = r
    return onnx_path, artifact, manifest, has_manifest


def main(argv=None) -> None:
    args = TensorRTOptions(**options.read(TensorRTOptions, argv, parser=build_parser()))
    onnx_path, artifact, manifest, has_manifest = resolve_request(args)
    trt = import_tensorrt()
    plan = Path(args.out) if args.out else artifact / PLAN_FILE
    if plan.is_dir():
        plan = plan / PLAN_FILE
    timing_cache = Path(args.timing_cache) if args.timing_cache else artifact / "timing.cache"
    verify = has_manifest and not args.no_verify and bool(manifest["outputs"])

    progress = Progress(total=3 if verify else 2)
    in_artifact = has_manifest and plan.resolve().parent == artifact.resolve()
    if in_artifact:
        with publish_dir(artifact.resolve()) as work:
            link_contents(artifact, work, skip=(PLAN_FILE, MANIFEST_FILE))
            cache_out = work / timing_cache.name if timing_cache.parent.resolve() == artifact.resolve() else None
            figures = build_and_check(
                args, onnx_path, work / PLAN_FILE, artifact, manifest, timing_cache, cache_out, verify, progress, trt
            )
            with progress("recording the engine in manifest.json"):
                manifest.pop("format_version", None)
                manifest.setdefault("files", {})["plan"] = file_entry(work / PLAN_FILE)
                manifest["tensorrt"] = {
                    "version": trt.__version__,
                    "precision": "fp16",
                    "strongly_typed": True,
                    "workspace_gb": args.workspace_gb,
                    "parity": figures,
                    "profile": dict(zip(("min", "opt", "max"), profile_shapes(manifest))),
                }
                write_manifest(work, manifest)
    else:
        plan.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{plan.name}.tmp-", dir=plan.parent) as work:
            built = Path(work) / PLAN_FILE
            build_and_check(args, onnx_path, built, artifact, manifest, timing_cache, None, verify, progress, trt)
            with progress(
                "moving the engine into place (manifest.json left as it is: the engine is outside the artifact)"
            ):
                os.chmod(built, 0o644)
                os.replace(built, plan)
                fsync_dir(plan.parent)
    print(f"engine: {plan}")


def link_contents(source: Path, destination: Path, skip: tuple[str, ...] = ()) -> None:
    """The files of `source` in `destination` as hard links (a copy where the file system has none): the
    artifact's files are never changed in place, every writer publishes a new directory, so sharing is safe."""
    for entry in source.iterdir():
        if entry.name in skip or not entry.is_file():
            continue
        try:
            os.link(entry, destination / entry.name)
        except OSError:
            shutil.copy2(entry, destination / entry.name)


def build_and_check(
    args,
    onnx_path: Path,
    plan: Path,
    artifact: Path,
    manifest: dict,
    timing_cache: Path,
    timing_cache_out: Path | None,
    verify: bool,
    progress: Progress,
    trt,
) -> dict | None:
    """Build the engine into `plan` and check it; out of tolerance raises ResultError (nothing is published)."""
    with tempfile.TemporaryDirectory(prefix=".fp16-onnx-", dir=plan.parent) as tmp:
        with progress(
            f"building the FP16 engine with TensorRT {trt.__version__} from {onnx_path.name} (minutes for large models)"
        ):
            onnx_fp16 = fp16_onnx(onnx_path, Path(tmp) / "model.fp16.onnx")
            plan.write_bytes(
                build_engine(
                    onnx_fp16,
                    manifest,
                    workspace_gb=args.workspace_gb,
                    timing_cache=timing_cache,
                    progress=progress,
                    timing_cache_out=timing_cache_out,
                )
            )
            progress.note(f"{plan.name} ({plan.stat().st_size / 2**20:.1f} MiB)")
    if not verify:
        return None
    with progress("checking the engine against onnxruntime on the sample text"):
        figures = verify_engine(plan, artifact, manifest)
        progress.note(json.dumps({n: round(o["max_abs_diff"], 5) for n, o in figures["outputs"].items()}))
    if not figures["passed"]:
        raise ResultError(
            "TensorRT engine out of tolerance vs onnxruntime, so nothing was published: "
            + "; ".join(figures["problems"])
        )
    return figures


def cli(argv=None) -> int:
    return run(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
