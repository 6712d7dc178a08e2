"""Text from GPU hosts, made safe to *look at*.

Auto-escaping stops a command line from injecting HTML; it does not stop it
from lying on screen. An ANSI escape, a right-to-left override (U+202E) or a
zero-width space can reorder or hide part of a table cell, so every character
Python does not call printable is written as its escape sequence instead
(``\\x1b``, ``\\u202e``). Nothing is dropped. The same visible form is used to
filter, so what people can type is what they see.
"""

from __future__ import annotations


def escape_sequence(char: str) -> str:
    """How Python writes the character in a string literal: \\x1b, \\u202e, \\U000e0001."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible_text_parts(text: str) -> list[tuple[bool, str]]:
    """Split text into (is_control, piece) runs; control pieces already written as escapes.

    "Control" is everything Python does not call printable (Unicode categories
    Cc, Cf, Cs, Co, Cn, Zl, Zp and every space but U+0020): ANSI escapes, bidi
    overrides, zero-width and other invisible characters, newlines and tabs.
    """
    if text.isprintable():
        return [(False, text)] if text else []
    parts: list[tuple[bool, str]] = []
    for char in text:
        is_control = not char.isprintable()
        piece = escape_sequence(char) if is_control else char
        if parts and parts[-1][0] == is_control:
            parts[-1] = (is_control, parts[-1][1] + piece)
        else:
            parts.append((is_control, piece))
    return parts


def visible_text(text: str | None) -> str:
    """``text`` with its control characters written as escapes (plain text, still to be HTML-escaped)."""
    if not text:
        return ""
    if text.isprintable():
        return text
    return "".join(piece for _, piece in visible_text_parts(text))
