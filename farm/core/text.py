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
