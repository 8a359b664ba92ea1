"""Hub model ids (`--model org/name[@revision]`, `--ckpt ...`, bert/hub.py), never against the real Hub.

A loopback stand-in implements the few endpoints huggingface_hub's snapshot_download calls (model info,
the file tree, HEAD/GET of /resolve/) and records every request; huggingface_hub downloads from it into a
temporary HF_HOME, which is then the cache the offline runs read (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from test_serving_support import CLS_LABELS, PYTHON, REPO, TEXTS, Server, build_checkpoint, free_port

MAIN = "a" * 40
V1 = "b" * 40
V1_LABELS = ["sad", "happy"]
# What a real repository holds beside what we read: none of it may be fetched.
FORBIDDEN = {
    "pytorch_model.bin": b"\x80\x02pickle",
    "model.onnx": b"onnx",
    "flax_model.msgpack": b"flax",
    "tf_model.h5": b"h5",
    "modeling_x.py": b"import os\n",
    "README.md": b"# tiny\n",
    "onnx/model.onnx": b"onnx",
    ".gitattributes": b"*.bin filter=lfs\n",
}


def checkpoint_files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


class StandInHub:
    """The Hub's model-info, tree and resolve endpoints over in-memory repositories:
    repos[repo_id] = {"refs": {name: commit}, "commits": {commit: {path: bytes}}}."""

    def __init__(self, repos: dict):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def fetched(self) -> set[str]:
        """The files whose contents were sent (GET of /resolve/)."""
        return {
            path.split("/resolve/", 1)[1].split("/", 1)[1]
            for method, path in self.requests
            if method == "GET" and "/resolve/" in path
        }

    def _commit(self, repo: dict, revision: str) -> str | None:
        revision = unquote(revision)
        return revision if revision in repo["commits"] else repo["refs"].get(revision)

    def handle(self, request: BaseHTTPRequestHandler, head: bool):
        path = urlsplit(request.path).path
        self.requests.append(("HEAD" if head else "GET", path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, kind, revision = "/".join(parts[2:4]), parts[4], parts[5]
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, kind, revision = "/".join(parts[:2]), "resolve", parts[3]
        else:
            return self.send(request, 404, {"error": "no such endpoint"}, head=head)
        repo = self.repos.get(repo_id)
        if repo is None:
            return self.send(request, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
        commit = self._commit(repo, revision)
        if commit is None:
            return self.send(request, 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}, head)
        files = repo["commits"][commit]
        if kind == "revision":
            return self.send(
                request,
                200,
                {"id": repo_id, "sha": commit, "private": False, "siblings": [{"rfilename": name} for name in files]},
                head=head,
            )
        if kind == "tree":
            return self.send(
                request,
                200,
                [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in files.items()
                ],
                head=head,
            )
        name = unquote("/".join(parts[4:]))
        if name not in files:
            return self.send(
                request,
                404,
                {"error": "Entry not found"},
                {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit},
                head,
            )
        data = files[name]
        request.send_response(200)
        for key, value in {
            "Content-Length": str(len(data)),
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "X-Repo-Commit": commit,
            "Content-Type": "application/octet-stream",
        }.items():
            request.send_header(key, value)
        request.end_headers()
        if not head:
            request.wfile.write(data)

    @staticmethod
    def send(request, status: int, body, headers: dict | None = None, head: bool = False):
        data = json.dumps(body).encode()
        request.send_response(status)
        for key, value in {
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            **(headers or {}),
        }.items():
            request.send_header(key, value)
        request.end_headers()
        if not head:
            request.wfile.write(data)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", task="classify")


@pytest.fixture(scope="module")
def hub(checkpoint):
    main = {**checkpoint_files(checkpoint), **FORBIDDEN}
    v1 = dict(main)
    config = json.loads(v1["config.json"])
    config["id2label"] = dict(enumerate(V1_LABELS))
    config["label2id"] = {label: i for i, label in enumerate(V1_LABELS)}
    v1["config.json"] = json.dumps(config).encode()
    remote = dict(main)
    remote["config.json"] = json.dumps({**config, "auto_map": {"AutoModel": "modeling_x.MyModel"}}).encode()
    pickle_only = {k: v for k, v in main.items() if not k.endswith(".safetensors")}
    code_only = {k: v for k, v in pickle_only.items() if k != "pytorch_model.bin"}
    stand_in = StandInHub(
        {
            "acme/tiny-sst2": {"refs": {"main": MAIN, "v1": V1}, "commits": {MAIN: main, V1: v1}},
            "acme/remote-code": {"refs": {"main": MAIN}, "commits": {MAIN: remote}},
            "acme/pickle-only": {"refs": {"main": MAIN}, "commits": {MAIN: pickle_only}},
            "acme/code-only": {"refs": {"main": MAIN}, "commits": {MAIN: code_only}},
        }
    )
    yield stand_in
    stand_in.close()


def hub_env(tmp: Path, endpoint: str, offline: bool = False) -> dict:
    env = {
        "HF_HOME": str(tmp / "hf"),
        "HF_ENDPOINT": endpoint,
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "1" if offline else "0",
    }
    return {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))} | env


def run(args: list[str], env: dict, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, *args], cwd=cwd, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=timeout
    )


def resolve(model_id: str, env: dict) -> subprocess.CompletedProcess:
    """bert.checkpoint.resolve_checkpoint in a fresh process (huggingface_hub reads its env at import)."""
    code = (
        "import sys; from bert.errors import run_cli; from bert.checkpoint import resolve_checkpoint; "
        "sys.exit(run_cli(lambda argv: print(resolve_checkpoint(argv[0])), sys.argv[1:]))"
    )
    return run(["-c", code, model_id], env)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def classify(url: str) -> list:
    response = httpx.post(url + "/classify", json={"inputs": TEXTS[:4], "top_k": 2}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


# ----------------------------------------------------------------------------- ids


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("acme/tiny-sst2", ("acme/tiny-sst2", None)),
        ("acme/tiny-sst2@v1", ("acme/tiny-sst2", "v1")),
        ("sentence-transformers/all-MiniLM-L6-v2@" + MAIN, ("sentence-transformers/all-MiniLM-L6-v2", MAIN)),
        ("acme/tiny@refs/pr/1", ("acme/tiny", "refs/pr/1")),
        ("tiny", None),
        ("./acme/tiny", None),
        ("/abs/acme", None),
        ("~/acme/tiny", None),
        ("a/b/c", None),
        ("acme/..", None),
        ("acme/tiny@", None),
        ("acme/ti ny", None),
    ],
)
def test_hub_id_syntax(name, parsed):
    from bert.hub import parse_id

    assert parse_id(name) == parsed


# ----------------------------------------------------------------------------- serving


def test_download_fetches_only_what_is_read(hub, checkpoint, tmp_path):
    from bert.hub import ALLOW_PATTERNS

    result = resolve("acme/tiny-sst2", hub_env(tmp_path, hub.url))
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.strip())
    fetched = hub.fetched()
    assert fetched == set(checkpoint_files(checkpoint)), fetched  # all of the model, nothing else
    assert all(any(fnmatch(name, p) for p in ALLOW_PATTERNS) for name in fetched)
    assert not fetched & set(FORBIDDEN)
    assert checkpoint_files(snapshot) == checkpoint_files(checkpoint)
    assert snapshot.name == MAIN and snapshot.is_relative_to(tmp_path / "hf" / "hub")


@pytest.mark.slow
def test_serve_a_hub_id_offline_from_the_cache(hub, checkpoint, tmp_path):
    """Served from the cache the stand-in filled, without one request, answering as its local directory does."""
    assert resolve("acme/tiny-sst2", hub_env(tmp_path, hub.url)).returncode == 0
    with Server("--model", str(checkpoint)) as local:
        expected = classify(local.url)
    assert {a["label"] for answer in expected for a in answer} == set(CLS_LABELS)
    requests = len(hub.requests)
    with Server("--model", "acme/tiny-sst2", env=hub_env(tmp_path, hub.url, offline=True)) as offline:
        assert classify(offline.url) == expected
        info = httpx.get(offline.url + "/info", timeout=10).json()
    assert len(hub.requests) == requests, hub.requests[requests:]  # offline: not one request
    assert MAIN in json.dumps(info)  # the cached snapshot of main


def test_revision_is_honoured(hub, tmp_path):
    env = hub_env(tmp_path, hub.url)
    main, v1 = resolve("acme/tiny-sst2", env), resolve("acme/tiny-sst2@v1", env)
    assert main.returncode == 0 and v1.returncode == 0, main.stderr + v1.stderr
    main_dir, v1_dir = Path(main.stdout.strip()), Path(v1.stdout.strip())
    assert (main_dir.name, v1_dir.name) == (MAIN, V1)
    assert list(json.loads((v1_dir / "config.json").read_text())["id2label"].values()) == V1_LABELS
    assert list(json.loads((main_dir / "config.json").read_text())["id2label"].values()) == CLS_LABELS
    # Offline, each revision comes from the cache, and one never downloaded is one line.
    offline = hub_env(tmp_path, hub.url, offline=True)
    assert Path(resolve("acme/tiny-sst2@v1", offline).stdout.strip()) == v1_dir
    assert Path(resolve("acme/tiny-sst2@" + V1, offline).stdout.strip()) == v1_dir
    assert_one_line_error(
        resolve("acme/tiny-sst2@v2", offline), "acme/tiny-sst2@v2", "HF_HUB_OFFLINE=1", "not in the cache"
    )


# ----------------------------------------------------------------------------- refused


def test_remote_code_is_refused_in_one_line(hub, tmp_path):
    result = run(
        ["-m", "serving", "--model", "acme/remote-code", "--port", str(free_port())], hub_env(tmp_path, hub.url)
    )
    assert_one_line_error(result, "acme/remote-code", "auto_map", "never runs downloaded code")
    assert not any(name.endswith(".py") for name in hub.fetched())
    assert_one_line_error(
        resolve("acme/code-only", hub_env(tmp_path, hub.url)),
        "acme/code-only",
        "modeling_x.py",
        "never runs downloaded code",
    )


def test_pickle_only_repository_is_refused_in_one_line(hub, tmp_path):
    result = run(
        ["-m", "export.onnx", "--ckpt", "acme/pickle-only", "--out", str(tmp_path / "artifact")],
        hub_env(tmp_path, hub.url),
    )
    assert_one_line_error(result, "acme/pickle-only", "pytorch_model.bin", "convert them to safetensors")
    assert "pytorch_model.bin" not in hub.fetched()
    assert not (tmp_path / "artifact").exists()


# ----------------------------------------------------------------------------- failures


def test_unknown_repository_revision_and_unreachable_hub_are_one_line(hub, tmp_path):
    env = hub_env(tmp_path, hub.url)
    assert_one_line_error(resolve("acme/nope", env), "'acme/nope'", "no repository acme/nope", "HF_TOKEN")
    assert_one_line_error(resolve("acme/tiny-sst2@nope", env), "acme/tiny-sst2", "no revision 'nope'")
    closed = f"http://127.0.0.1:{free_port()}"
    assert_one_line_error(
        resolve("acme/tiny-sst2", hub_env(tmp_path, closed)), "could not be reached", "HF_ENDPOINT", "acme/tiny-sst2"
    )
    assert_one_line_error(
        resolve("acme/tiny-sst2", hub_env(tmp_path / "empty", hub.url, offline=True)),
        "not in the cache",
        "HF_HUB_OFFLINE=1",
    )
    result = run(["-m", "serving", "--model", "acme/nope", "--port", str(free_port())], env)
    assert_one_line_error(result, "'acme/nope'", "no repository")


def test_without_huggingface_hub_an_id_says_what_to_install(monkeypatch, tmp_path):
    from bert.checkpoint import CheckpointError, resolve_checkpoint

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(CheckpointError, match="pip install huggingface_hub"):
        resolve_checkpoint("acme/tiny-sst2")


# ----------------------------------------------------------------------------- a local path wins


def test_local_directory_and_store_entry_win_over_an_id(checkpoint, monkeypatch, tmp_path):
    import shutil

    from bert import hub
    from bert.checkpoint import resolve_checkpoint
    from runtime.model_dir import resolve_model_path

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was consulted for a name that is a local directory")

    monkeypatch.setattr(hub, "resolve", no_hub)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERTSERVE_HOME", str(tmp_path / "home"))
    shutil.copytree(checkpoint, tmp_path / "home" / "checkpoints" / "acme" / "tiny-sst2")
    store_entry = tmp_path / "home" / "checkpoints" / "acme" / "tiny-sst2"
    assert resolve_checkpoint("acme/tiny-sst2") == store_entry
    shutil.copytree(checkpoint, tmp_path / "acme" / "tiny-sst2")
    assert resolve_checkpoint("acme/tiny-sst2") == Path("acme/tiny-sst2")
    assert resolve_model_path("acme/tiny-sst2") == (tmp_path / "acme" / "tiny-sst2").resolve()
    with pytest.raises(AssertionError, match="the Hub was consulted"):
        resolve_checkpoint("acme/other")  # the check above can fail
