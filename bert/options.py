"""Command-line options, declared once: a typed field with its help beside it becomes a `--flag` and an env var.

Every command (training.*, export.*, python -m serving) declares its options as the fields of one class: a
dataclass whose fields come from `option(default, "help")`, or, for the server, a pydantic-settings model whose
fields carry `Field(description=...)`. `parse(cls, argv)` reads them the same way for all:

- the flag is the field's name with dashes (`max_seq_length` -> `--max-seq-length`);
- the env var is the command's prefix + the name in capitals: `BERTSERVE_` for the server
  (`BERTSERVE_MAX_BATCH_TOKENS`), `BERTSERVE_<COMMAND>_` for the offline commands (`BERTSERVE_FINETUNE_MAX_SEQ_LENGTH`,
  `BERTSERVE_ONNX_PRECISION`), declared as the class's `env_prefix`. One env var is read by one command only:
  the same word means different things to different commands (`precision` is fp32|bf16|fp16 to training,
  fp32|fp16|int8 to export), and an `int8` exported with must not stop the server from starting;
- precedence: a flag given on the command line, else its env var, else the declared default;
- a yes/no option is `--name` (true), `--name false|true`, and `--no-name` (false); env `1/0, true/false,
  yes/no, on/off`;
- a list option takes comma-separated values, and its flag may be repeated (the values add up);
- `--help` lists every option with its help, its env var and its default;
- an unknown flag, a bad value (from a flag or an env var) or a missing required option is one line on stderr,
  `error: ...`, and exit 2, never argparse's usage block.

Standard library only: `bert/` stays importable with numpy + tokenizers, and training and export need no
pydantic. The server's model is read through the same `Option` records (`options_of`).
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

ENV_PREFIX = "BERTSERVE_"  # the server's; an offline command's class declares its own `env_prefix`
# The product's env vars that are no command's option, with what each is for. Together with the commands' options
# these are every BERTSERVE_ name the product reads (tests/test_options.py checks the source against both).
ENVIRONMENT = {
    "BERTSERVE_HOME": "the checkpoint store is $BERTSERVE_HOME/checkpoints (default: ./checkpoints), for every command",
    "BERTSERVE_BASE_URL": "the Python SDK's server address when the Client is given none",
    "BERTSERVE_PAUSE_AT": "crash tests only: stop at this named point of a checkpoint write or a batch job (bert/atomic.py)",
    "BERTSERVE_TEST_DATA": "tests and benchmarks: the data directory (default: ../shared/data)",
    "BERTSERVE_TEST_RERANKER": "tests: a trained reranker checkpoint its default export is held to the bars with (unset: skipped)",
    "BERTSERVE_TEST_FULL": (
        "tests: 1 compares the families on the full CoNLL-2003 valid set and 500 SQuAD questions, holds the "
        "default exports to their agreement with fp32 on held-out data, and checks python -m batch against the "
        "references on 20,000 SQuAD sentences (embed) and 1,000 rows (classify, ner, qa)"
    ),
    "BERTSERVE_PEERS_DIR": "benchmarks: where peer servers are installed (default: bench/.peers)",
    "BERTSERVE_HEALTHCHECK_PIDS": "tests only: the processes whose sockets the container health check probes",
}
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
EXIT_USAGE = 2


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices: tuple | None = None,
    metavar: str | None = None,
    required: bool = False,
    one_of: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
) -> Any:
    """A dataclass field that is a command-line option. `one_of`: options sharing this group name exclude each
    other (and `required` on them means one of the group is needed). `minimum` / `maximum`: a number's bounds,
    `above`: a lower bound it may not equal (a learning rate above 0); checked wherever a value comes in (flag, env
    var, or `bounds_problems` for values given in code); None, where the option allows it, is never out of bounds."""
    metadata = {
        "help": help,
        "choices": choices,
        "metavar": metavar,
        "required": required,
        "one_of": one_of,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
    }
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=metadata)
    if default is dataclasses.MISSING:
        return dataclasses.field(default=None, metadata=dict(metadata, required=True))
    return dataclasses.field(default=default, metadata=metadata)


def like(
    cls, name: str, default: Any = dataclasses.MISSING, *, help: str | None = None, prefix: str = "", suffix: str = ""
) -> Any:
    """The option `name` as `cls` declares it (help, choices), for a command that reads the same setting:
    declared once, reused. `default` / `help` replace the declared ones where given; `prefix` goes before the
    help, `suffix` after it (multitask's `--classify-labels`: "classify: " + finetune's `--labels` help)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if default is dataclasses.MISSING:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    meta = f.metadata
    return option(
        default,
        prefix + (meta["help"] if help is None else help) + suffix,
        **{k: meta.get(k) for k in ("choices", "metavar", "one_of", "minimum", "maximum", "above")},
    )


