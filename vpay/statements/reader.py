"""Read a statement file: bytes → header and rows, or one clear refusal.

A statement is a CSV export (RFC 4180; ``,``, ``;`` or tab, whichever the
header line uses most), in UTF-8 with or without a byte-order mark (Excel's
"CSV UTF-8" writes one). Refused with ``BadFile`` (one line, nothing
applied): an empty file or one without data lines, a UTF-16/UTF-32 export, bytes
that are not UTF-8, a last line without its line ending (a truncated
download), an unterminated quote, a line whose field count is not the
header's, and a blank or repeated column name.
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


def read(data: bytes) -> RawStatement:
    """Parse a statement's bytes. Raises ``BadFile`` (see the module)."""
    digest = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise BadFile("the file is empty")
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
    if any(not name for name in header):
        raise BadFile("the header has a blank column name")
    repeated = sorted({n for n in header if header.count(n) > 1})
    if repeated:
        raise BadFile(f"the header repeats column {repeated[0]!r}")
    if not rows:
        raise BadFile("the file has no lines after the header")
    return RawStatement(sha256=digest, header=header, rows=rows)
