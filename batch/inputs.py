"""Reading a job's input: Parquet, JSONL or CSV/TSV files (a file, a directory of them, or a glob), their rows
numbered across the files in sorted order, read a window at a time and never whole. A value that is not valid
UTF-8, a line that is not JSON: that row's error, never the file's (in a kept column: U+FFFD for the bytes). A file
without a row (0 bytes, a JSONL file of blank lines, a CSV/TSV file without a header) is a file of 0 rows."""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
SUFFIXES.update({".csv": "csv", ".tsv": "tsv", ".tab": "tsv"})
ROW_ERROR = "\0row-error"  # a row the reader could not read: its error, in place of its values
JSONL_HEAD_LINES = 100  # a column must show in one of a JSONL file's first lines that are not blank
READ_BLOCK = 1 << 16  # bytes a read of a whole file takes at a time (cut into lines while in the CPU cache)


class InputError(Exception):
    """An input that cannot be read at all (no such file, not the format, a missing column): one line."""


@dataclass
class InputFile:
    path: Path
    format: str
    bytes: int
    rows: int | None = None  # known up front for Parquet and for an empty file; counted for the others as read
    schema: pa.Schema | None = None  # a Parquet file's, from its footer (columns_of)


def expand(spec: str, format: str = "auto") -> list[InputFile]:
    """The files `spec` names: a file, a directory (its data files, recursively), or a glob; sorted."""
    path = Path(spec).expanduser()
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
        candidates = [p for p in candidates if p.suffix.lower() in SUFFIXES or format != "auto"]
    elif any(c in spec for c in "*?["):
        candidates = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    else:
        raise InputError(f"--input {spec}: no such file or directory")
    if not candidates:
        raise InputError(f"--input {spec}: no Parquet, JSONL, CSV or TSV file there")
    files = []
    for p in candidates:
        kind = format if format != "auto" else SUFFIXES.get(p.suffix.lower())
        if kind is None:
            raise InputError(f"{p}: not a .parquet, .jsonl, .csv or .tsv file (pass --format)")
        files.append(InputFile(p.resolve(), kind, p.stat().st_size))
    return files


def columns_of(file: InputFile) -> list[str] | None:
    """The columns a file offers (read from its head); None for a text file without a row, which offers none
    (its rows are then known: 0); or InputError naming why it cannot be read."""
    try:
        if file.format == "parquet":
            reader = pq.ParquetFile(file.path)
            file.rows, file.schema = reader.metadata.num_rows, reader.schema_arrow
            return list(reader.schema_arrow.names)
        if file.format == "jsonl":
            names: dict[str, None] = {}
            parsed, lines, problem = 0, 0, "no line"
            with open(file.path, "rb") as f:
                for n, line in enumerate(f):
                    if not line.strip():
                        continue
                    if lines >= JSONL_HEAD_LINES:
                        break
                    lines += 1
                    try:
                        record = _json_record(line)
                    except ValueError as e:  # a bad line is its row's error; a file of them is no JSONL
                        problem = f"line {n + 1}: {e}"
                        continue
                    if isinstance(record, dict):
                        parsed += 1
                        names.update(dict.fromkeys(record))
            if not lines:  # 0 bytes, or blank lines only
                file.rows = 0
                return None
            if not parsed:
                raise ValueError(f"no JSON object in its first {JSONL_HEAD_LINES} lines ({problem})")
            return list(names)
        with _text(file.path) as f:
            header = _header(csv.reader(f, delimiter="\t" if file.format == "tsv" else ","))
        if header is None:  # 0 bytes, or blank lines only
            file.rows = 0
        return header
    except InputError:
        raise
    except (OSError, pa.ArrowException, ValueError) as e:
        raise InputError(f"{file.path}: cannot be read as {file.format}: {' '.join(str(e).split())[:300]}") from None


