"""The text a device lab report is signed as: shared by the agent (which signs) and the service
(which verifies), so both sides make the same bytes. A leaf: nothing but the standard library."""

from __future__ import annotations

import json
from typing import Any

DOMAIN = b"ctxfarm-verification-v1\n"


def canonical(body: dict[str, Any]) -> str:
    """The one text of a report body that is signed: sorted keys, no spaces, ASCII, no NaN."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def message(body_text: str) -> bytes:
    """What the Ed25519 signature covers: the domain, then the canonical text."""
    return DOMAIN + body_text.encode("utf-8")
