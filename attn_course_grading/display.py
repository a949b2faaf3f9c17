"""Text from a submission made safe to print: on a terminal, or in a file read line by line."""

from __future__ import annotations

import unicodedata

#: What :func:`display` escapes besides C0, DEL and C1 (category Cc): format characters (Cf: the
#: bidirectional overrides U+202A-U+202E and isolates U+2066-U+2069, zero-width characters, which
#: make text read other than it is), lone surrogates (Cs) and the line and paragraph separators.
_ESCAPED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def display(text: object, limit: int | None = None) -> str:
    """``text`` as a string safe to print: every control character escaped, nothing else changed.

    A terminal obeys escapes (ESC, CR, BEL), a newline forges a line for whoever reads line by line,
    a bidirectional override shows text in another order. Each is written as in a Python string
    literal (``\\x1b``, ``\\n``, ``\\u202e``); a byte that was not UTF-8 (``os.fsdecode``'s
    ``\\udcXX``) as that byte (``\\xff``). A backslash is left as it is, so escaping twice
    changes nothing: text that spells an escape reads like one, but none reaches the terminal.

    Args:
        text: a string, or anything (``str()`` of it, or its type if that fails).
        limit: at most this many characters of ``text`` are shown, then ``… (N more characters)``.

    Raises:
        TypeError: ``limit`` is not a non-negative int or None.

    Example:
        >>> display("ada\\n\\x1b[2Jgrace", 8)
        'ada\\\\n\\\\x1b[2J… (5 more characters)'
    """
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception:  # noqa: BLE001 - a hostile __str__ must not stop a report
            text = f"<{type(text).__name__}>"
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise TypeError(f"display: limit must be a non-negative int or None, got {limit!r}")
    more = len(text) - limit if limit is not None and len(text) > limit else 0
    if more:
        text = text[:limit]
    shown = text if text.isprintable() else "".join(map(_escaped, text))   # the common case at C speed
    return shown + (f"… ({more:,} more characters)" if more else "")


def _escaped(character: str) -> str:
    if unicodedata.category(character) not in _ESCAPED_CATEGORIES:
        return character
    code = ord(character)
    if character in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[character]
    if 0xDC80 <= code <= 0xDCFF:                       # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