def check_columns(files: list[InputFile], needed: list[str]) -> None:
    for file in files:
        have = columns_of(file)
        if have is None:  # no row: nothing to read from it
            continue
        missing = [c for c in needed if c not in have]
        if missing:
            raise InputError(
                f"{file.path}: no column {', '.join(map(repr, missing))}; it has {', '.join(have[:20]) or 'none'}"
            )


@dataclass
class Chunk:
    """Consecutive rows of one file: the needed columns as lists, the kept ones as Arrow arrays."""

    start: int  # the first row's number across all files
    values: dict[str, list]
    keep: dict[str, pa.Array] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0


def read_rows(
    files: list[InputFile], columns: list[str], keep: list[str], chunk_rows: int, skip: int = 0
) -> Iterator[Chunk]:
    """The rows from number `skip` on, in chunks of at most `chunk_rows` (a chunk never spans two files)."""
    at = 0
    for file in files:
        if file.rows is not None and at + file.rows <= skip:
            at += file.rows  # a Parquet file done before: not even opened
            continue
        for chunk in _read_file(file, columns, keep, chunk_rows):
            n = len(chunk)
            if at + n <= skip:
                at += n
                continue
            if at < skip:
                cut = skip - at
                chunk = Chunk(
                    at + cut,
                    {k: v[cut:] for k, v in chunk.values.items()},
                    {k: v.slice(cut) for k, v in chunk.keep.items()},
                )
                at += cut
                n -= cut
            chunk.start = at
            at += n
            yield chunk


def _read_file(file: InputFile, columns: list[str], keep: list[str], chunk_rows: int) -> Iterator[Chunk]:
    if file.format == "parquet":
        reader = pq.ParquetFile(file.path)
        wanted = list(dict.fromkeys([*columns, *keep]))
        # A row group at a time, not iter_batches: that reader's memory grows with the rows it has read (about
        # 85 bytes a row of text), which a job of millions of rows cannot afford.
        for group in range(reader.metadata.num_row_groups):
            table = reader.read_row_group(group, columns=wanted)
            for batch in table.to_batches(max_chunksize=chunk_rows):
                yield Chunk(0, {c: batch.column(c).to_pylist() for c in columns}, {c: batch.column(c) for c in keep})
            del table
        return
    rows = _jsonl_rows(file.path) if file.format == "jsonl" else _csv_rows(file.path, file.format)
    for buffer in _batched(rows, chunk_rows):
        chunk = _chunk(buffer, columns, keep)
        del buffer  # its rows are garbage while the next are read (more live rows: more for the GC to walk)
        yield chunk


def _batched(rows: Iterable[dict], size: int) -> Iterator[list[dict]]:
    """Rows in lists of `size` (the last one shorter): the chunks a text file is read in."""
    buffer: list[dict] = []
    for row in rows:
        buffer.append(row)
        if len(buffer) == size:
            yield buffer
            buffer = []
    if buffer:
        yield buffer


def _chunk(rows: list[dict], columns: list[str], keep: list[str]) -> Chunk:
    values = {c: [r.get(c) for r in rows] for c in columns}
    errors = [r.get(ROW_ERROR) for r in rows]
    if any(errors):
        values[ROW_ERROR] = errors
    return Chunk(0, values, {c: _kept_column(rows, c) for c in keep})


def _kept_column(rows: list[dict], column: str) -> pa.Array:
    return arrow_column([valid_utf8(r.get(column)) for r in rows])


def _kept_type(rows: list[dict], column: str) -> pa.DataType:
    """_kept_column(rows, column).type, sooner: values Arrow takes as they are hold no undecodable bytes (it
    encodes every string, a key too, as UTF-8), so valid_utf8 would leave them as they are."""
    try:
        return pa.array([r.get(column) for r in rows]).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError):
        return _kept_column(rows, column).type


