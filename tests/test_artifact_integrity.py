"""Artifacts survive any kill, a full disk leaves nothing behind, and the server serves an artifact directory only
as its manifest describes it.

- `python -m export.onnx` SIGKILLed over an existing artifact at 11 moments (each run a process of its own, forked
  from one that has imported torch and onnxruntime: tests/forkserver.py): the directory then serves the
  complete old artifact or the complete new one (labels and logits of each), never a mix.
- A full disk (a small tmpfs): one `error:` line naming the path and the reason, exit 2, nothing left behind,
  the previous artifact untouched.
- A missing, older or non-matching manifest: one line and exit 2 at startup; `--allow-unverified` serves it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from forkserver import Lazy  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "the film was good bad great awful slow quick plot acting story music long short funny dull "
    "i loved hated it a an and but not very really simply boring beautiful"
).split()
TEXTS = [
    "the film was good",
    "i hated it",
    "a very long and boring story",
    "the acting was simply great",
    "not funny but beautiful music",
    "quick",
]
OLD_LABELS, NEW_LABELS = ["A", "B"], ["X", "Y"]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}


def make_checkpoint(directory: Path, labels: list[str], seed: int) -> Path:
    """A tiny classifier (hidden 32, 2 layers) with a 128-token vocabulary: its artifact is about 150 KB."""
    from bert.checkpoint import init_model, save_checkpoint
    from bert.config import BertConfig

    vocab_dir = directory.parent / f"{directory.name}-vocab"
    vocab_dir.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"[unused{i}]" for i in range(128 - len(vocab))]  # the server's warm-up sends ids up to 102
    (vocab_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (vocab_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        task="classify",
        id2label=dict(enumerate(labels)),
    )
    save_checkpoint(init_model(config, seed=seed), directory, tokenizer=vocab_dir)
    return directory


# What an export imports before it writes anything, imported once by the fork server its runs here come from
# (tests/forkserver.py): each is a real process, killed by a real SIGKILL. The product's export modules are not
# among them: tests/export_pausing.py wraps export.manifest's functions before the exporter imports them.
EXPORT_IMPORTS = ["torch", "onnx", "onnxruntime", "onnxruntime.transformers.optimizer", "safetensors.torch"]
forks = Lazy(EXPORT_IMPORTS, lambda: env())
_close_forks = forks.fixture()


def export(checkpoint: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = ["-m", "export.onnx", "--ckpt", str(checkpoint), "--out", str(out), *extra]
    child = forks().start(argv, env=env(), stderr=subprocess.PIPE)
    _, stderr = child.communicate(300)
    return subprocess.CompletedProcess([sys.executable, *argv], child.returncode, "", stderr)


def served(path: Path, **settings) -> tuple[list[str], np.ndarray] | str:
    """What the server loads from `path` (the same steps: resolve, spec, manifest check, tokenizer, onnxruntime):
    (labels, logits) for TEXTS, or the one-line reason it refuses to start."""
    from bert.errors import one_line
    from serving.engine import Engine
    from serving.settings import Settings

    engine = Engine(Settings(model=str(path), threads=1, **settings))
    try:
        engine.load()
    except Exception as e:  # noqa: BLE001 - serving's main turns any load failure into one line and exit 2
        return one_line(e)
    unit = engine.units[0]
    ids = [e.ids for e in unit.tokenizer.encode_batch(TEXTS)]
    width = max(map(len, ids))
    batch = np.zeros((len(ids), width), dtype=np.int64)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = seq
    logits = unit.backend.run(
        {"input_ids": batch, "attention_mask": (batch != 0).astype(np.int64), "token_type_ids": np.zeros_like(batch)}
    )["classify"]
    id2label = unit.spec.labels["classify"]
    return [id2label[i] for i in logits.argmax(-1)], logits


def outcome(result, old, new) -> str:
    """old | new | refused | mix: which complete artifact `result` is, comparing labels and logits."""
    if isinstance(result, str):
        assert "\n" not in result
        return "refused"
    for name, (labels, logits) in (("old", old), ("new", new)):
        if result[0] == labels and np.allclose(result[1], logits, atol=1e-5):
            return name
    return "mix"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    old_ckpt = make_checkpoint(root / "old-ckpt", OLD_LABELS, seed=1)
    new_ckpt = make_checkpoint(root / "new-ckpt", NEW_LABELS, seed=2)
    for checkpoint, out in ((old_ckpt, root / "old-artifact"), (new_ckpt, root / "new-artifact")):
        run = export(checkpoint, out)
        assert run.returncode == 0, run.stderr
    old, new = served(root / "old-artifact"), served(root / "new-artifact")
    assert old[0] != new[0] and set(old[0]) <= set(OLD_LABELS) and set(new[0]) <= set(NEW_LABELS)
    return {
        "new_ckpt": new_ckpt,
        "old_artifact": root / "old-artifact",
        "new_artifact": root / "new-artifact",
        "old": old,
        "new": new,
    }


# ----------------------------------------------------------------------------- the server checks the manifest


def serve_main(directory: Path, *extra: str) -> int:
    from serving.__main__ import main

    return main(["--model", str(directory), "--port", "0", "--log-level", "warning", "--threads", "1", *extra])


@pytest.fixture
def no_server(monkeypatch):
    """In-process runs must stop at loading: reaching the app factory means the directory was accepted."""

    def refuse(*args, **kwargs):
        raise AssertionError("the directory was accepted: the server would start")

    monkeypatch.setattr("serving.app.create_app", refuse)


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def drop_files_from_manifest(directory: Path) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    del manifest["files"]
    (directory / "manifest.json").write_text(json.dumps(manifest))


def add_tokenizer_json(directory: Path) -> None:
    """A valid tokenizer.json (which the server would read instead of vocab.txt) that export did not write."""
    from bert.tokenizer import BertTokenizer

    BertTokenizer.from_vocab(directory / "vocab.txt", do_lower_case=False).backend.save(
        str(directory / "tokenizer.json")
    )


TAMPERED = {
    "no-manifest": (lambda d: (d / "manifest.json").unlink(), r"holds model\.onnx but no manifest\.json"),
    "manifest-without-files": (drop_files_from_manifest, r"manifest\.json lists no size and sha256"),
    "graph-same-size-other-bytes": (
        lambda d: flip_last_byte(d / "model.onnx"),
        r"model\.onnx has another sha256 than the manifest says",
    ),
    "config-edited": (
        lambda d: (d / "config.json").write_text((d / "config.json").read_text() + " "),
        r"config\.json has \d+ bytes, the manifest says \d+",
    ),
    "graph-from-another-export": (None, r"model\.onnx has"),  # the new graph beside the old config
    "tokenizer-file-added": (lambda d: add_tokenizer_json(d), r"tokenizer\.json is not listed"),
    "tokenizer-file-removed": (lambda d: (d / "vocab.txt").unlink(), r"vocab\.txt is listed but missing"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_server_refuses_an_artifact_its_manifest_does_not_describe(case, sources, tmp_path, capsys, no_server):
    directory = tmp_path / "artifact"
    shutil.copytree(sources["old_artifact"], directory)
    spoil, problem = TAMPERED[case]
    if spoil is None:
        shutil.copyfile(sources["new_artifact"] / "model.onnx", directory / "model.onnx")
    else:
        spoil(directory)
    assert serve_main(directory) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert str(directory) in lines[0] and "--allow-unverified" in lines[0]
    assert re.search(problem, lines[0]), lines[0]
    if case in ("no-manifest", "config-edited", "graph-from-another-export"):
        # Told explicitly, the server loads it as it is (the graph-from-another-export mix: old labels, new logits).
        result = served(directory, allow_unverified=True)
        assert not isinstance(result, str), result


def test_the_command_line_refuses_in_one_line_and_serves_with_the_flag_or_env(sources, tmp_path):
    """As a user runs it: a real `python -m serving` refuses a tampered artifact with one line and exit 2 at
    startup, and serves it (answers /classify) with --allow-unverified, or BERTSERVE_ALLOW_UNVERIFIED=1."""
    import httpx
    from test_serving_support import Server

    directory = tmp_path / "artifact"
    shutil.copytree(sources["old_artifact"], directory)
    (directory / "manifest.json").unlink()
    run = subprocess.run(
        [sys.executable, "-m", "serving", "--model", str(directory), "--port", "0"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"error: {directory} holds model.onnx but no manifest.json")
    for server in (
        Server("--model", str(directory), "--allow-unverified"),
        Server("--model", str(directory), env={"BERTSERVE_ALLOW_UNVERIFIED": "1"}),
    ):
        with server:
            answer = httpx.post(server.url + "/classify", json={"inputs": TEXTS}, timeout=30).json()
        assert [a[0]["label"] for a in answer] == sources["old"][0]


def test_a_published_artifact_is_verified_and_readable_by_others(sources):
    """The control for the refusals: the export as written passes the check, and its directory has the mode
    mkdir gives (not a temporary directory's 0700, which would hide it from a server running as another user)."""
    assert not isinstance(served(sources["old_artifact"]), str)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(sources["old_artifact"].stat().st_mode) == 0o777 & ~umask


def test_export_refuses_to_replace_a_directory_that_is_not_an_artifact(sources, tmp_path):
    """--out is replaced whole: a directory holding other files is refused before any work."""
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    run = export(sources["new_ckpt"], precious)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        f"error: --out {precious} is not empty and not an artifact directory; the export replaces --out whole, "
        "so give a new directory or an artifact's"
    ]
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]
    # a file named manifest.json does not make a directory an artifact's: it must read as one
    (precious / "manifest.json").write_text("{}")
    run = export(sources["new_ckpt"], precious)
    assert run.returncode == 2 and "is not empty and not an artifact directory" in run.stderr, run.stderr
    assert sorted(p.name for p in precious.iterdir()) == ["manifest.json", "notes.txt"]
    # nor does a real artifact's manifest next to files the artifact does not list
    shutil.copytree(sources["old_artifact"], precious, dirs_exist_ok=True)
    run = export(sources["new_ckpt"], precious)
    assert run.returncode == 2 and "(it holds notes.txt)" in run.stderr, run.stderr
    assert (precious / "notes.txt").read_text() == "keep me"


