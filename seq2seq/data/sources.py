"""Parallel corpora → a ``datasets.Dataset`` of aligned ``source``/``target`` strings.

Every format is read through Hugging Face ``datasets`` (``load_dataset("text"|"csv"|"json")``
for files, ``load_dataset(path, name)`` for the hub, ``load_from_disk`` for ``save_to_disk``
directories), so the Arrow cache under ``HF_DATASETS_CACHE`` makes a second load of the same
files nearly free (keyed by each file's ``file_identity``, not by its modification time alone,
as ``datasets`` keys it). The formats are described in ``seq2seq.config.SourceConfig``.

Alignment is the one property that must never fail silently, so before a line-based file is
handed to ``datasets`` its bytes are checked here: UTF-8 (the error names the line), the line
count (only ``\\n`` ends a line), and no lone ``\\r``. The last matters because the ``text``
and ``csv`` loaders open files with universal newlines, which would split a line at a stray
``\\r`` and shift every later pair; other separators that ``str.splitlines`` knows (U+2028,
``\\x0b``, ``\\x1c``-``\\x1e``, ...) do not end a line in those loaders and stay in the text.
The loaders' row counts are then checked against these line counts.

After loading, each sentence loses a leading byte-order mark and surrounding whitespace
(``\\r`` of CRLF files included); pairs with an empty side are dropped and counted (or are an
error with ``skip_empty=False``). When nothing needs changing, which is the usual case, the
result is the loader's memory-mapped cache itself, unchanged.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import glob
import gzip
import hashlib
import io
import json
import logging
import os
import re
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets.config
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import (
    Dataset,
    DatasetDict,
    Features,
    Value,
    concatenate_datasets,
    load_dataset,
    load_from_disk,
)

from seq2seq.config import SourceConfig

logger = logging.getLogger(__name__)

FORMATS = ("text", "tsv", "csv", "jsonl", "hub", "disk")
SKIPPED_NAMED = 5  # skipped pairs named in the warning (all of them go to ``skipped``)
_STRING_FEATURES = (Value("string"), Value("large_string"))

# Locates row ``i`` of column ``"source"``/``"target"`` for an error message ("file:line").
Locator = Callable[[str, int], str]


class DataError(ValueError):
    """Bad corpus input; message names the file, line, key or column."""


def load_parallel(
    source: SourceConfig,
    src_lang: str,
    tgt_lang: str,
    *,
    skip_empty: bool = True,
    split_name: str = "train",
    skipped: list[str] | None = None,
) -> Dataset:
    """Load one split of a parallel corpus, in the direction ``src_lang`` → ``tgt_lang``.

    Args:
      source: where the split comes from (format, path, ...; see ``SourceConfig``). The same
        files serve both directions: ``{path}.en``/``{path}.es`` are source/target for en→es
        and target/source for es→en. For ``tsv``/``csv``, ``src_column``/``tgt_column`` name
        header columns or give 0-based numbers; a number means the file has no header row.
        Unset, they are the language codes when the first row holds both (a header), else
        0 and 1. For ``hub``/``disk`` they may name flat columns (default: the
        ``translation`` struct, else columns named by the language codes).
      src_lang / tgt_lang: language codes, e.g. ``"en"``, ``"es"``.
      skip_empty: drop pairs whose source or target is empty after stripping whitespace,
        logging how many and where (a warning naming ``split_name`` and the first
        ``SKIPPED_NAMED`` as ``file:line``); if false such a pair is an error.
      split_name: the split's role (``train``/``dev``/``test``), for messages only.
      skipped: if given, the place of every skipped pair (``file:line`` of its empty side;
        ``file:line (column)`` for tsv/csv/jsonl, ``dataset: row i (column)`` for hub/disk)
        is appended to it, in file order.

    Returns:
      A ``datasets.Dataset`` with exactly two string columns, ``source`` and ``target``;
      row ``i`` of both is one pair, in file order, stripped of surrounding whitespace and
      of a byte-order mark. It is backed by the ``datasets`` cache when possible.

    Raises:
      DataError: unknown format; missing file, directory, split, JSON key or column; invalid
        UTF-8 (file and 1-based line); a lone ``\\r`` inside a line; text files whose line
        counts differ (both files and counts); a TSV/CSV line with the wrong number of fields;
        invalid JSON; a null or non-string sentence; an empty side with ``skip_empty=False``;
        no pair left at all.
    """
    if src_lang == tgt_lang:
        raise DataError(f"{split_name}: source and target language are both {src_lang!r}")
    files = input_files(source, src_lang, tgt_lang)
    key = None
    if files is not None:  # plain files: the same read of unchanged files is not done twice
        identities = (tuple(file_identity(f).values()) for f in files)
        key = (repr(source), src_lang, tgt_lang, skip_empty, split_name, *files, *identities)
        if key in _READ:
            ds, known = _READ[key]
            if skipped is not None:
                skipped.extend(known)
            return ds
    places: list[str] = []
    ds = _load_parallel(source, src_lang, tgt_lang, skip_empty, split_name, places)
    if skipped is not None:
        skipped.extend(places)
    if key is not None:
        _READ[key] = (ds, places)
        while len(_READ) > 4:
            del _READ[next(iter(_READ))]
    return ds


SAMPLE_BLOCK = 1 << 16  # bytes per block that ``file_identity`` hashes
SAMPLE_BLOCKS = 16  # such blocks per file: the first, the last and evenly spaced ones


def file_identity(path: str | Path) -> dict[str, Any]:
    """What tells a file's contents apart without reading it whole: its size, inode,
    modification and change times (ns) and a SHA-256 of ``SAMPLE_BLOCKS`` blocks of
    ``SAMPLE_BLOCK`` bytes spread evenly from its first to its last byte (the whole file up
    to 1 MiB): a ``stat`` and at most 1 MiB read.

    A rewrite with other content changes it when it went through the file system (that sets
    the change time, which ``touch -r``, ``os.utime`` and archive extraction cannot put
    back), replaced the file (another inode) or touched a sampled block; only an edit outside
    the sampled blocks that leaves the size and both times as they were (a clock too coarse
    to tell) goes unseen.

    Raises:
      OSError: the file cannot be read.
    """
    path = Path(path)
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if st.st_size <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
            h.update(f.read())
        else:
            for k in range(SAMPLE_BLOCKS):
                f.seek(k * (st.st_size - SAMPLE_BLOCK) // (SAMPLE_BLOCKS - 1))
                h.update(f.read(SAMPLE_BLOCK))
    return {
        "size": st.st_size,
        "inode": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "sample": h.hexdigest(),
    }


# The last few plain-file reads of this process (``load_parallel``): the recipe's count and
# the data preparation of one command read the training corpus once. Datasets are memory-
# mapped from the ``datasets`` cache, so keeping them costs no copy of the text.
_READ: dict[tuple, tuple[Dataset, list[str]]] = {}


def _load_parallel(
    source: SourceConfig,
    src_lang: str,
    tgt_lang: str,
    skip_empty: bool,
    split_name: str,
    skipped: list[str],
) -> Dataset:
    fmt = source.format
    if fmt == "text":
        ds, locate = _load_text(source, src_lang, tgt_lang, split_name)
        where = f"{source.path}.{{{src_lang},{tgt_lang}}}"
    elif fmt in ("tsv", "csv"):
        ds, locate = _load_delimited(source, src_lang, tgt_lang, fmt)
        where = source.path
    elif fmt == "jsonl":
        ds, locate = _load_jsonl(source, src_lang, tgt_lang)
        where = source.path
    elif fmt in ("hub", "disk"):
        ds, where = _load_hub(source) if fmt == "hub" else _load_disk(source)
        ds = _pick_columns(ds, source, src_lang, tgt_lang, where)
        locate = lambda column, i: f"{where}: row {i} ({column})"  # noqa: E731
    else:
        raise DataError(
            f"{split_name}: unknown source format {fmt!r} (expected one of {', '.join(FORMATS)})"
        )
    ds = _clean(
        ds, locate, skip_empty=skip_empty, split_name=split_name, where=where, skipped=skipped
    )
    logger.info("%s: %d pairs %s→%s from %s", split_name, len(ds), src_lang, tgt_lang, where)
    return ds


def input_files(source: SourceConfig, src_lang: str, tgt_lang: str) -> list[Path] | None:
    """The files ``load_parallel`` reads for ``source`` (``{path}.{lang}`` or ``.gz`` for
    ``text``, the one file of ``tsv``/``csv``/``jsonl``), or None when they are not plain files
    (``hub``/``disk``) or one is missing (reading will then name the problem)."""
    if source.format == "text":
        names = [f"{source.path}.{lang}" for lang in (src_lang, tgt_lang)]
    elif source.format in ("tsv", "csv", "jsonl"):
        names = [source.path]
    else:
        return None
    files = []
    for name in names:
        path, gz = Path(name), Path(name + ".gz")
        if not (path.is_file() or gz.is_file()):
            return None
        files.append(path if path.is_file() else gz)
    return files


def source_hashes(sentences: Sequence[str]) -> np.ndarray:
    """uint64 ``[n]``: a 64-bit BLAKE2b hash of each sentence (its UTF-8 bytes), to find
    exact repeats across splits without keeping the text (``overlap_count``)."""
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                "little",
            )
            for s in sentences
        ),
        np.uint64,
        len(sentences),
    )


def overlap_count(train_hashes: np.ndarray, other: Dataset) -> int:
    """``overlap_report`` from the training sources' ``source_hashes`` (sorted, unique): how
    many rows of ``other`` have a source whose hash is among them (a false match needs a
    64-bit collision)."""
    if len(train_hashes) == 0 or len(other) == 0:
        return 0
    query = source_hashes(list(other["source"]))
    at = np.minimum(np.searchsorted(train_hashes, query), len(train_hashes) - 1)
    return int(np.count_nonzero(train_hashes[at] == query))  # binary search: no sort of train


def overlap_report(train: Dataset, other: Dataset) -> int:
    """How many rows of ``other`` have a ``source`` that also occurs in ``train``.

    Exact string match (after ``load_parallel``'s whitespace stripping); a sentence repeated
    in ``other`` counts each time. Used to report dev/test contamination.

    Returns:
      The number of such rows, 0 … ``len(other)``.

    Raises:
      KeyError: a dataset has no ``source`` column.
    """
    if len(train) == 0 or len(other) == 0:
        return 0
    seen = pc.unique(train.with_format("arrow")["source"])
    hits = pc.is_in(other.with_format("arrow")["source"], value_set=seen)
    return int(pc.sum(hits).as_py() or 0)


# ---------------------------------------------------------------------------------------------
# Byte-level checks of line-based files


def _existing(path: str) -> Path:
    """``path`` if it exists, else ``path.gz``; DataError naming both if neither does."""
    p = Path(path)
    gz = Path(path + ".gz")
    if p.is_file():
        if gz.is_file():
            logger.warning("both %s and %s exist; reading %s", p, gz, p)
        return p
    if gz.is_file():
        return gz
    raise DataError(f"file not found: {p} (nor {gz.name})")


def decode_text(data: bytes, name: str | Path, lines_before: int = 0) -> str:
    """UTF-8 ``data`` as text without a leading byte-order mark.

    Raises DataError for invalid UTF-8, naming ``name``, the 1-based line (counted after
    ``lines_before`` lines: ``data`` may be a later block of the file) and the byte.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{name}:{line}: invalid UTF-8 (byte 0x{data[e.start]:02x} at byte "
            f"{column} of the line)"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped if the name ends in ``.gz``; DataError if unreadable."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read: {e}") from e
    return data


def _read_checked(path: Path) -> str:
    """The file's text (``decode_text``), gzip if the name ends in ``.gz``.

    Raises DataError for an unreadable or corrupt file, invalid UTF-8 or a ``\\r`` not
    followed by ``\\n`` (file:line).
    """
    return _checked_text(_read_bytes(path), path)


def _checked_text(data: bytes, path: Path, lines_before: int = 0) -> str:
    """``decode_text`` of whole lines ``data`` that follow ``lines_before`` lines of the file,
    and DataError (file:line) for a ``\\r`` not followed by ``\\n``."""
    text = decode_text(data, path, lines_before)
    if data.count(b"\r") != data.count(b"\r\n"):
        bare = re.search(r"\r(?!\n)", text)
        assert bare is not None  # more \r than \r\n
        line = lines_before + text.count("\n", 0, bare.start()) + 1
        raise DataError(
            f"{path}:{line}: carriage return (\\r) inside a line; datasets would "
            "read it as a line break and misalign the pairs (use \\n or \\r\\n "
            "line ends)"
        )
    return text


CHECK_BYTES = 1 << 24  # bytes of a text file checked at a time (``_checked_line_count``)


def _checked_line_count(path: Path) -> int:
    """The line count of ``_read_checked(path)``'s text, with its checks and errors
    (file:line), read ``CHECK_BYTES`` at a time: a WMT-size file is never all in memory."""
    lines, rest, start = 0, b"", True
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHECK_BYTES), b""):
                data = rest + chunk
                if start and data.startswith(codecs.BOM_UTF8):
                    data, start = data[len(codecs.BOM_UTF8) :], False
                elif len(data) >= len(codecs.BOM_UTF8):
                    start = False
                cut = data.rfind(b"\n") + 1
                if cut:
                    _checked_text(data[:cut], path, lines)
                    lines += data.count(b"\n", 0, cut)
                rest = data[cut:]
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read: {e}") from e
    if start and rest.startswith(codecs.BOM_UTF8):  # a file of fewer bytes than its BOM
        rest = rest[len(codecs.BOM_UTF8) :]
    if rest:
        _checked_text(rest, path, lines)
        lines += 1
    return lines