def valid_utf8(value):
    """A kept value as Arrow can write it: undecodable bytes (read as lone surrogates) become U+FFFD, in its
    strings and in those nested in it; a kept value never fails the job."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
        try:  # the bytes a text read with surrogateescape could not decode: one U+FFFD each
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # a lone surrogate JSON spelled out (\ud800)
            return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in value)
    if isinstance(value, dict):
        return {valid_utf8(k): valid_utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_utf8(v) for v in value]
    return value


@dataclass
class Survey:
    """What one read of each input file, before the job's own pass, tells of the input: each file's sha256 (the
    manifest records it), the rows (a close guess for text files, their lines: the progress line's ETA, the Ray
    job's blocks) and each kept column's type in every part of the job."""

    sha256: list[str]
    rows: int
    kept: dict[str, pa.DataType]


def survey(files: list[InputFile], keep: list[str], chunk_rows: int) -> Survey:
    """One read of each file: its bytes hashed and their lines counted as they go by, and for a JSONL file with
    kept columns the same bytes parsed, in the chunks the job reads them in, for the types its chunks will have.
    A kept column's type is decided from the whole input before any work: a Parquet file's schema, text for
    CSV/TSV, a JSONL file's chunks' types (a file without a row has none); where these disagree, the common
    number type, else text (common_type)."""
    seen: dict[str, list] = {c: [] for c in keep}
    wide: set[str] = set()  # kept columns holding an integer a float64 cannot hold exactly
    digests, total = [], 0
    for file in files:
        read = _Read(file.path)
        if file.format == "jsonl" and keep and file.rows != 0:
            for rows in _batched(_jsonl_records(read.lines()), chunk_rows):
                for c in keep:
                    kind = _kept_type(rows, c)
                    seen[c].append(kind)
                    if pa.types.is_integer(kind) and c not in wide and _beyond_float(rows, c):
                        wide.add(c)
                del rows  # garbage while the next are read (_read_file)
        else:
            for _ in read.blocks():
                pass
            if file.format == "parquet" and keep:
                schema = file.schema if file.schema is not None else pq.ParquetFile(file.path).schema_arrow
                for c in keep:
                    seen[c].append(schema.field(c).type)
            elif file.format in ("csv", "tsv") and file.rows != 0:
                for c in keep:
                    seen[c].append(pa.string())
        digests.append(read.digest.hexdigest())
        if file.rows is not None:
            total += file.rows
        else:
            total += max(0, read.newlines - (1 if file.format in ("csv", "tsv") else 0))
    return Survey(digests, total, {c: common_type(types, exact=c in wide) for c, types in seen.items()})


def _beyond_float(rows: list[dict], column: str) -> bool:
    """Whether an integer of `column` is one float64 would round (beyond 2**53): such a column beside floats is
    text, so that an id of 9007199254740993 is not written as ...992 (nor fails the job's cast)."""
    return any(type(v) is int and abs(v) > FLOAT_EXACT for v in (r.get(column) for r in rows))


FLOAT_EXACT = 2**53


class _Read:
    """A file read once, a block at a time, its bytes hashed and their newlines counted on the way."""

    def __init__(self, path: Path):
        self.path = path
        self.digest = hashlib.sha256()
        self.newlines = 0

    def blocks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            while block := f.read(READ_BLOCK):
                self.digest.update(block)
                self.newlines += block.count(b"\n")
                yield block

    def lines(self) -> Iterator[bytes]:
        """The file's lines, as iterating over it in binary gives them (a line of many blocks is joined once,
        not block by block: a 100 MB line is not copied 1,600 times)."""
        return _file_lines(self.blocks())


def common_type(types: list[pa.DataType], exact: bool = False) -> pa.DataType:
    """One type for values of these types: theirs when they agree (nulls agree with any), int64 for integers of
    several widths, float64 for integers and floats (text, with `exact`: integers float64 would round), else
    text."""
    kinds = {t for t in types if not pa.types.is_null(t)}
    if not kinds:
        return pa.null()
    if len(kinds) == 1:
        return kinds.pop()
    if all(pa.types.is_integer(t) for t in kinds):
        return pa.int64()
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in kinds) and not exact:
        return pa.float64()
    return pa.string()


def conform(array: pa.Array, kind: pa.DataType) -> pa.Array:
    """`array` as type `kind` (common_type's): a cast, or as text, JSON for what is not a string."""
    if array.type == kind:
        return array
    if pa.types.is_null(kind):  # a column of nulls only
        return pa.nulls(len(array))
    if not pa.types.is_string(kind) or pa.types.is_large_string(array.type) or pa.types.is_null(array.type):
        return array.cast(kind)
    return pa.array([_as_text(v) for v in array.to_pylist()], pa.string())


def _as_text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return json.dumps(value, ensure_ascii=False, default=str)


def arrow_column(values: list) -> pa.Array:
    """Values read from text files as one Arrow array (their own type when they share one, else text)."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], pa.string()
        )


_DECODE = json.JSONDecoder().raw_decode  # json.loads's own (C) scanner, without json.loads's per-call wrapping


def _json_record(line: bytes):
    """json.loads of the line, in about half its time: one value between JSON whitespace is what json.loads
    returns for it; anything else goes to json.loads, for its value or its ValueError."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = line.decode("utf-8", "surrogateescape")  # the bad bytes stay in the row's values, as its error
    body = text.strip(" \t\n\r")
    try:
        value, end = _DECODE(body)
        if end == len(body):
            return value
    except ValueError:
        pass
    return json.loads(text)


def jsonl_chunks(blocks: Iterable[bytes], columns: list[str], keep: list[str], chunk_rows: int) -> Iterator[Chunk]:
    """The chunks the local job reads a JSONL file in (read_rows), from its bytes read as `blocks` by another
    reader (the Ray job's read tasks): the same parser (_jsonl_records), the same rows and values, the same cuts."""
    for buffer in _batched(_jsonl_records(_file_lines(blocks)), chunk_rows):
        chunk = _chunk(buffer, columns, keep)
        del buffer  # as _read_file
        yield chunk


def _file_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of bytes read as `blocks`, each as iterating over a binary file gives it: with its newline (a
    line's error names where json.loads stopped in it), the last one without where the bytes end without one."""
    pending: list[bytes] = []  # the start of a line that goes on in the next block
    for block in blocks:
        if b"\n" not in block:
            pending.append(block)
            continue
        if pending:
            block = b"".join([*pending, block])
            pending = []
        lines = io.BytesIO(block).readlines()
        if not lines[-1].endswith(b"\n"):
            pending.append(lines.pop())
        yield from lines
    if pending:
        yield b"".join(pending)


def _jsonl_rows(path: Path) -> Iterator[dict]:
    with open(path, "rb") as f:
        yield from _jsonl_records(f)


def _jsonl_records(lines: Iterable[bytes]) -> Iterator[dict]:
    """A JSONL file's rows from its lines: a blank line is none, a line that is no JSON object its row's error."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = _json_record(line)
        except ValueError as e:
            yield {ROW_ERROR: f"line {number} is not JSON: {str(e)[:100]}"}
            continue
        yield record if isinstance(record, dict) else {ROW_ERROR: f"line {number} is not a JSON object"}


def _text(path: Path):
    return io.TextIOWrapper(open(path, "rb"), encoding="utf-8-sig", errors="surrogateescape", newline="")


def _csv_rows(path: Path, format: str) -> Iterator[dict]:
    csv.field_size_limit(sys.maxsize)
    with _text(path) as f:
        reader = csv.reader(f, delimiter="\t" if format == "tsv" else ",")
        header = _header(reader) or []
        for row in reader:
            if not row:
                continue
            yield dict(zip(header, row))


def _header(reader) -> list[str] | None:
    """A CSV/TSV file's header: its first row that is not blank (None: the file has none, and no rows)."""
    return next((row for row in reader if row), None)