def test_an_export_that_fails_its_parity_check_publishes_nothing(sources, tmp_path):
    """Verified means published: out of tolerance (an impossible --atol here), exit 1 and the old artifact stays."""
    out = tmp_path / "artifact"
    shutil.copytree(sources["old_artifact"], out)
    run = export(sources["new_ckpt"], out, "--atol", "1e-30")
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 1 and len(errors) == 1, run.stderr
    assert errors[0].startswith(f"error: parity out of tolerance, so nothing was published at {out}")
    assert outcome(served(out), sources["old"], sources["new"]) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


# ----------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root and mount(2) needed), unmounted afterwards."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small file system for the full-disk test")
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if run.returncode != 0:
        pytest.skip(f"cannot mount a 4 MiB tmpfs here (needs root / CAP_SYS_ADMIN): {run.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_is_one_line_exit_2_and_leaves_nothing(sources, small_disk):
    """The old artifact sits on a nearly full disk; exporting the new one over it runs out of space: one line
    naming the path and the reason, exit 2, no partial file left, the old artifact served as before."""
    out = small_disk / "artifact"
    shutil.copytree(sources["old_artifact"], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 64 * 1024))  # room for the config and tokenizer, not for the graphs
    run = export(sources["new_ckpt"], out)
    lines = [line for line in run.stderr.splitlines() if not line.startswith(("[", "      "))]  # progress lines
    print("full disk:", lines)
    assert run.returncode == 2, run.stderr
    assert lines == [lines[0]] and lines[0].startswith("error: ") and "Traceback" not in run.stderr
    assert str(out) in lines[0] and "no space left on the device" in lines[0]
    assert sorted(p.name for p in small_disk.iterdir()) == ["artifact", "filler"]  # no temporary sibling
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert outcome(served(out), sources["old"], sources["new"]) == "old"


