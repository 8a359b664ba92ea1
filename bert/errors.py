"""A failure a command line can explain is one line on stderr and an exit code, never a traceback.

The core's errors that mean "this checkpoint or file is bad" (config.json, the weights, the tokenizer
files) subclass BadInput, declared here, so export, training and serving give the same one line and exit 2
for them without this module knowing (or importing) the modules that raise them.
Exit codes: 0 done; 1 the work ran but its result is wrong (export: parity out of tolerance);
2 the request cannot be done as given (bad flag, bad or missing checkpoint, a file that cannot be written:
full disk, permissions); 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
MESSAGE_LIMIT = 1000  # characters: a list of 400 mis-shaped tensor names is still one readable line


def one_line(error: BaseException | str, limit: int = MESSAGE_LIMIT) -> str:
    """A message on one line: libraries (onnxruntime, torch's unpickler, tokenizers) raise multi-line ones."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_type(value) -> str:
    """The JSON name of a parsed value's type, for "expected an object, got an array" messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


_KINDS = {list: "an array", str: "a string", int: "an integer", (str, int): "a string or an integer"}


def json_fields(value, at: str, wanted: dict) -> str | None:
    """`at` is a JSON object holding each `wanted` name with a value of its Python type (list, str, int, or
    (str, int)); else what is wrong, as "at.name is a JSON array, not a string". None when all is well."""
    if not isinstance(value, dict):
        return f"{at} is a JSON {json_type(value)}, not an object"
    for name, kind in wanted.items():
        if name not in value:
            return f"{at} has no {name!r}"
        if not isinstance(value[name], kind) or isinstance(value[name], bool):
            return f"{at}.{name} is a JSON {json_type(value[name])}, not {_KINDS[kind]}"
    return None


def read_json_object(path, error: type[Exception] = ValueError) -> dict | None:
    """The JSON object in the file `path`, or None when there is no such file. A file that is not UTF-8 JSON, or
    holds something other than an object, raises `error` with one line naming the file."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise error(f"{path} is not a readable JSON file: {one_line(e, 200)}") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, not a JSON {json_type(data)}")
    return data


class BadInput(Exception):
    """A checkpoint, config or tokenizer file that cannot be used; the message names the file. The modules
    that read them subclass it (CheckpointError, ConfigError, TokenizerError)."""


def bad_input_errors() -> tuple[type[BaseException], ...]:
    """The core's errors for a checkpoint, config or tokenizer file that cannot be used."""
    return (BadInput,)


def run_cli(
    main: Callable, argv: list[str] | None = None, exit_code_for: Callable[[BaseException], int | None] | None = None
) -> int:
    """Call main(argv) and return its exit code (None counts as 0). A failure that `exit_code_for` gives a
    code, or one of bad_input_errors() (code 2), becomes `error: <message>` on stderr; others propagate."""
    try:
        return main(argv) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as e:  # the option parser's refusal (its line is out) or --help: its code, as a return
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        raise
    except Exception as e:
        code = exit_code_for(e) if exit_code_for is not None else None
        if code is None and isinstance(e, (*bad_input_errors(), OSError)):
            code = EXIT_BAD_INPUT
        if code is None:
            raise
        print(f"error: {os_error_line(e) if isinstance(e, OSError) else one_line(e)}", file=sys.stderr)
        return code


def os_error_line(error: OSError) -> str:
    """An OSError as one line naming the path and the reason ("[Errno 28] ..." says neither plainly).
    bert.atomic's WriteError already reads that way."""
    import errno

    if error.filename is None:
        return one_line(error.strerror or error)  # WriteError(errno, message): the message without "[Errno N]"
    reason = "no space left on the device" if error.errno == errno.ENOSPC else (error.strerror or str(error))
    return one_line(f"cannot use {error.filename}: {reason}")
