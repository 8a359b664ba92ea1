"""What the export command lines share: one-line errors with fixed exit codes, and step progress.

Exit codes: 0 done; 1 the export ran but its result is wrong (parity out of tolerance, attention
not fused); 2 the request cannot be done as given (no such checkpoint, bad flag, missing package, a full
disk or another file system error: one line naming the path and the reason).
"""

from __future__ import annotations

import errno
import sys
import time
from contextlib import contextmanager

from bert.errors import EXIT_BAD_INPUT, run_cli

EXIT_FAILED = 1
EXIT_USAGE = EXIT_BAD_INPUT


class UsageError(Exception):
    """Bad flags or a missing prerequisite: exit 2."""


class ResultError(Exception):
    """The export ran and produced something out of tolerance: exit 1."""


def usage_errors() -> tuple[type[BaseException], ...]:
    from bert.errors import bad_input_errors

    from .manifest import ArtifactError
    from .pertoken import PerTokenError
    from .source import SourceError

    return (UsageError, *bad_input_errors(), ArtifactError, SourceError, PerTokenError, FileNotFoundError)


def exit_code_for(error: BaseException) -> int | None:
    from .variants import FusionError  # imports onnx: only once something has failed

    if isinstance(error, (ResultError, FusionError)):
        return EXIT_FAILED
    if isinstance(error, usage_errors()):
        return EXIT_USAGE
    return None


def run(main, argv=None) -> int:
    """Call main(argv); known failures become one line on stderr and an exit code, never a traceback."""

    def guarded(argv):
        try:
            return main(argv)
        except OSError as e:
            raise UsageError(describe_os_error(e)) from None

    return run_cli(guarded, argv, exit_code_for)


def describe_os_error(error: OSError) -> str:
    """The path and the reason, without errno numbers: "cannot write DIR: no space left on the device"."""
    from bert.atomic import WriteError

    if isinstance(error, WriteError):
        return error.strerror or str(error)
    reason = "no space left on the device" if error.errno == errno.ENOSPC else error.strerror or str(error)
    return f"{error.filename}: {reason}" if error.filename else reason


class Progress:
    """`[3/7] fusing with onnxruntime ... done (4.2 s)` lines on stderr, so long steps show life."""

    def __init__(self, total: int, stream=None):
        self.total = total
        self.step = 0
        self.stream = stream or sys.stderr  # the stderr of now, not of import time (tests capture it)
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, what: str):
        self._start(what)
        start = time.perf_counter()
        yield
        self._finish(time.perf_counter() - start)

    def done(self, what: str, seconds: float) -> None:
        """A step that ran before progress output began (loading: if it fails, its error line stands alone)."""
        self._start(what)
        self._finish(seconds)

    def _start(self, what: str) -> None:
        self.step += 1
        print(f"[{self.step}/{self.total}] {what} ...", file=self.stream, flush=True)

    def _finish(self, seconds: float) -> None:
        print(f"      done ({seconds:.1f} s)", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"      {text}", file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started
