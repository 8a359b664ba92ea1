"""Training checkpoints survive any kill and any full disk.

The real fine-tuning CLI runs in a process of its own (forked from one that has imported it: tests/forkserver.py)
and is SIGKILLed at 17 moments: at random times, and inside
each phase of a save (weights, optimizer, trainer state, manifest, between the two renames, before the
previous copy is removed; and the same for best/), reached through the BERTSERVE_PAUSE_AT hook. After every
kill it resumes with --resume run/last; at the end its weights, optimizer and best/ are bit for bit those of
an uninterrupted run of the same steps. Full disks are real small tmpfs mounts (root only; skipped elsewhere).
"""

from __future__ import annotations

import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from forkserver import Lazy

from bert.atomic import PAUSE_ENV, WriteError
from bert.checkpoint import MANIFEST_NAME, load_checkpoint, save_checkpoint, verify_manifest, write_manifest

REPO = Path(__file__).resolve().parents[1]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = "good great fun happy warm love nice fine best clever".split()
NEGATIVE = "bad awful boring sad cold hate poor dull worst silly".split()
FILLER = "the a film movie plot actor was is and it this very so quite rather story cast scene end music".split()
TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "model_type": "bert",
}
STEPS = 96
LAST_PHASES = ("weights", "optimizer", "state", "manifest", "publish", "cleanup")
BEST_PHASES = ("weights", "metrics", "publish", "cleanup")
RANDOM_KILLS = 3
# What a run of the fine-tuning CLI imports before its first step, imported once by the fork server.
FINETUNE_IMPORTS = ["torch", "training.finetune"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash-assets")
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("\n".join(SPECIAL + POSITIVE + NEGATIVE + FILLER) + "\n")
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (root / "tiny.json").write_text(json.dumps(TINY))
    rng = random.Random(0)

    def sentence(label):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 10))]
        for _ in range(2):
            words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        return " ".join(words)

    for name, n in (("train.tsv", 256), ("dev.tsv", 64)):
        rows = [(sentence(y), y) for y in (rng.randint(0, 1) for _ in range(n))]
        (root / name).write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return root


def finetune_args(assets, out, *extra) -> list[str]:
    return [
        "--task",
        "classify",
        "--init-preset",
        str(assets / "tiny.json"),
        "--tokenizer",
        str(assets / "tokenizer"),
        "--train-data",
        str(assets / "train.tsv"),
        "--eval-data",
        str(assets / "dev.tsv"),
        "--output-dir",
        str(out),
        "--batch-size",
        "16",
        "--max-seq-length",
        "32",
        "--learning-rate",
        "1e-3",
        "--max-steps",
        str(STEPS),
        "--eval-every",
        "4",
        "--save-every",
        "2",
        "--log-every",
        "1",
        "--no-progress",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--torch-threads",
        "1",
        *extra,
    ]


def cli_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != PAUSE_ENV}
    return dict(env, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)


# The fork server this module's runs of the fine-tuning CLI come from (tests/forkserver.py): each is a real process
# killed by a real SIGKILL, without importing torch and the trainer again each time.
forks = Lazy(FINETUNE_IMPORTS, lambda: cli_env())
_close_forks = forks.fixture()


def finetune(assets, out, *extra, env=None, timeout=120) -> subprocess.CompletedProcess:
    argv = ["-m", "training.finetune", *finetune_args(assets, out, *extra)]
    child = forks().start(argv, env=env or cli_env(), stderr=subprocess.PIPE)
    _, stderr = child.communicate(timeout)
    return subprocess.CompletedProcess([sys.executable, *argv], child.returncode, "", stderr)