def flag(config, name: str) -> str:
    """How the command that built `config` spells option `name` (for messages): `--max-seq-length`, or what
    the config's `flag_names` maps it to (multitask runs a task's config under `--qa-max-seq-length`)."""
    return getattr(config, "flag_names", {}).get(name) or "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    kind: type  # str | int | float | bool | list (of str)
    default: Any
    help: str
    choices: tuple | None = None
    metavar: str | None = None
    required: bool = False
    one_of: str | None = None
    prefix: str = ENV_PREFIX
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    optional: bool = False  # None is a value (Optional[X])

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return self.prefix + self.name.upper()

    def convert(self, text: str):
        """A flag's or env var's text as this option's value; ValueError names what was expected."""
        if self.kind is bool:
            low = text.strip().lower()
            if low in TRUE or low in FALSE:
                return low in TRUE
            raise ValueError(f"expected true or false, got {text!r}")
        if self.kind is list:
            return [x for x in text.split(",") if x]
        try:
            value = self.kind(text)
        except ValueError:
            raise ValueError(f"expected {'an integer' if self.kind is int else 'a number'}, got {text!r}") from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"invalid choice {text!r} (choose from {', '.join(map(str, self.choices))})")
        self.check(value)
        return value

    def check(self, value) -> None:
        """ValueError when a number is outside the declared bounds ("must be at least 1, got 0")."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if self.above is not None and value <= self.above:
            raise ValueError(f"must be more than {_number(self.above)}, got {_number(value)}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be at least {_number(self.minimum)}, got {_number(value)}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be at most {_number(self.maximum)}, got {_number(value)}")

    def take(self, value):
        """A value given in code (a Python API's keyword) as this option holds it: of its kind (numpy's scalars
        taken as Python's), within its choices and bounds; ValueError naming what was expected. A wrong kind is
        refused, not coerced: truncate="false" would be true, top_k="3" fail every row later."""
        if value is None and self.optional:
            return None
        kind, name = self.kind, type(value).__name__
        if kind is bool and name in ("bool", "bool_"):
            return bool(value)
        if kind is int and isinstance(value, numbers.Integral) and name not in ("bool", "bool_"):
            value = int(value)
        elif kind is float and isinstance(value, numbers.Real) and name not in ("bool", "bool_"):
            value = float(value)
        elif kind is str and isinstance(value, str):
            if self.choices is not None and value not in self.choices:
                raise ValueError(f"must be one of {', '.join(map(str, self.choices))}, got {value!r}")
            return value
        elif kind is list and (
            isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))
        ):
            return value if isinstance(value, str) else list(value)
        else:
            want = {
                bool: "True or False",
                int: "an integer",
                float: "a number",
                str: "a string",
                list: "a name or a list of names",
            }
            raise ValueError(f"must be {want[kind]}, got {value!r} ({name})")
        self.check(value)
        return value


def _number(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _kind(hint) -> tuple[type, tuple | None]:
    """(value kind, Literal choices) of an annotation: Optional[X] is X, list[str] is list."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        return type(choices[0]), choices
    if typing.get_origin(hint) is list or hint is list:
        return list, None
    return (hint if hint in (str, int, float, bool) else str), None


def _optional(hint) -> bool:
    return (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) and type(None) in (
        typing.get_args(hint)
    )


def env_prefix(cls) -> str:
    """What `cls`'s env vars start with: its `env_prefix` (a pydantic-settings model's from its model_config),
    else BERTSERVE_."""
    config = getattr(cls, "model_config", None)
    if isinstance(config, dict) and config.get("env_prefix"):
        return config["env_prefix"]
    return getattr(cls, "env_prefix", ENV_PREFIX)


def options_of(cls) -> list[Option]:
    """The options `cls` declares: a dataclass's fields (help in `metadata["help"]`, from `option`) or a pydantic
    model's fields (help in `Field(description=...)`), in declaration order."""
    prefix = env_prefix(cls)
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            kind, choices = _kind(hints[f.name])
            meta = f.metadata
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append(
                Option(
                    f.name,
                    kind,
                    default,
                    meta.get("help", ""),
                    meta.get("choices") or choices,
                    meta.get("metavar"),
                    bool(meta.get("required")),
                    meta.get("one_of"),
                    prefix,
                    meta.get("minimum"),
                    meta.get("maximum"),
                    meta.get("above"),
                    _optional(hints[f.name]),
                )
            )
        return out
    out = []
    for name, f in cls.model_fields.items():  # a pydantic (settings) model
        kind, choices = _kind(f.annotation)
        required = f.is_required()
        default = None if required else f.get_default(call_default_factory=True)
        low = high = above = None
        for rule in f.metadata:  # annotated_types' Ge / Le / Gt, from Field(ge=..., le=..., gt=...)
            low = getattr(rule, "ge", low)
            high = getattr(rule, "le", high)
            above = getattr(rule, "gt", above)
        out.append(
            Option(
                name,
                kind,
                default,
                f.description or "",
                choices,
                required=required,
                prefix=prefix,
                minimum=low,
                maximum=high,
                above=above,
                optional=_optional(f.annotation),
            )
        )
    return out


def bounds_problems(cls, values: Mapping[str, Any], flag_of: Callable[[str], str] | None = None) -> list[str]:
    """One line per value of `values` outside its option's declared bounds ("--workers must be at least 0, got
    -1"): for values that come in from code (a Python API's keyword arguments, a config built by hand) rather
    than through `read`. `flag_of(name)`: how the command spells the option (default: its flag)."""
    problems = []
    for o in options_of(cls):
        if o.name in values:
            try:
                o.check(values[o.name])
            except ValueError as e:
                problems.append(f"{flag_of(o.name) if flag_of else o.flag} {e}")
    return problems


def take_values(cls, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` given in code for options of `cls`, each as its option takes it (Option.take): ValueError naming
    the first that is of the wrong kind, outside its choices or out of its bounds."""
    declared = {o.name: o for o in options_of(cls)}
    out = {}
    for name, value in values.items():
        try:
            out[name] = declared[name].take(value)
        except ValueError as e:
            raise ValueError(f"{name} {e}") from None
    return out


def check_bounds(cls, values: Mapping[str, Any]) -> None:
    """ValueError naming the flag of the first of `values` outside its declared bounds."""
    problems = bounds_problems(cls, values)
    if problems:
        raise ValueError(problems[0])


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one `error:` line and exit 2 (not the usage block)."""

    hint: Callable[[str], str] | None = None

    def error(self, message: str) -> NoReturn:
        if self.hint is not None:
            message = self.hint(message)
        self.exit(EXIT_USAGE, f"error: {' '.join(message.split())}\n")


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a flag named in a help text is never split at its dashes (`--no-access-` / `log`)."""

    def _split_lines(self, text, width):
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        import textwrap

        return textwrap.fill(
            " ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )


class _YesNo(argparse.Action):
    """--name (true) or --name true|false; --no-name is _No."""

    def __init__(self, option_strings, dest, option: Option, **kwargs):
        self.option = option
        super().__init__(option_strings, dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(self, parser, namespace, value, option_string=None):
        try:
            setattr(namespace, self.dest, True if value is None else self.option.convert(value))
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None


class _No(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, False)


def _bounds_text(o: Option) -> str:
    if o.minimum is not None and o.maximum is not None:
        return f" ({_number(o.minimum)} to {_number(o.maximum)})"
    low = f"at least {_number(o.minimum)}" if o.minimum is not None else None
    if o.above is not None:
        low = f"more than {_number(o.above)}"
    bounds = [b for b in (low, f"at most {_number(o.maximum)}" if o.maximum is not None else None) if b]
    return f" ({', '.join(bounds)})" if bounds else ""


def _default_text(o: Option) -> str:
    if o.kind is bool and o.default is not None:  # None: the help says what decides
        return f" (default: {str(bool(o.default)).lower()})"
    if o.default is None or o.default == "" or o.default == []:
        return ""
    return f" (default: {','.join(o.default) if isinstance(o.default, list) else o.default})"


def _module_name(cls) -> str:
    """The module `cls` is declared in, as `python -m` names it (a class of the module run with -m is __main__'s)."""
    if cls.__module__ == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        return spec.name if spec is not None else "__main__"
    return cls.__module__


def build_parser(
    cls,
    *,
    prog: str | None = None,
    description: str | None = None,
    epilog: str | None = None,
    hint: Callable[[str], str] | None = None,
) -> argparse.ArgumentParser:
    """The argparse parser of `cls`'s options (what `--help` shows). Its defaults are left out of the namespace:
    `read` fills what the command line did not give from the env, then the declaration."""
    parser = _OneLineParser(
        prog=prog or f"python -m {_module_name(cls)}",
        description=description,
        epilog=epilog,
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
    )
    parser.hint = hint
    groups: dict[str, Any] = {}
    for o in options_of(cls):
        target = parser
        if o.one_of:
            if o.one_of not in groups:
                groups[o.one_of] = parser.add_mutually_exclusive_group()
            target = groups[o.one_of]
        text = o.help
        if o.kind is list:
            text += " (comma-separated, or the flag repeated)"
        if o.kind is bool and not o.name.startswith("no_"):  # --no-verify stays one flag, never --no-no-verify
            text += f"; --no-{o.flag[2:]}: false"
        text = (text + _bounds_text(o) + _default_text(o) + f" [env {o.env}]").replace("%", "%%")
        if o.required and not o.one_of:
            text += " (required)"
        if o.kind is bool:
            if not o.name.startswith("no_"):
                target.add_argument(
                    "--no-" + o.flag[2:], dest=o.name, action=_No, default=argparse.SUPPRESS, help=argparse.SUPPRESS
                )
            target.add_argument(o.flag, dest=o.name, action=_YesNo, option=o, default=argparse.SUPPRESS, help=text)
            continue

        def typed(text_value: str, o=o):
            try:
                return o.convert(text_value)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        typed.__name__ = o.kind.__name__
        target.add_argument(
            o.flag,
            dest=o.name,
            type=typed,
            action="extend" if o.kind is list else "store",
            default=argparse.SUPPRESS,
            metavar=o.metavar or ("{" + ",".join(map(str, o.choices)) + "}" if o.choices else o.name.upper()),
            help=text,
        )
    return parser


class Values(dict):
    """Option values by name; `sources[name]` says where each came from: the flag, the env var, or "default"."""

    sources: dict[str, str]


def read(
    cls,
    argv: list[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    parser: argparse.ArgumentParser | None = None,
    **parser_args,
) -> Values:
    """Every option of `cls`: from its flag, else its env var (its prefix + NAME), else its default. A bad or
    missing one exits 2 with one `error:` line."""
    parser = parser or build_parser(cls, **parser_args)
    given = vars(parser.parse_args(argv))
    environ = os.environ if environ is None else environ
    options = options_of(cls)
    flagged_groups = {o.one_of for o in options if o.one_of and o.name in given}
    values, sources = Values(), {}
    for o in options:
        if o.name in given:
            values[o.name], sources[o.name] = given[o.name], o.flag
        elif o.env in environ and not (o.one_of and o.one_of in flagged_groups):
            try:
                values[o.name] = o.convert(environ[o.env])
            except ValueError as e:
                parser.error(f"{o.env}: {e}")
            sources[o.name] = o.env
        else:
            values[o.name], sources[o.name] = o.default, "default"
            unread = ENV_PREFIX + o.name.upper()
            if o.prefix != ENV_PREFIX and unread in environ:
                # A variable this command read before each command had its own: say so, rather than ignore it.
                print(f"warning: {unread} is not read by {parser.prog}: its variable is {o.env}", file=sys.stderr)
    for group in dict.fromkeys(o.one_of for o in options if o.one_of):
        members = [o for o in options if o.one_of == group]
        chosen = [o for o in members if sources[o.name] != "default"]
        if len(chosen) > 1:
            parser.error(f"{' and '.join(sources[o.name] for o in chosen)} exclude each other: give one")
        if not chosen and any(o.required for o in members):
            parser.error(f"one of {', '.join(o.flag for o in members)} is required")
    missing = [o for o in options if o.required and not o.one_of and sources[o.name] == "default"]
    if missing:
        parser.error(
            "the following arguments are required: " + ", ".join(f"{o.flag} (or env {o.env})" for o in missing)
        )
    values.sources = sources
    return values


def fail(message: str) -> NoReturn:
    """A contradiction found after parsing: one `error:` line and exit 2, as the parser's own."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)
