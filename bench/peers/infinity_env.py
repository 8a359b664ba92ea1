"""infinity's own virtual environment, made by the bench (bench/.peers/infinity-venv, git-ignored).

    python -m bench.peers.infinity_env            # set it up (a few minutes, about 1.6 GB)
    python -m bench.peers.infinity_env --check    # say whether it is there

infinity-emb pins other library versions than bertserve (numpy < 2, transformers < 5, uvicorn 0.32),
so it gets a venv of its own. infinity-requirements.txt beside this file pins every package to the
versions this bench was run with (infinity-emb 0.0.78, optimum 2.1.0 + optimum-onnx 0.1.0,
sentence-transformers 3.4.1, transformers 4.57.6, onnxruntime 1.32.0, torch 2.13.0 CPU). torch is
installed first and alone, pinned: that version's CPU wheel is on this machine's disk, and any
other torch request would pull several GB of CUDA packages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import venv
from pathlib import Path

from bench.peers import WORK, PeerUnavailable

REQUIREMENTS = Path(__file__).with_name("infinity-requirements.txt")
TORCH = "torch==2.13.0"  # first, alone: the CPU wheel on disk (see the Makefile)
STAMP = ".bench-installed"  # holds the hash of the requirements it was made from


def venv_dir(work: Path) -> Path:
    return work / "infinity-venv"


def _wanted() -> str:
    return hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()


def is_ready(work: Path) -> bool:
    stamp = venv_dir(work) / STAMP
    return (
        stamp.is_file()
        and stamp.read_text().strip() == _wanted()
        and (venv_dir(work) / "bin" / "infinity_emb").is_file()
    )


def ensure(work: Path, setup: bool = True) -> Path:
    """The venv's directory, set up first when missing or made from other requirements (setup=True);
    PeerUnavailable naming the command to run when it is missing and setup is False or fails."""
    target = venv_dir(work)
    if is_ready(work):
        return target
    if not setup:
        raise PeerUnavailable(
            f"infinity's venv is not set up at {target}: run `python -m bench.peers.infinity_env` "
            "(or leave out --no-setup)"
        )
    log = work / "infinity-setup.log"
    work.mkdir(parents=True, exist_ok=True)
    print(f"setting up infinity's venv at {target} (a few minutes; log: {log})", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    with open(log, "w") as out:
        for step in ([TORCH], ["-r", str(REQUIREMENTS)]):
            print("$", " ".join(pip + step), file=out, flush=True)
            if subprocess.run(pip + step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text(errors="replace")[-1500:]
                raise PeerUnavailable(
                    f"setting up infinity's venv failed at `pip install {' '.join(step)}` (full log {log}):\n{tail}"
                )
    (target / STAMP).write_text(_wanted() + "\n")
    return target


def versions(work: Path) -> dict[str, str]:
    """Versions of the packages that decide infinity's speed, as installed in its venv."""
    code = (
        "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
        "('infinity_emb', 'optimum', 'optimum-onnx', 'onnxruntime', 'torch', 'transformers', "
        "'sentence-transformers', 'tokenizers', 'uvicorn', 'fastapi')}))"
    )
    run = subprocess.run([str(venv_dir(work) / "bin" / "python"), "-c", code], capture_output=True, text=True)
    return json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr[-500:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=WORK, help="where the venv goes (default: bench/.peers)")
    p.add_argument("--check", action="store_true", help="only say whether the venv is set up")
    args = p.parse_args(argv)
    if args.check:
        print(f"{venv_dir(args.work_dir)}: {'ready' if is_ready(args.work_dir) else 'not set up'}")
        return 0 if is_ready(args.work_dir) else 1
    try:
        print(ensure(args.work_dir))
    except PeerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(versions(args.work_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
