"""Text for people and scripts: terminal escape sequences never reach a log, a JSON document or a
pipe. onnxruntime and the QNN SDK colour their log lines (``\\x1b[0;93m``) even when writing to a
file, so logs are cleaned where they are captured and again where they are shown."""

from __future__ import annotations

import re

# CSI sequences (colours, cursor moves, erase), OSC sequences (titles, links) and lone ESC pairs.
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences."""
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def unprintable(text: str) -> str | None:
    """The first character of ``text`` that is not printable text, as ``U+XXXX``; None when all
    are. Not printable: controls (C0 with tab, CR and LF; DEL; C1, so a lone CSI ``\\x9b`` too),
    format characters (bidi overrides and isolates, zero-width joiners, BOM), line and paragraph
    separators, surrogates, private-use and unassigned code points (Unicode categories Cc, Cf, Zl,
    Zp, Cs, Co, Cn). What a device sends as "printable" fields is held to this."""
    import unicodedata

    if text.isascii() and text.isprintable():  # the common case: no per-character lookups
        return None
    for ch in text:
        if not ch.isprintable() or unicodedata.category(ch) in _HIDDEN:
            return f"U+{ord(ch):04X}"
    return None


_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def printable(text: str) -> str:
    """``text`` safe to show on a terminal or in a log line: every character ``unprintable`` names
    is written as ``\\uXXXX``, so stored text can neither move the cursor,
    recolour the screen, reorder a line (bidi) nor forge a second line."""
    import unicodedata

    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if not ch.isprintable() or unicodedata.category(ch) in _HIDDEN:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "".join(out)