# ----------------------------------------------------------------------------- kills


PHASES = ("manifest-written", "before-swap", "renamed-old", "renamed-new", "removing-old")
EXPECTED = {
    "manifest-written": "old",
    "before-swap": "old",
    "renamed-old": "old",
    "renamed-new": "new",
    "removing-old": "new",
}


class Export:
    """`python -m export.onnx` (or tests/export_pausing.py) in the background, its stderr lines timestamped."""

    def __init__(self, command: list[str]):
        self.started = time.monotonic()
        self.process = forks().start(command[1:], env=env(), stderr=subprocess.PIPE)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append((time.monotonic() - self.started, line.rstrip()))

    def wait_for(self, prefix: str, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith(prefix) for _, line in self.lines):
                return True
            if self.process.poll() is not None:
                self.reader.join(5)
                return any(line.startswith(prefix) for _, line in self.lines)
            time.sleep(0.005)
        return False

    def kill(self) -> int:
        self.process.send_signal(signal.SIGKILL)
        return self.process.wait(30)


def reset(out: Path, old_artifact: Path) -> None:
    """The old artifact at `out`; temporary siblings of killed runs stay (the next export removes them)."""
    for path in (out, out.with_name(out.name + ".old")):
        shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(old_artifact, out)


def kill_at(kind: str, when, checkpoint: Path, out: Path) -> Export | None:
    """Start an export of `checkpoint` over `out` and SIGKILL it at a named phase, `when` seconds after its start
    ("whole run") or after the portable graph's export began ("writing"). None if it finished before."""
    if kind == "phase":
        run = Export(
            [
                sys.executable,
                str(REPO / "tests" / "export_pausing.py"),
                when,
                "--ckpt",
                str(checkpoint),
                "--out",
                str(out),
            ]
        )
        assert run.wait_for(f"PAUSED {when}"), run.lines
    else:
        run = Export([sys.executable, "-m", "export.onnx", "--ckpt", str(checkpoint), "--out", str(out)])
        if kind == "writing":
            assert run.wait_for("[3/8] exporting the portable graph"), run.lines
            time.sleep(when)
        else:
            time.sleep(max(0.0, when - (time.monotonic() - run.started)))
    finished = run.process.poll() is not None
    run.kill()
    return None if finished else run