def read_lines(path: str | Path | None) -> list[str]:
    """Lines of a UTF-8 file, ``.gz`` or standard input (None or ``-``), as the training
    loaders read them: no byte-order mark, ``\\n`` ends a line, the ``\\r`` of CRLF dropped.
    Lines are not stripped; a lone ``\\r`` stays inside its line.

    Raises:
      DataError: the file cannot be read, or invalid UTF-8 (the message names file and line).
    """
    if path in (None, "-"):
        return _split_lines(decode_text(sys.stdin.buffer.read(), "<stdin>"))
    return _split_lines(decode_text(_read_bytes(Path(path)), path))


def _split_lines(text: str) -> list[str]:
    """Lines ended by ``\\n`` only (``\\r`` of CRLF removed); no phantom line after the last."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


@contextlib.contextmanager
def _no_download_count():
    """Skip the HEAD request ``load_dataset`` sends to count uses of the packaged builders.

    That request is pure telemetry for local files, and without a network its DNS lookup can
    stall a load by seconds.
    """
    saved = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = saved


def _hf_load(builder: str, path: Path, **kwargs) -> Dataset:
    """``load_dataset(builder, data_files=path)``'s one split; errors become DataError.

    The config is named after the file's ``file_identity``: ``datasets`` keys its cache of a
    local file by the modification time alone, so a rewrite that puts the time back would
    otherwise read the old text from the cache."""
    identity = json.dumps(file_identity(path), sort_keys=True)
    name = "file-" + hashlib.sha256(identity.encode()).hexdigest()[:16]
    try:
        with _no_download_count():
            return load_dataset(
                builder,
                name=name,
                data_files={"train": [os.path.abspath(path)]},
                split="train",
                **kwargs,
            )
    except Exception as e:  # noqa: BLE001 - any loader failure is a bad input file here
        cause = e.__cause__ or e
        raise DataError(f"{path}: datasets could not read it as {builder}: {cause}") from e


# ---------------------------------------------------------------------------------------------
# Formats


def _load_text(
    source: SourceConfig, src_lang: str, tgt_lang: str, split_name: str
) -> tuple[Dataset, Locator]:
    for lang in (src_lang, tgt_lang):
        if not any(Path(f"{source.path}.{lang}{gz}").is_file() for gz in ("", ".gz")):
            prefix = Path(source.path)
            found = sorted(
                {
                    f.name[len(prefix.name) + 1 :].removesuffix(".gz")
                    for f in prefix.parent.glob(glob.escape(prefix.name) + ".*")
                }
            )
            raise DataError(
                f"{split_name}: file not found: {prefix}.{lang} (nor "
                f"{prefix.name}.{lang}.gz) for language {lang!r}; languages "
                f"found for {prefix}: {', '.join(found) or 'none'}"
            )
    files = [_existing(f"{source.path}.{lang}") for lang in (src_lang, tgt_lang)]
    counts = [_checked_line_count(f) for f in files]
    if counts[0] != counts[1]:
        raise DataError(
            f"{split_name}: {files[0]} has {counts[0]} lines but {files[1]} has "
            f"{counts[1]}; the two sides must be line-aligned"
        )
    if counts[0] == 0:
        raise DataError(f"{split_name}: {files[0]} and {files[1]} are empty")
    sides = []
    for f, n, column in zip(files, counts, ("source", "target")):
        ds = _hf_load("text", f, encoding="utf-8-sig")
        if len(ds) != n:  # the loader split lines differently from us: never misalign
            raise DataError(f"{f}: datasets read {len(ds)} lines where the file has {n}")
        sides.append(ds.rename_column("text", column))
    ds = concatenate_datasets(sides, axis=1)
    return ds, lambda column, i: f"{files[column == 'target']}:{i + 1}"


def _is_number(column: str | int | None) -> bool:
    return isinstance(column, int) or (isinstance(column, str) and column.isdigit())


def _load_delimited(
    source: SourceConfig, src_lang: str, tgt_lang: str, fmt: str
) -> tuple[Dataset, Locator]:
    path = _existing(source.path)
    text = _read_checked(path)
    sep = "\t" if fmt == "tsv" else ","
    # records (fields of each row) and the 1-based line each starts on
    if fmt == "tsv":  # no quoting: a '"' in a sentence is just a character
        records = [line.split("\t") for line in _split_lines(text)]
        starts = None
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
        records, starts, line = [], [], 1
        for row in reader:
            records.append(row)
            starts.append(line)
            line = reader.line_num + 1
    if not records:
        raise DataError(f"{path}: empty file")
    start = (lambda r: starts[r]) if starts else (lambda r: r + 1)

    # a column is a header name or a 0-based index (given as a number or its string)
    src_col: Any = source.src_column
    tgt_col: Any = source.tgt_column
    first = [field.strip() for field in records[0]]
    if src_col is None and tgt_col is None:
        named = src_lang in first and tgt_lang in first
        src_col, tgt_col = (src_lang, tgt_lang) if named else (0, 1)
    elif src_col is None or tgt_col is None:
        given = src_col if src_col is not None else tgt_col
        named = not _is_number(given)
        default = (src_lang, tgt_lang) if named else (0, 1)
        src_col = src_col if src_col is not None else default[0]
        tgt_col = tgt_col if tgt_col is not None else default[1]
    else:
        named = not _is_number(src_col)
        if named == _is_number(tgt_col):
            raise DataError(
                f"{path}: src_column {src_col!r} and tgt_column {tgt_col!r} must "
                "both be names or both be numbers"
            )

    width = len(records[0])
    kind = "tab-separated" if fmt == "tsv" else "comma-separated"
    for r, fields in enumerate(records):
        if len(fields) != width:
            raise DataError(
                f"{path}:{start(r)}: expected {width} {kind} fields (as on line "
                f"{start(0)}), got {len(fields)}"
            )
    if named:
        names = first
        for role, col in (("source", src_col), ("target", tgt_col)):
            if col not in names:
                raise DataError(
                    f"{path}: no column {col!r} for the {role} in the header "
                    f"(columns: {', '.join(names)})"
                )
        if len(set(names)) != len(names):
            raise DataError(f"{path}: duplicate column names in the header: {names}")
        rows = len(records) - 1
    else:
        names = [str(i) for i in range(width)]
        for role, col in (("source", src_col), ("target", tgt_col)):
            if int(col) >= width:
                raise DataError(
                    f"{path}: no column {col} for the {role}: lines have {width} fields"
                )
        src_col, tgt_col = str(int(src_col)), str(int(tgt_col))
        rows = len(records)
    if src_col == tgt_col:
        raise DataError(f"{path}: source and target are the same column {src_col!r}")
    if rows == 0:
        raise DataError(f"{path}: no rows after the header")

    ds = _hf_load(
        "csv",
        path,
        sep=sep,
        header=0 if named else None,
        column_names=names,
        quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
        keep_default_na=False,
        na_filter=False,
        skip_blank_lines=False,
        lineterminator="\n",
        encoding="utf-8-sig",
        features=Features({name: Value("string") for name in names}),
    )
    if len(ds) != rows:
        raise DataError(f"{path}: datasets read {len(ds)} rows where the file has {rows}")
    ds = _rename(ds.select_columns([src_col, tgt_col]), src_col, tgt_col)
    offset = 1 if named else 0
    return ds, lambda column, i: f"{path}:{start(i + offset)} ({column} column)"


def _parent_keys(row: object, key: tuple[str, ...]) -> list[str] | None:
    """The keys of the object that should hold ``key[-1]`` in ``row`` (None: no such object)."""
    for part in key[:-1]:
        row = row.get(part) if isinstance(row, dict) else None
    return list(row) if isinstance(row, dict) else None


def _missing_key(text: str, number: int, key: tuple[str, ...]) -> tuple[int | None, str]:
    """Line ``number`` lacks ``key``: (number, the keys it has), or (None, the keys the rows
    have) when no row has ``key`` (a language code that the file does not hold)."""
    rows = [json.loads(line) for line in text.split("\n") if line.strip()]
    if not any(key[-1] in (_parent_keys(r, key) or ()) for r in rows):
        seen = sorted({k for r in rows for k in (_parent_keys(r, key) or ())})
        return None, f"no row has key {'.'.join(key)!r} (keys seen: {', '.join(seen) or 'none'})"
    has = _parent_keys(json.loads(text.split("\n")[number - 1]), key)
    return number, (
        f"missing key {'.'.join(key)!r} (the row has: "
        f"{', '.join(has) if has is not None else 'no ' + repr(key[0]) + ' object'})"
    )


def _jsonl_problem(text: str, keys: Sequence[tuple[str, ...]]) -> tuple[int | None, str] | None:
    """First line (1-based) that is not an object with a string at one of the ``keys``, and
    why (line None: no row has the key)."""
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            return number, f"invalid JSON: {e.msg} (column {e.colno})"
        for key in keys:
            value = row
            for part in key:
                if not isinstance(value, dict) or part not in value:
                    return _missing_key(text, number, key)
                value = value[part]
            if not isinstance(value, str):
                return number, f"key {'.'.join(key)!r} is {json.dumps(value)}, not a string"
    return None


def _load_jsonl(source: SourceConfig, src_lang: str, tgt_lang: str) -> tuple[Dataset, Locator]:
    path = _existing(source.path)
    text = _read_checked(path)
    line_of = [n for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not line_of:
        raise DataError(f"{path}: empty file")

    def fail(keys: Sequence[tuple[str, ...]], fallback: str) -> DataError:
        found = _jsonl_problem(text, keys)
        if found:
            return DataError(f"{path}{'' if found[0] is None else f':{found[0]}'}: {found[1]}")
        return DataError(f"{path}: {fallback}")

    try:
        ds = _hf_load("json", path)
    except DataError as e:
        raise fail([], str(e)) from e
    if len(ds) != len(line_of):
        raise DataError(
            f"{path}: datasets read {len(ds)} rows where the file has "
            f"{len(line_of)} non-blank lines (one JSON object per line expected)"
        )
    translation = ds.features.get("translation")
    if translation is not None:
        keys: list[tuple[str, ...]] = [("translation", src_lang), ("translation", tgt_lang)]
        if not isinstance(translation, dict):
            raise fail(keys, f"'translation' is {translation}, not an object of strings")
        for key in keys:
            if key[1] not in translation:
                raise DataError(
                    f"{path}: missing key {'.'.join(key)!r} in every row "
                    f"(languages: {', '.join(translation)})"
                )
        ds = ds.select_columns(["translation"]).flatten()
    else:
        keys = [(src_lang,), (tgt_lang,)]
        for key in keys:
            if key[0] not in ds.features:
                raise DataError(
                    f"{path}: missing key {key[0]!r} in every row (keys: "
                    f"{', '.join(ds.column_names)}; or use "
                    '{"translation": {lang: ...}})'
                )
    columns = [".".join(key) for key in keys]
    for column in columns:
        if ds.features[column] not in _STRING_FEATURES:
            raise fail(keys, f"key {column!r} holds {ds.features[column]}, not strings")
    ds = _rename(ds.select_columns(columns), *columns)
    if any(ds.with_format("arrow")[c].null_count for c in ("source", "target")):
        raise fail(keys, "a null sentence")  # a missing key reads as null: name the row
    return ds, lambda column, i: f"{path}:{line_of[i]} ({column})"


def _load_hub(source: SourceConfig) -> tuple[Dataset, str]:
    where = f"hub dataset {source.path!r}" + (f" ({source.name})" if source.name else "")
    where += f" split {source.split!r}"
    if not source.path:
        raise DataError("hub source without a path (the dataset name)")
    try:
        ds = load_dataset(source.path, source.name, split=source.split)
    except Exception as e:  # noqa: BLE001 - not found, no network, no such split or config
        raise DataError(f"{where}: cannot load: {e}") from e
    return ds, where


def _load_disk(source: SourceConfig) -> tuple[Dataset, str]:
    path = Path(source.path)
    if not path.is_dir():
        raise DataError(f"dataset directory not found: {path}")
    try:
        loaded = load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - not a save_to_disk directory
        raise DataError(f"{path}: not a datasets save_to_disk directory: {e}") from e
    if isinstance(loaded, DatasetDict):
        if source.split not in loaded:
            raise DataError(f"{path}: no split {source.split!r} (splits: {', '.join(loaded)})")
        return loaded[source.split], f"{path} split {source.split!r}"
    return loaded, str(path)


def _pick_columns(
    ds: Dataset, source: SourceConfig, src_lang: str, tgt_lang: str, where: str
) -> Dataset:
    """The source and target columns of a hub/disk dataset, renamed ``source``/``target``."""
    if source.src_column is not None or source.tgt_column is not None:
        columns = [source.src_column or src_lang, source.tgt_column or tgt_lang]
        if any("." in c for c in columns):
            ds = ds.select_columns(
                sorted({c.split(".")[0] for c in columns} & set(ds.column_names))
            ).flatten()
    elif "translation" in ds.column_names:
        translation = ds.features["translation"]
        languages = list(
            getattr(translation, "languages", None)
            or (translation if isinstance(translation, dict) else [])
        )
        for lang in (src_lang, tgt_lang):
            if lang not in languages:
                raise DataError(
                    f"{where}: 'translation' has no language {lang!r} "
                    f"(has: {', '.join(languages) or translation})"
                )
        ds = ds.select_columns(["translation"]).flatten()
        columns = [f"translation.{src_lang}", f"translation.{tgt_lang}"]
    else:
        columns = [src_lang, tgt_lang]
    for column in columns:
        if column not in ds.column_names:
            raise DataError(
                f"{where}: no column {column!r} (columns: {', '.join(ds.column_names)})"
            )
        if ds.features[column] not in _STRING_FEATURES:
            raise DataError(f"{where}: column {column!r} holds {ds.features[column]}, not strings")
    if columns[0] == columns[1]:
        raise DataError(f"{where}: source and target are the same column {columns[0]!r}")
    return _rename(ds.select_columns(columns), *columns)


def _rename(ds: Dataset, src_col: str, tgt_col: str) -> Dataset:
    """Rename two columns to ``source``/``target`` (in that order), whatever they were."""
    if (src_col, tgt_col) != ("source", "target"):
        ds = ds.rename_columns({src_col: "\0src", tgt_col: "\0tgt"})
        ds = ds.rename_columns({"\0src": "source", "\0tgt": "target"})
    return ds.select_columns(["source", "target"])


# ---------------------------------------------------------------------------------------------
# Cleaning: strip, drop empty pairs


CLEAN_ROWS = 1 << 20  # rows of a split checked at a time (``_clean``)


def _strip(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Drop a leading byte-order mark and surrounding (Unicode) whitespace."""
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(array, "^\ufeff", ""))


