"""Crash-consistent directories: written aside, fsync'd, published by rename; never half of one.

Every directory bertserve writes (a checkpoint, `last/`, `best/`, an export artifact) goes through
`publish_dir`: the files are written into a hidden temporary sibling, each file and the directory are
fsync'd, the previous directory (if any) is renamed to `<name>.old`, the new one renamed into place, and
only then is `.old` removed. A reader therefore sees the complete previous directory or the complete new
one; a kill between the two renames leaves only `<name>.old`, which `recover` puts back.

Why not write in place: a kill halfway leaves new weights beside old state (a silently wrong resume) or an
old config beside a new graph (labels that lie). Why `.old` and not a symlink flip: a published directory
stays a plain directory that `cp -r`, `docker cp` and bind mounts handle as users expect.

No torch, no numpy: training, export and serving all use it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

OLD_SUFFIX = ".old"
TMP_PREFIX = "."  # temporary siblings are hidden: ".<name>.tmp-XXXX"
TMP_MARK = ".tmp-"


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
    """Yield an empty temporary directory beside `target`; when the block ends without an exception, publish
    it at `target` (replacing what was there). On an exception the temporary directory is removed and
    `target` is left as it was. An OSError (full disk, permissions) is raised as WriteError naming `target`.

        with publish_dir(out) as tmp:
            (tmp / "config.json").write_text(...)
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        recover(target)
        remove_stale_temporaries(target)
        tmp = _make_temporary_sibling(target)
    except OSError as e:
        raise WriteError(e.errno, f"cannot write {target}: {_reason(e)}") from None
    try:
        yield tmp
        fsync_tree(tmp)
        _swap_in(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(e.errno, f"cannot write {target}: {_reason(e)}") from None
        raise


def _make_temporary_sibling(target: Path) -> Path:
    # Not tempfile.mkdtemp: its mode 0700 would be the published directory's, unreadable to a server or a
    # container running as another user. mkdir gives what `mkdir` in a shell gives (0777 less the umask).
    for _ in range(100):
        tmp = target.parent / f"{TMP_PREFIX}{target.name}{TMP_MARK}{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {target}")


def _swap_in(tmp: Path, target: Path) -> None:
    old = old_copy(target)
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    had_previous = target.exists()
    if had_previous:
        os.rename(target, old)
    os.rename(tmp, target)
    fsync_dir(target.parent)
    if had_previous:
        shutil.rmtree(old, ignore_errors=True)


def write_file_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """One file replaced whole (written aside, fsync'd, renamed): for a small file updated in place, such as a
    metrics log beside published directories."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}{TMP_MARK}", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from other users
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
    """The process's umask, read without setting it (os.umask sets it, for a moment, for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return 0o022


def _reason(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return "no space left on the device"
    return error.strerror or str(error)
