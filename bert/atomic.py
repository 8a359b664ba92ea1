"""Crash-consistent directories: written aside, fsync'd, published by rename; never half of one.

Every directory bertserve writes (a checkpoint, `last/`, `best/`, an export artifact) goes through
`publish_dir`: the files are written into a hidden temporary sibling, each file and the directory are
fsync'd, the previous directory (if any) is renamed to `<name>.old`, the new one renamed into place, and
only then is `.old` removed. A reader therefore sees the complete previous directory or the complete new
one; a kill between the two renames leaves only `<name>.old`, which `recover` puts back.

The directory a writer fills is `<tmp>/<name>`: it already has its final name, so a writer that looks at
the name (e.g. to store `last/` in full precision and `best/` in half) behaves as it will once published. A
`publish_dir` for a path inside a directory that is being published writes in place: the outer publish is
the one atomic step (a training save puts weights, optimizer and trainer state into one `last/`).

Why not write in place: a kill halfway leaves new weights beside old state (a silently wrong resume) or an
old config beside a new graph (labels that lie). Why `.old` and not a symlink flip: a published directory
stays a plain directory that `cp -r`, `docker cp` and bind mounts handle as users expect.

No torch, no numpy: training, export and serving all use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

OLD_SUFFIX = ".old"
TMP_PREFIX = "."  # temporary siblings are hidden: ".<name>.tmp-XXXX"
TMP_MARK = ".tmp-"
PAUSE_ENV = "BERTSERVE_PAUSE_AT"  # crash tests only: see pause_point
PAUSE_SECONDS = 30.0

_publishing: set[Path] = set()  # directories being filled by an open publish_dir (absolute paths)


class WriteError(OSError):
    """Writing a directory failed (full disk, permissions, ...): the message names the path and the reason,
    and nothing partial was left behind."""


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new names, renames) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # e.g. a platform that cannot open directories: renames are then as durable as it makes them
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file below `root`, then every directory, deepest first."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def old_copy(target: Path) -> Path:
    return target.with_name(target.name + OLD_SUFFIX)


def recover(target: str | os.PathLike) -> Path | None:
    """The complete directory published at `target`: `target` itself, or — after a kill between the two
    renames of a publish — its `.old` copy, which is renamed back into place. None if neither exists."""
    target = Path(target)
    old = old_copy(target)
    if target.is_dir():
        return target
    if old.is_dir():
        with contextlib.suppress(OSError):  # a read-only place: serve the old copy where it lies
            os.rename(old, target)
            fsync_dir(target.parent)
            return target
        return old
    return None


def remove_stale_temporaries(target: Path) -> None:
    """Temporary siblings of `target` left by a killed writer (they were never published, so never read)."""
    prefix = f"{TMP_PREFIX}{target.name}{TMP_MARK}"
    if target.parent.is_dir():
        for entry in target.parent.iterdir():
            if entry.name.startswith(prefix):
                shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def publish_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory named like `target`; when the block ends without an exception,
    publish it at `target` (replacing what was there). On an exception the temporary directory is removed and
    `target` is left as it was. An OSError (full disk, permissions) is raised as WriteError naming `target`.
    Inside a directory that an outer publish_dir is filling, `target` is written in place.

        with publish_dir(out) as tmp:
            (tmp / "config.json").write_text(...)
    """
    target = Path(target)
    if _inside_publish(target):
        target.mkdir(parents=True, exist_ok=True)
        yield target
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        recover(target)
        remove_stale_temporaries(target)
        holder = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}{TMP_MARK}", dir=target.parent))
        tmp = holder / target.name
        tmp.mkdir()  # mkdir, not mkdtemp's 0700: the published directory gets the umask's usual mode
    except OSError as e:
        raise WriteError(e.errno, f"cannot write {target}: {_reason(e)}") from None
    key = tmp.absolute()
    _publishing.add(key)
    try:
        yield tmp
        fsync_tree(tmp)
        _swap_in(tmp, target)
    except BaseException as e:
        shutil.rmtree(holder, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(e.errno, f"cannot write {target}: {_reason(e)}") from None
        raise
    finally:
        _publishing.discard(key)
    shutil.rmtree(holder, ignore_errors=True)


def _inside_publish(target: Path) -> bool:
    path = target.absolute()
    return any(path == d or d in path.parents for d in _publishing)


def _swap_in(tmp: Path, target: Path) -> None:
    old = old_copy(target)
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    had_previous = target.exists()
    if had_previous:
        os.rename(target, old)
        pause_point(f"{target.name}:publish")
    os.rename(tmp, target)
    fsync_dir(target.parent)
    if had_previous:
        pause_point(f"{target.name}:cleanup")
        shutil.rmtree(old, ignore_errors=True)


def pause_point(name: str, partial: str | os.PathLike | None = None) -> None:
    """Crash-test hook: when $BERTSERVE_PAUSE_AT is `name` (e.g. "last:optimizer"), say `paused at NAME` on
    stderr and wait PAUSE_SECONDS, so that a test can kill the process at that exact moment of a save. With
    `partial`, that file holds only its first half meanwhile (as after a kill in the middle of writing it)
    and gets the rest back if nobody kills the process. Unset (always, outside crash tests) it costs one
    environment lookup."""
    if os.environ.get(PAUSE_ENV) != name:
        return
    data = None
    if partial is not None:
        data = Path(partial).read_bytes()
        with open(partial, "r+b") as f:
            f.truncate(len(data) // 2)
            f.flush()
            os.fsync(f.fileno())
    print(f"paused at {name}", file=sys.stderr, flush=True)
    time.sleep(PAUSE_SECONDS)
    if data is not None:
        Path(partial).write_bytes(data)


def write_file_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """One file replaced whole (written aside, fsync'd, renamed): for a small file updated in place, such as a
    metrics log beside published directories."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}{TMP_MARK}", dir=path.parent)
    try:
        os.fchmod(fd, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())  # not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(e.errno, f"cannot write {path}: {_reason(e)}") from None


def _umask() -> int:
    """The process's umask, read without setting it (os.umask can only be read by changing it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _reason(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return "no space left on the device"
    return error.strerror or str(error)
