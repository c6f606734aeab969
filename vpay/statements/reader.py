"""Read a statement file: bytes → header and rows, or one clear refusal.

A statement is a CSV export (RFC 4180; ``,``, ``;`` or tab, whichever the
header line uses most), in UTF-8 with or without a byte-order mark (Excel's
"CSV UTF-8" writes one), or an Excel workbook (``.xlsx``, its first sheet,
read with openpyxl). Refused with ``BadFile`` (one line, nothing applied): an
empty file or one without data lines, a UTF-16/UTF-32 export, bytes that are
not UTF-8, a last line without its line ending (a truncated download), an
unterminated quote, a line whose field count is not the header's, a blank or
repeated column name, a workbook that cannot be opened (a truncated download
of one included).

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
from dataclasses import dataclass


class BadFile(ValueError):
    """The file cannot be a statement; the message is one line for the
    operator. Nothing was applied."""


@dataclass(frozen=True)
class RawStatement:
    """``sha256``: lower-case hex of the file's bytes; ``header``: column
    names (surrounding spaces stripped); ``rows``: ``(line_no, fields)`` with
    ``line_no`` the file's line where the record ends (the header is 1)."""

    sha256: str
    header: list[str]
    rows: list[tuple[int, list[str]]]


_OTHER_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
               (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


_XLSX_MAGIC = b"PK\x03\x04"  # a ZIP archive: an .xlsx workbook

MAX_STATEMENT_BYTES = 200 * 1024 * 1024
"""The largest statement file read (bytes, 200 MiB): a month of a busy
merchant's CSV is a few tens of MiB; a larger file is refused before it is
read, so a wrong path (``/dev/zero``, a disk image) cannot fill memory
(docs/flows/statements.md, "Bad files")."""


def read_path(path) -> bytes:
    """The bytes of the statement file at ``path`` (``str`` or ``Path``).
    Raises ``BadFile`` when it is not a regular file (a device, a FIFO: it
    could be read forever or block) or is larger than
    ``MAX_STATEMENT_BYTES``; ``OSError`` when it cannot be opened."""
    import os
    import stat

    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise BadFile("not a regular file (a device, pipe or socket): give the statement file itself")
    # O_NONBLOCK: a path swapped for a FIFO after the stat cannot block the open.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BadFile("not a regular file (a device, pipe or socket): give the statement file itself")
        data = handle.read(MAX_STATEMENT_BYTES + 1)  # bounded even if the file grows meanwhile
    if len(data) > MAX_STATEMENT_BYTES:
        raise BadFile(f"larger than {MAX_STATEMENT_BYTES // (1024 * 1024)} MiB (MAX_STATEMENT_BYTES): "
                      "split the statement by period")
    return data


def read(data: bytes) -> RawStatement:
    """Parse a statement's bytes. Raises ``BadFile`` (see the module)."""
    digest = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise BadFile("the file is empty")
    if data.startswith(_XLSX_MAGIC):
        return _finish(digest, *_read_xlsx(data))
    for bom, name in _OTHER_BOMS:  # UTF-32 LE starts like UTF-16 LE: longest first
        if data.startswith(bom):
            raise BadFile(f"the file is {name} (it starts with a {name} byte-order mark): "
                          "export the statement as CSV UTF-8")
    body = data[len(codecs.BOM_UTF8):] if data.startswith(codecs.BOM_UTF8) else data
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body[:exc.start].count(b"\n") + 1
        raise BadFile(f"line {line} is not UTF-8 (byte 0x{body[exc.start]:02x}): "
                      "export the statement as CSV UTF-8") from None
    if not text.endswith(("\n", "\r")):
        raise BadFile(f"the last line (line {text.count(chr(10)) + 1}) has no line ending: "
                      "the file looks truncated")
    first = text.split("\n", 1)[0]
    delimiter = max((",", ";", "\t"), key=first.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = [name.strip() for name in next(reader)]
        rows: list[tuple[int, list[str]]] = []
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue  # a blank line
            if len(fields) != len(header):
                raise BadFile(f"line {reader.line_num} has {len(fields)} fields, the header has "
                              f"{len(header)}")
            rows.append((reader.line_num, fields))
    except csv.Error as exc:
        raise BadFile(f"line {reader.line_num}: {exc}") from None
    return _finish(digest, header, rows)


def _finish(digest: str, header: list[str], rows: list[tuple[int, list[str]]]) -> RawStatement:
    if any(not name for name in header):
        raise BadFile("the header has a blank column name")
    repeated = sorted({n for n in header if header.count(n) > 1})
    if repeated:
        raise BadFile(f"the header repeats column {repeated[0]!r}")
    if not rows:
        raise BadFile("the file has no lines after the header")
    return RawStatement(sha256=digest, header=header, rows=rows)


def _read_xlsx(data: bytes) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The first sheet of a workbook: its first non-blank row is the header
    (trailing blank columns dropped), every later non-blank row a line
    numbered as Excel numbers it."""
    import zipfile

    import openpyxl
    try:
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise BadFile(f"not a readable .xlsx workbook ({exc.__class__.__name__}): "
                      "the file may be truncated") from None
    try:
        sheet = book.worksheets[0]
        header: list[str] | None = None
        rows: list[tuple[int, list[str]]] = []
        for number, cells in enumerate(sheet.iter_rows(values_only=True), start=1):
            fields = [_cell_text(v) for v in cells]
            if not any(f.strip() for f in fields):
                continue
            if header is None:
                while fields and not fields[-1].strip():
                    fields.pop()
                header = [f.strip() for f in fields]
                continue
            extra = fields[len(header):]
            if any(f.strip() for f in extra):
                raise BadFile(f"row {number} has a value beyond the header's {len(header)} columns")
            fields = (fields + [""] * len(header))[:len(header)]
            rows.append((number, fields))
    finally:
        book.close()
    if header is None:
        raise BadFile("the workbook's first sheet is empty")
    return header, rows


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