def _strip_and_drop_empty(batch: pa.Table) -> pa.Table:
    """Batched map for ``_clean``: strip both columns, drop rows with an empty side."""
    source, target = _strip(batch["source"]), _strip(batch["target"])
    keep = pc.and_(pc.greater(pc.utf8_length(source), 0), pc.greater(pc.utf8_length(target), 0))
    return pa.table({"source": source, "target": target}).filter(keep)


def _clean(
    ds: Dataset,
    locate: Locator,
    *,
    skip_empty: bool,
    split_name: str,
    where: str,
    skipped: list[str] | None = None,
) -> Dataset:
    table = ds.with_format("arrow")[:]
    changed = False
    empties, source_empties = [], []
    # checked CLEAN_ROWS rows at a time: the stripped copies of a WMT-size column never
    # exist all at once
    for first in range(0, len(table), CLEAN_ROWS):
        part = table.slice(first, CLEAN_ROWS)
        empty = None
        for column in ("source", "target"):
            values = part[column]
            if values.null_count:
                i = first + pc.index(pc.is_null(values), True).as_py()
                raise DataError(f"{locate(column, i)}: missing (null) sentence")
            stripped = _strip(values)
            changed = changed or not pc.all(pc.equal(stripped, values)).as_py()
            is_empty = pc.equal(pc.utf8_length(stripped), 0)
            del stripped
            if not skip_empty and pc.any(is_empty).as_py():
                i = first + pc.index(is_empty, True).as_py()
                raise DataError(f"{locate(column, i)}: empty {column} sentence (skip_empty is off)")
            if column == "source":
                source_empties.append(is_empty)
            empty = is_empty if empty is None else pc.or_(empty, is_empty)
        empties.append(empty)
    empty = pa.chunked_array(empties, pa.bool_())
    n_empty = int(pc.sum(empty).as_py() or 0) if len(table) else 0
    if changed or n_empty:  # cached like any map: a second load reads the result back
        ds = (
            ds.with_format("arrow")
            .map(_strip_and_drop_empty, batched=True, desc=f"Cleaning {split_name}")
            .with_format(None)
        )
    if n_empty:
        source_empty = pa.chunked_array(source_empties, pa.bool_()).to_pylist()
        places = [
            locate("source" if source_empty[i] else "target", i)
            for i in pc.indices_nonzero(empty).to_pylist()
        ]
        if skipped is not None:
            skipped.extend(places)
        more = f" and {n_empty - SKIPPED_NAMED} more" if n_empty > SKIPPED_NAMED else ""
        logger.warning(
            "%s: skipped %d of %d pairs with an empty source or target (%s): %s%s",
            split_name,
            n_empty,
            len(table),
            where,
            ", ".join(places[:SKIPPED_NAMED]),
            more,
        )
    if len(ds) == 0:
        raise DataError(f"{split_name}: no pairs left in {where}")
    return ds
