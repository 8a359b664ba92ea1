"""python -m batch --task T --model DIR --input PATH --output DIR: an offline job (batch/job.py), or on Ray Data
with --ray (batch/ray_job.py). A contradiction, a missing column, an unreadable file or a model without the task
is one `error:` line and exit 2, before any work; Ctrl-C is one line and exit 130 (the same command resumes)."""

from __future__ import annotations

import sys

from batch.options import BatchOptions
from bert.options import EXIT_USAGE, read

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


def main(argv: list[str] | None = None) -> int:
    options = dict(read(BatchOptions, argv, prog="python -m batch", description=__doc__.split("\n")[0]))
    from batch.predict import JobError

    try:
        if options["ray"]:
            from batch.ray_job import run
        else:
            from batch.job import run
        return run(options, log=lambda line: print(line, file=sys.stderr))
    except JobError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # the parts written are recorded: the same command continues after the last
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