class Run:
    """The fine-tuning CLI in a subprocess, its stderr read line by line as it comes."""

    def __init__(self, assets, out, *extra, pause_at: str | None = None):
        env = cli_env(**({PAUSE_ENV: pause_at} if pause_at else {}))
        argv = ["-m", "training.finetune", *finetune_args(assets, out, *extra)]
        self.proc = forks().start(argv, env=env, stderr=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, prefix: str, timeout: float = 60.0) -> bool:
        """True once a stderr line starts with `prefix`; False if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                return False
            self.seen.append(line)
            if line.startswith(prefix):
                return True
        raise AssertionError(f"no {prefix!r} within {timeout} s; stderr: {self.seen[-5:]}")

    def kill(self) -> bool:
        """SIGKILL; False if the process had already exited on its own."""
        alive = self.proc.poll() is None
        if alive:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        return alive

    def rest(self) -> list[str]:
        self.proc.wait(timeout=120)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return self.seen


def published(path: Path) -> Path | None:
    """What a reader finds at `path` without changing anything: the directory, or its previous copy after a
    kill between the two renames of a publish."""
    for candidate in (path, path.with_name(path.name + ".old")):
        if candidate.is_dir():
            return candidate
    return None


def check_published(out: Path) -> tuple[int | None, int | None]:
    """Whatever a kill left: last/ holds weights, optimizer and state of one step (its manifest verifies),
    and best/ loads with the metrics of its own step. Returns (last step, best step)."""
    last_step = best_step = None
    last = published(out / "last")
    if last is not None:
        manifest = verify_manifest(last)
        state = json.loads((last / "trainer_state.json").read_text())
        assert manifest["step"] == state["step"]
        last_step = state["step"]
    best = published(out / "best")
    if best is not None:
        manifest = verify_manifest(best)
        load_checkpoint(best)
        assert json.loads((best / "metrics.json").read_text())["step"] == manifest["step"]
        best_step = manifest["step"]
    return last_step, best_step


def last_losses(out: Path) -> dict[int, float]:
    """The loss of every step as the run that finally kept it logged it (a replayed step logs again)."""
    losses = {}
    for line in (out / "log.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            losses[record["step"]] = record["loss"]
    return losses


def optimizer_tensors(directory: Path) -> list:
    import torch

    state = torch.load(directory / "optimizer.pt", weights_only=True)["optimizer"]["state"]
    return [(k, name, tensor) for k, entry in sorted(state.items()) for name, tensor in sorted(entry.items())]


@pytest.mark.slow
def test_kill_9_in_every_save_phase_and_at_random_and_resume_ends_bit_exact(assets, tmp_path):
    import torch

    started = time.monotonic()
    whole = tmp_path / "whole"
    done = finetune(assets, whole)
    assert done.returncode == 0, done.stderr[-2000:]

    # Each phase of a save (the one between last/'s two renames twice: a run resumed from last.old is killed
    # there again), then random moments (a kill lands anywhere: loading, a step, an evaluation, a save). Until a
    # kill after last/'s final rename (last:cleanup) moves last/ past step 2, every resume replays the first
    # evaluation and its best/ save (step 4), so the best/ phases can be reached at will.
    rng = random.Random(21)
    phases = [f"last:{p}" for p in LAST_PHASES if p != "cleanup"] + ["last:publish"]
    phases += [f"best:{p}" for p in BEST_PHASES]
    rng.shuffle(phases)
    phases += ["last:cleanup"]
    plan = phases + [None] * RANDOM_KILLS
    # A random kill comes within 6 steps' time of the start of training (measured on the uninterrupted run),
    # so that all of them, whatever the machine's speed, leave steps to run.
    step_s = max(r.get("elapsed_s", 0) for r in map(json.loads, (whole / "log.jsonl").read_text().splitlines())) / STEPS
    out = tmp_path / "killed"
    kills, fallbacks, hit = 0, 0, []
    for moment in plan:
        resume = ("--resume", str(out / "last")) if published(out / "last") else ()
        run = Run(assets, out, *resume, pause_at=moment)
        if moment is not None:
            assert run.wait_for(f"paused at {moment}"), (
                f"the run ended before {moment}: {run.seen[-5:]}; killed at {hit}, then {check_published(out)}"
            )
        else:
            run.wait_for("finetune classify:")
            time.sleep(rng.uniform(0.0, 6 * step_s))
        assert run.kill(), f"the run finished before the kill planned at {moment or 'a random moment'}"
        kills += 1
        hit.append(moment or "random")
        fallbacks += any("using the previous copy" in line for line in run.rest())
        check_published(out)

    final = finetune(assets, out, "--resume", str(out / "last"))
    assert final.returncode == 0, final.stderr[-2000:]
    fallbacks += "using the previous copy" in final.stderr
    elapsed = time.monotonic() - started

    assert kills == len(plan) and set(phases) <= set(hit)
    assert fallbacks >= 2  # each kill between last/'s renames: the next run said it used last.old
    for name in ("last", "best"):
        a, b = (whole / name / "model.safetensors").read_bytes(), (out / name / "model.safetensors").read_bytes()
        assert a == b, f"{name}/ weights differ from the uninterrupted run's"
    assert json.loads((whole / "best" / "metrics.json").read_text()) == json.loads(
        (out / "best" / "metrics.json").read_text()
    )
    for (k1, n1, t1), (k2, n2, t2) in zip(
        optimizer_tensors(whole / "last"), optimizer_tensors(out / "last"), strict=True
    ):
        assert (k1, n1) == (k2, n2) and torch.equal(t1, t2)
    assert last_losses(whole) == last_losses(out)
    assert sorted(p.name for p in out.iterdir()) == ["best", "last", "log.jsonl", "metrics.json"]  # no temporaries
    print(
        f"\n{kills} kills ({len(phases)} inside saves, {kills - len(phases)} random), {fallbacks} resumes "
        f"from last.old, weights bit-exact, {elapsed:.0f} s"
    )


# ----------------------------------------------------------------------------- resume refuses a bad last/


@pytest.fixture(scope="module")
def stopped_run(assets, tmp_path_factory):
    """A run stopped after step 4 (its last/ is resumable)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    done = finetune(assets, out, "--stop-at-step", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def resume_copy(stopped_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(stopped_run, out)
    return out


def error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_resume_names_a_truncated_optimizer_file(assets, stopped_run, tmp_path):
    out = resume_copy(stopped_run, tmp_path)
    (out / "last" / "optimizer.pt").write_bytes(b"")
    line = error_line(finetune(assets, out, "--resume", str(out / "last")))
    assert "optimizer.pt is 0 bytes" in line and MANIFEST_NAME in line


def test_resume_without_manifest_still_names_an_empty_optimizer_file(assets, stopped_run, tmp_path):
    out = resume_copy(stopped_run, tmp_path)
    (out / "last" / MANIFEST_NAME).unlink()
    (out / "last" / "optimizer.pt").write_bytes(b"")
    done = finetune(assets, out, "--resume", str(out / "last"))
    line = error_line(done)
    assert "optimizer.pt is empty (0 bytes)" in line
    assert "has no checkpoint.json" in done.stderr


def test_resume_refuses_state_and_weights_from_different_steps(assets, stopped_run, tmp_path):
    out = resume_copy(stopped_run, tmp_path)
    last = out / "last"
    state = json.loads((last / "trainer_state.json").read_text())
    (last / "trainer_state.json").write_text(json.dumps(dict(state, step=3)))
    line = error_line(finetune(assets, out, "--resume", str(last)))
    assert "trainer_state.json is" in line and "bytes, but" in line
    write_manifest(last, step=4, epoch=0, position=4)  # a manifest that lists the edited file
    line = error_line(finetune(assets, out, "--resume", str(last)))
    assert "trainer_state.json is at step 3" in line and "says step 4" in line


def test_resume_after_a_kill_between_the_renames_uses_the_previous_copy(assets, stopped_run, tmp_path):
    out = resume_copy(stopped_run, tmp_path)
    os.rename(out / "last", out / "last.old")  # what a kill between the two renames of a save leaves
    done = finetune(assets, out, "--resume", str(out / "last"), "--stop-at-step", "6")
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "previous copy" in line]
    assert len(said) == 1 and "last.old" in said[0]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["step"] == 6
    assert not (out / "last.old").exists()


# ----------------------------------------------------------------------------- full disks


@contextmanager
def small_disk(path: Path, size: str):
    """A real file system of `size` (tmpfs) mounted at `path`: writes beyond it fail with ENOSPC."""
    path.mkdir(parents=True)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no mount command: cannot make a small file system")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root / CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def test_full_disk_at_the_first_save_is_one_line_and_leaves_nothing(assets, tmp_path):
    with small_disk(tmp_path / "disk", "160k") as disk:
        out = disk / "run"
        line = error_line(finetune(assets, out))
        assert "no space left on the device" in line and str(out / "last") in line
        assert sorted(p.name for p in out.iterdir()) == ["log.jsonl"]  # no last/, no temporary beside it


def test_full_disk_at_a_later_save_keeps_the_previous_last_and_best(assets, tmp_path):
    with small_disk(tmp_path / "disk", "700k") as disk:
        out = disk / "run"
        line = error_line(finetune(assets, out))
        assert "no space left on the device" in line
        last_step, best_step = check_published(out)
        assert last_step and best_step  # the complete earlier saves, verified
        assert sorted(p.name for p in out.iterdir()) == ["best", "last", "log.jsonl"]


def test_save_checkpoint_on_a_full_disk_raises_write_error_and_keeps_the_old_one(assets, tmp_path):
    from bert.checkpoint import init_model
    from bert.config import BertConfig

    small = init_model(BertConfig(**{k: v for k, v in TINY.items() if k != "model_type"}), seed=0)
    with small_disk(tmp_path / "disk", "150k") as disk:
        save_checkpoint(small, disk / "ckpt", tokenizer=assets / "tokenizer")  # ~90 KB: fits once, not twice
        before = {p.name: p.read_bytes() for p in (disk / "ckpt").iterdir()}
        with pytest.raises(WriteError, match="no space left on the device") as caught:
            save_checkpoint(small, disk / "ckpt", tokenizer=assets / "tokenizer")
        assert str(disk / "ckpt") in str(caught.value)
        assert {p.name: p.read_bytes() for p in (disk / "ckpt").iterdir()} == before
        assert sorted(p.name for p in disk.iterdir()) == ["ckpt"]
        verify_manifest(disk / "ckpt")


# ----------------------------------------------------------------------------- multi-task checkpoints


@pytest.fixture(scope="module")
def multitask_ckpt(assets, tmp_path_factory):
    from bert.checkpoint import init_model
    from bert.config import BertConfig

    config = BertConfig(
        **{k: v for k, v in TINY.items() if k != "model_type"},
        task_labels={"classify": ["negative", "positive"], "ner": ["O", "B-PER", "I-PER"], "qa": []},
    )
    directory = tmp_path_factory.mktemp("multi") / "ckpt"
    save_checkpoint(init_model(config, seed=1), directory, tokenizer=assets / "tokenizer")
    return directory


@pytest.mark.parametrize(
    "task,labels,kept",
    [
        ("classify", ["negative", "positive"], True),
        ("classify", ["0", "1"], False),
        ("ner", ["O", "B-PER", "I-PER"], True),
    ],
)
def test_finetune_from_a_multitask_checkpoint_cuts_the_task_model(multitask_ckpt, task, labels, kept, capsys):
    import torch

    from bert.checkpoint import read_state_dict
    from bert.tasks.base import Labels
    from training import finetune as cli

    cfg = cli.FinetuneConfig(task=task, ckpt=str(multitask_ckpt), train_data="x", eval_data="x")
    model = cli.build_model(cfg, Labels(labels, labels))
    said = capsys.readouterr().err
    # the one model class with the task's head alone, written as transformers' class for the task
    assert type(model).__name__ == "BertForMultiTask" and model.tasks == [task]
    assert (
        model.architecture == {"classify": "BertForSequenceClassification", "ner": "BertForTokenClassification"}[task]
    )
    assert model.config.task_labels is None and model.config.task == task
    stored = read_state_dict(multitask_ckpt)
    weights = model.state_dict()
    assert torch.equal(
        weights["bert.encoder.layer.1.output.dense.weight"], stored["bert.encoder.layer.1.output.dense.weight"]
    )
    head = stored["classifier.weight" if task == "classify" else "token_classifier.weight"]
    assert torch.equal(weights["classifier.weight"], head) == kept
    assert ("fine-tuning its" in said) == kept and ("fresh head" in said) == (not kept)


@pytest.mark.slow
def test_a_model_cut_from_a_multitask_checkpoint_fine_tunes_and_exports(assets, multitask_ckpt, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.finetune",
            "--task",
            "classify",
            "--ckpt",
            str(multitask_ckpt),
            "--train-data",
            str(assets / "train.tsv"),
            "--eval-data",
            str(assets / "dev.tsv"),
            "--labels",
            "0,1",
            "--label-names",
            "negative,positive",
            "--output-dir",
            str(out),
            "--max-steps",
            "2",
            "--batch-size",
            "8",
            "--max-seq-length",
            "32",
            "--no-progress",
            "--torch-threads",
            "1",
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((out / "best" / "config.json").read_text())
    assert "task_labels" not in config or config["task_labels"] is None
    exported = subprocess.run(
        [sys.executable, "-m", "export.onnx", "--ckpt", str(out / "best"), "--out", str(tmp_path / "artifact")],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert json.loads((tmp_path / "artifact" / "config.json").read_text())["id2label"] == {
        "0": "negative",
        "1": "positive",
    }


# ----------------------------------------------------------------------------- bert.atomic as the savers use it


def test_publish_dir_gives_the_final_name_nests_in_place_and_keeps_the_umask_mode(tmp_path):
    from bert.atomic import publish_dir, write_file_atomic

    target = tmp_path / "last"
    with publish_dir(target) as outer:
        assert outer.name == "last" and outer != target  # a writer may read the name (last/ vs best/)
        with publish_dir(outer) as inner:  # save_checkpoint inside a training save: written in place
            assert inner == outer
            (inner / "model.safetensors").write_bytes(b"w")
        (outer / "optimizer.pt").write_bytes(b"o")
        assert not target.exists()
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors", "optimizer.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask
    write_file_atomic(tmp_path / "metrics.json", "{}")
    assert (tmp_path / "metrics.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_pause_point_half_writes_then_restores_when_nobody_kills(tmp_path, monkeypatch, capsys):
    from bert import atomic

    path = tmp_path / "optimizer.pt"
    path.write_bytes(b"0123456789")
    seen = []
    monkeypatch.setattr(atomic.time, "sleep", lambda s: seen.append(path.read_bytes()))
    atomic.pause_point("last:optimizer", partial=path)  # not asked for: nothing happens
    assert seen == []
    monkeypatch.setenv(PAUSE_ENV, "last:optimizer")
    atomic.pause_point("last:optimizer", partial=path)
    assert seen == [b"01234"] and path.read_bytes() == b"0123456789"
    assert "paused at last:optimizer" in capsys.readouterr().err
