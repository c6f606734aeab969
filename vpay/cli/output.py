"""Text from outside (a rail's statement, a merchant's name, a webhook's
error, an operator's note) made safe for a terminal.

A control character printed raw is an instruction to the terminal: ESC
sequences recolour, move the cursor, rewrite earlier lines or set the
window title, so a crafted statement field could hide or forge rows of the
table an operator reads. ``safe_text`` writes every such character as a
visible escape instead.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and line feed, DEL, C1 controls (an 8-bit CSI
among them), and the Unicode bidirectional overrides that reorder what a
line appears to say (CVE-2021-42574, "Trojan Source")."""
_BREAKS = re.compile("[\t\n]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(value: object, *, one_line: bool = True) -> str:
    """``value`` as text a terminal shows literally: control characters and
    bidirectional overrides written as ``\\x1b`` / ``\\u202e``; with
    ``one_line`` (the default, for a table cell or a ``vpay:`` line) tab and
    line feed too. ``None`` is ``""``."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    text = _UNSAFE.sub(_escape, text)
    if one_line:
        text = _BREAKS.sub(_escape, text)
    return text
