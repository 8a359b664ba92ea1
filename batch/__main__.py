"""python -m batch --task T --model DIR --input PATH --output DIR: an offline job (batch/job.py), or on Ray Data
with --ray (batch/ray_job.py). A contradiction, a missing column, an unreadable file or a model without the task
is one `error:` line and exit 2, before any work."""

from __future__ import annotations

import sys

from batch.options import BatchOptions
from bert.options import EXIT_USAGE, read


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


if __name__ == "__main__":
    sys.exit(main())
