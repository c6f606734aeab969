"""Read a statement file: a path (or bytes) → header and rows, or one clear
refusal, with memory bounded by one line, not by the file.

A statement is a CSV export (RFC 4180; ``,``, ``;`` or tab, whichever the
header line uses most), in UTF-8 with or without a byte-order mark (Excel's
"CSV UTF-8" writes one), or an Excel workbook (``.xlsx``, its first sheet,
read with openpyxl in read-only mode, row by row). Refused with ``BadFile``
(one line, nothing applied): an empty file or one without data lines, a
UTF-16/UTF-32 export, bytes that are not UTF-8, a last line without its line
ending (a truncated download), an unterminated quote, a line whose field
count is not the header's, a blank or repeated column name, a workbook that
cannot be opened (a truncated download of one included) or whose parts
expand past ``MAX_XLSX_EXPANDED_BYTES`` (a ZIP bomb: refused before a byte
of it is inflated).

``rows`` is read lazily: the header is known (and checked by the caller)
before any line is read, and a refusal found further in (a byte that is not
UTF-8 on line 900,000) is raised while iterating, before anything is
written.

Workbook cells become the text a CSV would hold: numbers by their shortest
decimal form (``10.5``; amounts are then read as decimals, never as floats, so
a cell holding ``10.499999999`` is an unreadable amount, not ``10.50``),
dates and times as ISO 8601.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import itertools
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator


class BadFile(ValueError):
    """The file cannot be a statement; the message is one line for the
    operator. Nothing was applied."""


@dataclass
class RawStatement:
    """``sha256``: lower-case hex of the file's bytes; ``header``: column
    names (surrounding spaces stripped); ``rows``: ``(line_no, fields)`` with
    ``line_no`` the file's line where the record ends (the header is 1),
    read lazily (``read`` answers a list; ``open_path`` an iterator, once)."""

    sha256: str
    header: list[str]
    rows: Iterable[tuple[int, list[str]]]


_OTHER_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
               (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


_XLSX_MAGIC = b"PK\x03\x04"  # a ZIP archive: an .xlsx workbook

MAX_STATEMENT_BYTES = 200 * 1024 * 1024
"""The largest statement file read (bytes, 200 MiB): a month of a busy
merchant's CSV is a few tens of MiB; a larger file is refused before it is
read, so a wrong path (``/dev/zero``, a disk image) cannot fill memory
(docs/flows/statements.md, "Bad files")."""

MAX_XLSX_EXPANDED_BYTES = 1024 * 1024 * 1024
"""The most a workbook's parts may expand to (bytes, 1 GiB, as their ZIP
directory declares; Python's zipfile never inflates past a declared size).
Sheet XML is about five times its CSV, so a workbook of a 200 MiB
statement fits; a ZIP bomb (a few MiB expanding to gigabytes) is refused
before anything is inflated."""

_CHUNK = 1024 * 1024


def read_path(path) -> RawStatement:
    """The statement file at ``path`` (``str`` or ``Path``), its rows read
    lazily from the open file. Raises ``BadFile`` when it is not a regular
    file (a device, a FIFO: it could be read forever or block), is larger
    than ``MAX_STATEMENT_BYTES``, or is refused (see the module; a refusal
    further in is raised while iterating ``rows``); ``OSError`` when it
    cannot be opened."""
    import os
    import stat

    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise BadFile("not a regular file (a device, pipe or socket): give the statement file itself")
    # O_NONBLOCK: a path swapped for a FIFO after the stat cannot block the open.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    handle = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BadFile("not a regular file (a device, pipe or socket): give the statement file itself")
        digest, size, newlines = _scan(handle)
        return _open(handle, digest, size, newlines)
    except BaseException:
        handle.close()
        raise


def read(data: bytes) -> RawStatement:
    """Parse a statement's bytes, every row read (a list). Raises
    ``BadFile`` (see the module)."""
    handle = io.BytesIO(data)
    digest, size, newlines = _scan(handle)
    raw = _open(handle, digest, size, newlines)
    rows = list(raw.rows)
    return RawStatement(raw.sha256, raw.header, rows)


def _scan(handle: BinaryIO) -> tuple[str, int, int]:
    """SHA-256, size and line-feed count of the whole file, one chunk at a
    time; refuses a file past ``MAX_STATEMENT_BYTES`` (bounded even if the
    file grows meanwhile)."""
    digest, size, newlines = hashlib.sha256(), 0, 0
    while chunk := handle.read(_CHUNK):
        size += len(chunk)
        if size > MAX_STATEMENT_BYTES:
            raise BadFile(f"larger than {MAX_STATEMENT_BYTES // (1024 * 1024)} MiB (MAX_STATEMENT_BYTES): "
                          "split the statement by period")
        digest.update(chunk)
        newlines += chunk.count(b"\n")
    handle.seek(0)
    return digest.hexdigest(), size, newlines


def _open(handle: BinaryIO, digest: str, size: int, newlines: int) -> RawStatement:
    head = handle.read(_CHUNK)
    handle.seek(0)
    if not head.strip() and size <= len(head):
        raise BadFile("the file is empty")
    if head.startswith(_XLSX_MAGIC):
        header, rows = _read_xlsx(handle)
        return _finish(digest, header, rows)
    for bom, name in _OTHER_BOMS:  # UTF-32 LE starts like UTF-16 LE: longest first
        if head.startswith(bom):
            raise BadFile(f"the file is {name} (it starts with a {name} byte-order mark): "
                          "export the statement as CSV UTF-8")
    handle.seek(size - 1)
    if handle.read(1) not in (b"\n", b"\r"):
        raise BadFile(f"the last line (line {newlines + 1}) has no line ending: the file looks truncated")
    handle.seek(0)
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="strict", newline="")
    try:
        first = text.readline()
    except UnicodeDecodeError:
        raise _not_utf8(handle) from None
    delimiter = max((",", ";", "\t"), key=first.count)
    reader = csv.reader(itertools.chain([first], text), delimiter=delimiter, strict=True)
    try:
        header = [name.strip() for name in next(reader)]
    except csv.Error as exc:
        raise BadFile(f"line {reader.line_num}: {exc}") from None
    return _finish(digest, header, _csv_rows(reader, header, handle))


def _csv_rows(reader, header: list[str], handle: BinaryIO) -> Iterator[tuple[int, list[str]]]:
    any_row = False
    try:
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue  # a blank line
            if len(fields) != len(header):
                raise BadFile(f"line {reader.line_num} has {len(fields)} fields, the header has "
                              f"{len(header)}")
            any_row = True
            yield reader.line_num, fields
    except csv.Error as exc:
        raise BadFile(f"line {reader.line_num}: {exc}") from None
    except UnicodeDecodeError:
        raise _not_utf8(handle) from None
    if not any_row:
        raise BadFile("the file has no lines after the header")


def _not_utf8(handle: BinaryIO) -> BadFile:
    """Where the first byte that is not UTF-8 is (its line), found by
    decoding the file again from the start; only on that refusal."""
    handle.seek(0)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    line = 1
    while chunk := handle.read(_CHUNK):
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            # exc.object is the chunk after the few bytes the decoder held
            # back (an unfinished character: never a line feed)
            line += exc.object[:exc.start].count(b"\n")
            return BadFile(f"line {line} is not UTF-8 (byte 0x{exc.object[exc.start]:02x}): "
                           "export the statement as CSV UTF-8")
        line += chunk.count(b"\n")
    return BadFile("the file is not UTF-8: export the statement as CSV UTF-8")


def _finish(digest: str, header: list[str], rows: Iterable[tuple[int, list[str]]]) -> RawStatement:
    if any(not name for name in header):
        raise BadFile("the header has a blank column name")
    repeated = sorted({n for n in header if header.count(n) > 1})
    if repeated:
        raise BadFile(f"the header repeats column {repeated[0]!r}")
    return RawStatement(sha256=digest, header=header, rows=rows)


def _read_xlsx(handle: BinaryIO) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The first sheet of a workbook: its first non-blank row is the header
    (trailing blank columns dropped), every later non-blank row a line
    numbered as Excel numbers it, read lazily. The ZIP directory's sizes are
    checked before anything is inflated."""
    import zipfile

    import openpyxl
    try:
        with zipfile.ZipFile(handle) as archive:
            expanded = sum(info.file_size for info in archive.infolist())
        handle.seek(0)
        if expanded > MAX_XLSX_EXPANDED_BYTES:
            raise BadFile(f"the workbook expands to {expanded // (1024 * 1024)} MiB, more than "
                          f"{MAX_XLSX_EXPANDED_BYTES // (1024 * 1024)} MiB (MAX_XLSX_EXPANDED_BYTES): "
                          "export the statement as CSV, or split it by period")
        book = openpyxl.load_workbook(handle, read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError) as exc:
        if isinstance(exc, BadFile):
            raise
        raise BadFile(f"not a readable .xlsx workbook ({exc.__class__.__name__}): "
                      "the file may be truncated") from None
    try:
        sheet = book.worksheets[0]
        numbered = enumerate(sheet.iter_rows(values_only=True), start=1)
        header: list[str] | None = None
        for number, cells in numbered:
            fields = [_cell_text(v) for v in cells]
            if not any(f.strip() for f in fields):
                continue
            while fields and not fields[-1].strip():
                fields.pop()
            header = [f.strip() for f in fields]
            break
    except Exception:
        book.close()
        raise
    if header is None:
        book.close()
        raise BadFile("the workbook's first sheet is empty")
    return header, _xlsx_rows(book, numbered, header)


def _xlsx_rows(book, numbered, header: list[str]) -> Iterator[tuple[int, list[str]]]:
    any_row = False
    try:
        for number, cells in numbered:
            fields = [_cell_text(v) for v in cells]
            if not any(f.strip() for f in fields):
                continue
            extra = fields[len(header):]
            if any(f.strip() for f in extra):
                raise BadFile(f"row {number} has a value beyond the header's {len(header)} columns")
            any_row = True
            yield number, (fields + [""] * len(header))[:len(header)]
    finally:
        book.close()
    if not any_row:
        raise BadFile("the file has no lines after the header")


def _cell_text(value) -> str:
    from datetime import date, datetime, time
    from decimal import Decimal
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")  # the shortest decimal that is this double
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    return str(value)
