"""What the export command lines share: one-line errors with fixed exit codes, and step progress.

Exit codes: 0 done; 1 the export ran but its result is wrong (parity out of tolerance, attention
not fused); 2 the request cannot be done as given (no such checkpoint, bad flag, missing package).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad flags or a missing prerequisite: exit 2."""


class ResultError(Exception):
    """The export ran and produced something out of tolerance: exit 1."""


def usage_errors() -> tuple[type[BaseException], ...]:
    from bert.checkpoint import CheckpointError
    from bert.config import ConfigError

    from .manifest import ArtifactError
    from .source import SourceError

    return (UsageError, CheckpointError, ConfigError, ArtifactError, SourceError, FileNotFoundError)


def run(main, argv=None) -> int:
    """Call main(argv); known failures become one line on stderr and an exit code, never a traceback."""
    try:
        main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ResultError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:
        from .variants import FusionError

        if isinstance(e, FusionError):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_FAILED
        if isinstance(e, usage_errors()):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise
    return 0


class Progress:
    """`[3/7] fusing with onnxruntime ... done (4.2 s)` lines on stderr, so long steps show life."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total = total
        self.step = 0
        self.stream = stream
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, what: str):
        self.step += 1
        print(f"[{self.step}/{self.total}] {what} ...", file=self.stream, flush=True)
        start = time.perf_counter()
        yield
        print(f"      done ({time.perf_counter() - start:.1f} s)", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"      {text}", file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started
