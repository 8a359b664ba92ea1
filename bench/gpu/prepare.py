"""Prepare the GPU benchmark's bundle on a machine with the data and a package index: what a CUDA machine
without registry access needs besides the checkout, in one folder to copy there.

    python -m bench.gpu.prepare                 # writes .gpu-kit/ (git-ignored)
    python -m bench.gpu.prepare --target-packages gpu-freeze.txt --backbone DIR
    python -m bench.gpu.prepare --tiny --no-wheels --out /tmp/kit    # the dry run's small bundle (tests)

The folder holds:
- data.tar.xz: SST-2 train/dev, CoNLL-2003 train/valid, the SQuAD v1.1 train parts (the demo recipe's
  data, which is not part of the checkout);
- squad_windows.json: the (question tokens, window tokens) of real SQuAD windows, encoded by the
  serving QA codec (384 tokens, stride 128, question <= 64), for the model-level benchmark;
- wheels/: the serving stack's wheels (for --python-version) that the GPU machine's Python lacks (fastapi,
  uvicorn, pydantic, ...: the `serve` extra's closure, minus the packages it already has);
- backbone/ (with --backbone): the checkpoint the demo step fine-tunes (all-MiniLM-L6-v2);
- manifest.json: every file's size and sha256.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data"
# The Python packages of a CUDA image with torch, transformers and JAX (the machine the bundle was first made
# for), used when --target-packages does not list the GPU machine's own: never bundled. Names normalised
# (lower case, '-').
GPU_IMAGE = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp""".split()
)
# Bundled although the image has one: pydantic needs a recent typing-extensions, and a newer one is safe.
ALWAYS_BUNDLE = {"typing-extensions"}
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
]
SQUAD_WINDOW = {"max_length": 384, "doc_stride": 128, "max_query_length": 64}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------- wheels


def serve_requirements() -> list[str]:
    """The core dependencies and the `serve` extra, as pyproject.toml declares them."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project.get("dependencies", [])) + list(project["optional-dependencies"]["serve"])


def closure(requirements: list[str], python: str = "3.12") -> dict[str, str]:
    """name -> installed version for every requirement and what it needs (markers for Linux, `python`),
    read from this environment's installed metadata."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = dict(
        default_environment(),
        python_version=python,
        python_full_version=f"{python}.0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        implementation_name="cpython",
    )
    found: dict[str, str] = {}
    todo = [(Requirement(r), ()) for r in requirements]
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate(dict(env, extra=e)) for e in (extras or ("",))):
            continue
        name = normalise(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"prepare: {req.name} is not installed here; run `make setup-dev` first") from None
        key = (name, tuple(sorted(req.extras)))
        if key in found:
            continue
        found[key] = dist.version
        for sub in dist.requires or []:
            todo.append((Requirement(sub), tuple(sorted(req.extras))))
    versions: dict[str, str] = {}
    for (name, _), version in found.items():
        versions[name] = version
    return versions


def target_packages(path: str | None) -> set[str]:
    """The GPU machine's packages: `pip list --format=freeze` (or `pip freeze`) output from there, else GPU_IMAGE."""
    if not path:
        return GPU_IMAGE
    names = (re.split(r"[=<>~!@ ;\[]", line.strip(), maxsplit=1)[0] for line in Path(path).read_text().splitlines())
    return {normalise(n) for n in names if n and not n.startswith("#")}


def download_wheels(out: Path, versions: dict[str, str], have: set[str], python: str = "3.12") -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    wanted = {n: v for n, v in versions.items() if n not in have or n in ALWAYS_BUNDLE}
    for name, version in sorted(wanted.items()):
        if any(normalise(p.name.split("-")[0]) == name for p in out.glob("*.whl")):
            continue
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python,
            "--implementation",
            "cp",
            "-d",
            str(out),
            "--disable-pip-version-check",
            "-q",
        ]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        print(f"prepare: wheel {name}=={version}", flush=True)
        subprocess.run(cmd + [f"{name}=={version}"], check=True)
    return sorted(p.name for p in out.glob("*.whl"))


# ----------------------------------------------------------------------------- data


def data_members(data: Path, tiny: bool) -> dict[str, bytes]:
    """Archive name -> bytes: the files the demo recipe and the benchmarks read (small subsets with `tiny`)."""
    files = {
        name: (data / name).read_bytes()
        for name in ("SST-2/train.tsv", "SST-2/dev.tsv", "conll2003/train.txt", "conll2003/valid.txt")
    }
    squad = sorted((data / "squad-train").glob("train-v1.1.part-*.json.gz"))
    if not tiny:
        for path in squad:
            files[f"squad-train/{path.name}"] = path.read_bytes()
        return files
    for name in ("SST-2/train.tsv", "SST-2/dev.tsv"):
        files[name] = b"".join(files[name].splitlines(keepends=True)[:201])
    for name in ("conll2003/train.txt", "conll2003/valid.txt"):
        files[name] = b"\n\n".join(files[name].split(b"\n\n")[:120]) + b"\n"
    with gzip.open(squad[-1], "rt", encoding="utf-8") as f:
        blob = json.load(f)
    blob["data"] = [dict(a, paragraphs=a["paragraphs"][:3]) for a in blob["data"][-3:]]
    files["squad-train/train-v1.1.part-04.json.gz"] = gzip.compress(json.dumps(blob).encode(), mtime=0)
    return files


