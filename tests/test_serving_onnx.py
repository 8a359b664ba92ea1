"""The onnxruntime backend serves an exported artifact in a process where `import torch` fails,
and answers as the torch model does; the tensorrt backend without tensorrt is one clear error."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import httpx
import pytest
from test_serving_api import assert_close
from test_serving_support import QA_ITEMS, REPO, TEXTS, Server, build_checkpoint, export_artifact

# Runs `python -m serving` with an import hook that makes every torch import fail (and say so in the log).
NO_TORCH = r"""
import importlib.abc, runpy, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            print(f"TORCH IMPORT ATTEMPTED: {name}", file=sys.stderr, flush=True)
            raise ImportError(f"torch is blocked in this process ({name})")
sys.meta_path.insert(0, NoTorch())
sys.modules.pop("torch", None)
sys.argv[0] = "serving"
runpy.run_module("serving", run_name="__main__", alter_sys=True)
"""


class NoTorchServer(Server):
    def __init__(self, *args):
        super().__init__(*args, python_args=("-c", NO_TORCH))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    checkpoint = build_checkpoint(root / "multi")
    return checkpoint, export_artifact(checkpoint, root / "artifact")


def torch_reference(checkpoint):
    """Answers computed in this process with the torch model and the same codecs."""
    import torch

    from bert.checkpoint import load_checkpoint
    from bert.tasks import classify, pad_batch
    from bert.tokenizer import BertTokenizer

    model, _ = load_checkpoint(checkpoint)
    tokenizer = BertTokenizer.from_dir(checkpoint)
    features = classify.encode(tokenizer, TEXTS)
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in pad_batch(features).items()})
    return classify.decode(out.classify_logits.numpy(), {0: "negative", 1: "positive"}, top_k=None)


def test_onnx_artifact_served_without_torch(artifact):
    checkpoint, directory = artifact
    with NoTorchServer("--model", str(directory), "--max-wait-ms", "10") as server:
        url = server.url
        info = httpx.get(url + "/info").json()
        assert info["backend"] == "onnxruntime" and info["tasks"] == ["classify", "ner", "qa", "embed"]
        singles = [httpx.post(url + "/classify", json={"inputs": t, "top_k": None}).json() for t in TEXTS]
        assert_close(singles, torch_reference(checkpoint), tol=1e-4)
        ner_single = [httpx.post(url + "/ner", json={"inputs": t}).json() for t in TEXTS]
        qa_single = [httpx.post(url + "/qa", json=item).json() for item in QA_ITEMS]

        async def load():
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                return await asyncio.gather(
                    c.post("/classify", json={"inputs": TEXTS, "top_k": None}),
                    c.post("/ner", json={"inputs": TEXTS}),
                    c.post("/qa", json=QA_ITEMS),
                    *(c.post("/ner", json={"inputs": t}) for t in TEXTS),
                )

        batched = asyncio.run(load())
        assert all(r.status_code == 200 for r in batched)
        assert_close(batched[0].json(), singles)
        assert_close(batched[1].json(), ner_single)
        assert_close(batched[2].json(), qa_single)
        assert_close([r.json() for r in batched[3:]], ner_single)
        log = server.log()
    assert "TORCH IMPORT ATTEMPTED" not in log, log
    assert server.process.returncode == 0


def test_blocker_really_blocks_torch(artifact):
    # the same wrapper around a checkpoint (torch backend) must fail: proof that the hook works
    checkpoint, _ = artifact
    run = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "--model", str(checkpoint), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode != 0
    assert "TORCH IMPORT ATTEMPTED" in run.stderr


def test_tensorrt_backend_without_tensorrt_is_a_clear_error(artifact, tmp_path):
    _, directory = artifact
    try:
        import tensorrt  # noqa: F401

        pytest.skip("tensorrt is installed here")
    except ImportError:
        pass
    run = subprocess.run(
        [sys.executable, "-m", "serving", "--model", str(directory), "--backend", "tensorrt", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "tensorrt" in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_missing_demo_model_is_one_clear_line(tmp_path):
    """A build without serving/demo_model/ (the product's packages copied without it, as a wheel built without the
    weights would hold them): `python -m serving` with no --model says so in one line and exits 2."""
    for package in REPO.iterdir():
        if (package / "__init__.py").is_file():
            ignore = shutil.ignore_patterns("demo_model", "__pycache__")
            shutil.copytree(package, tmp_path / package.name, ignore=ignore)
    assert (tmp_path / "serving" / "settings.py").is_file() and not (tmp_path / "serving" / "demo_model").exists()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "serving"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        'error: the built-in demo model is not in this build (serving/demo_model/, see the README\'s "Demo model"); pass --model PATH'
    ]