@pytest.mark.slow
def test_export_killed_at_any_moment_leaves_the_old_artifact_or_the_new_one(sources, tmp_path):
    """11 SIGKILLs of a running export over an existing artifact: 5 at named phases of the publish, 2 spread over
    the whole run, 4 spread over the writing steps (from the portable graph's export to the end). After each, the
    directory is loaded as the server loads it: it answers as the old artifact or as the new one."""
    old, new = sources["old"], sources["new"]
    out = tmp_path / "artifact"
    counts: dict[str, int] = {"old": 0, "new": 0, "refused": 0, "mix": 0}
    moments = []

    # Where the writing starts in an uninterrupted run: the kills below are spread from there to its end.
    reset(out, sources["old_artifact"])
    probe = Export([sys.executable, "-m", "export.onnx", "--ckpt", str(sources["new_ckpt"]), "--out", str(out)])
    assert probe.process.wait(120) == 0
    probe.reader.join(5)
    total = time.monotonic() - probe.started
    writing = next(t for t, line in probe.lines if line.startswith("[3/8] exporting the portable graph"))
    assert outcome(served(out), old, new) == "new"

    plan = [("phase", phase) for phase in PHASES]
    plan += [("whole run", total * (i + 0.5) / 2) for i in range(2)]
    plan += [("writing", (total - writing) * i / 4) for i in range(4)]
    for kind, when in plan:
        for _ in range(4):  # a run faster than the probe may finish first: that is no kill, try earlier
            reset(out, sources["old_artifact"])
            run = kill_at(kind, when, sources["new_ckpt"], out)
            if run is not None:
                break
            when *= 0.7
        assert run is not None, f"{kind} {when}: the export always finished before the kill"
        result = outcome(served(out), old, new)
        counts[result] += 1
        moments.append(f"{kind} {when if kind == 'phase' else f'{when:.2f}s'}: {result}")
        if kind == "phase":
            assert result == EXPECTED[when], moments[-1]
    print(f"\nexport run {total:.1f} s (writing from {writing:.1f} s); {len(plan)} kills: {counts}")
    print("\n".join(moments))
    assert len(plan) == 11 and counts["mix"] == 0 and counts["refused"] == 0, moments
    assert counts["old"] >= len(PHASES) - 2 and counts["new"] >= 2

    # After all those kills, one uninterrupted export publishes the new artifact and removes every leftover.
    reset(out, sources["old_artifact"])
    assert export(sources["new_ckpt"], out).returncode == 0
    assert outcome(served(out), old, new) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


# ----------------------------------------------------------------------------- export.tensorrt's publishing


def test_tensorrt_engine_is_added_to_the_artifact_whole_or_not_at_all(sources, tmp_path, monkeypatch, capsys):
    """How export.tensorrt publishes, with TensorRT's build replaced (no TensorRT or GPU here; tests/
    test_export_tensorrt.py builds real engines where there are): the plan and its manifest entry appear together
    in a copy of the artifact that replaces it, which the server's check accepts; a failed build changes nothing."""
    from export import tensorrt
    from export.cli import ResultError
    from runtime.artifact import verify_artifact
    from runtime.model_dir import read_model_spec

    artifact = tmp_path / "artifact"
    shutil.copytree(sources["old_artifact"], artifact)
    before = {p.name: p.read_bytes() for p in artifact.iterdir()}
    monkeypatch.setattr(tensorrt, "import_tensorrt", lambda: type("trt", (), {"__version__": "stub"}))

    def failing_build(*args, **kwargs):
        raise ResultError("TensorRT failed to build the engine")

    monkeypatch.setattr(tensorrt, "build_engine", failing_build)
    assert tensorrt.cli(["--artifact", str(artifact), "--no-verify"]) == 1
    assert {p.name: p.read_bytes() for p in artifact.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]

    monkeypatch.setattr(tensorrt, "build_engine", lambda *args, **kwargs: b"engine bytes")
    assert tensorrt.cli(["--artifact", str(artifact), "--no-verify"]) == 0
    assert (artifact / "model.plan").read_bytes() == b"engine bytes"
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["files"]["plan"]["bytes"] == len(b"engine bytes") and manifest["tensorrt"]["version"] == "stub"
    assert {p.name: p.read_bytes() for p in artifact.iterdir() if p.name not in ("model.plan", "manifest.json")} == {
        k: v for k, v in before.items() if k != "manifest.json"
    }
    verify_artifact(read_model_spec(artifact))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]

    elsewhere = tmp_path / "engines" / "x.plan"
    (tmp_path / "engines").mkdir()
    assert tensorrt.cli(["--artifact", str(artifact), "--no-verify", "--out", str(elsewhere)]) == 0
    assert elsewhere.read_bytes() == b"engine bytes" and [p.name for p in elsewhere.parent.iterdir()] == ["x.plan"]