def write_data_archive(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:xz", preset=6) as tar:
        for name, payload in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(payload), 0, 0o644
            tar.addfile(info, io.BytesIO(payload))


def squad_windows(data: Path, tokenizer_dir: Path, questions: int, seed: int, tiny: bool) -> dict:
    """(question tokens, window tokens) for every window of a seeded sample of SQuAD questions, encoded
    as the server encodes /qa requests; questions in sample order, each one's windows together."""
    from bert.tasks import qa as qa_codec
    from bert.tokenizer import BertTokenizer
    from training.data.readers import read_squad_articles, squad_examples

    paths = sorted((data / "squad-train").glob("train-v1.1.part-*.json.gz"))
    examples = squad_examples(read_squad_articles(paths[-1:] if tiny else paths))
    sample = random.Random(seed).sample(examples, min(questions, len(examples)))
    tokenizer = BertTokenizer.from_dir(tokenizer_dir)
    windows = []
    for example in sample:
        for window in qa_codec.encode(tokenizer, example.question, example.context, **SQUAD_WINDOW):
            question = window.token_type_ids.index(1) if 1 in window.token_type_ids else len(window)
            windows.append([question, len(window)])
    lengths = [w[1] for w in windows]
    return {
        "source": "SQuAD v1.1 train (shared/data/squad-train), seeded sample of questions",
        "seed": seed,
        "questions": len(sample),
        **SQUAD_WINDOW,
        "mean_length": sum(lengths) / len(lengths),
        "share_full": sum(n == 384 for n in lengths) / len(lengths),
        "columns": ["segment_a_tokens", "window_tokens"],
        "windows": windows,
    }


# ----------------------------------------------------------------------------- manifest


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / ".gpu-kit"), help="the bundle folder (default .gpu-kit, git-ignored)")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="shared/data with SST-2, conll2003, squad-train")
    p.add_argument("--tiny", action="store_true", help="small data subsets and a few windows (the dry run's kit)")
    p.add_argument("--no-wheels", action="store_true", help="skip downloading wheels (the dry run needs none)")
    p.add_argument("--questions", type=int, default=3000, help="SQuAD questions whose windows are measured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target-packages",
        help="the GPU machine's `pip list --format=freeze`: bundle wheels only for "
        "what it lacks (default: a CUDA image with torch and transformers)",
    )
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (major.minor), for wheels")
    p.add_argument("--backbone", help="a checkpoint dir (e.g. all-MiniLM-L6-v2) the demo step fine-tunes there")
    args = p.parse_args(argv)

    started = time.time()
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    if not (data / "SST-2" / "train.tsv").is_file():
        raise SystemExit(f"prepare: no data at {data} (--data)")
    write_data_archive(out / "data.tar.xz", data_members(data, args.tiny))
    windows = squad_windows(
        data, REPO / "serving" / "demo_model", 40 if args.tiny else args.questions, args.seed, args.tiny
    )
    (out / "squad_windows.json").write_text(json.dumps(windows, separators=(",", ":")) + "\n")
    wheels = (
        []
        if args.no_wheels
        else download_wheels(
            out / "wheels",
            closure(serve_requirements(), args.python_version),
            target_packages(args.target_packages),
            args.python_version,
        )
    )
    if args.backbone:
        if not (Path(args.backbone) / "config.json").is_file():
            raise SystemExit(f"prepare: {args.backbone} holds no config.json (--backbone)")
        shutil.rmtree(out / "backbone", ignore_errors=True)
        shutil.copytree(args.backbone, out / "backbone", symlinks=False)

    kit_bytes = folder_bytes(out)
    files = {
        str(f.relative_to(out)): {"bytes": f.stat().st_size, "sha256": sha256(f)}
        for f in sorted(out.rglob("*"))
        if f.is_file() and f.name != "manifest.json"
    }
    manifest = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tiny": args.tiny,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "files": files,
        "wheels": wheels,
        "squad_windows": {k: windows[k] for k in ("questions", "mean_length", "share_full")},
        "kit_mib": round(kit_bytes / 2**20, 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(
        f"prepare: {out}: {kit_bytes / 2**20:.1f} MiB ({len(wheels)} wheels, {len(windows['windows'])} SQuAD "
        f"windows, mean {windows['mean_length']:.0f} tokens); {time.time() - started:.0f} s. Copy it, with the "
        "checkout, to the GPU machine (bench/gpu/README.md)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
