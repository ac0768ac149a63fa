"""Resolve answers cached per question and validated by the model's generation, and the ETag
semantics of conditional polls (RFC 9110 8.8.3, 13.1.2).

A device polls ``GET /v1/resolve`` for updates. What it should install changes only when the
model's artifacts, their verdicts, device reports or signatures change, and each of those bumps
the model's generation (a trigger, ``registry.coverage_sql``), or when a tag moves (the question
then names another digest). So an answer -- the JSON bytes of a hit, or the explained miss -- is
kept per question (the reference as typed, the device, the service's base URL) with the
(digest, generation) it was computed at, and reused while one indexed read of the reference says
both are unchanged. The generation is read before the answer is computed, so a cached answer is
never older than the generation it is filed under.

The ETag is weak (``W/"…"``): it names what the device installs (the artifact's manifest
digest, which pins every file, and the signatures over it), not the bytes of the answer, whose
``reason`` may change (a probe's verdict replacing the rule's) while the device has nothing new to
install.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from farm.core.errors import NoMatchError

ANSWERS_MAX = 8192  # questions kept per service process
BODY_MAX = 256 * 1024  # a larger answer (a huge manifest) is not kept


def etag_of(artifact_digest: str, signatures: list[tuple[str, str]]) -> str:
    """``W/"<32 hex>"``: the artifact and its signatures, nothing else of the answer."""
    h = hashlib.sha256(artifact_digest.encode())
    for key, sig in sorted(signatures):
        h.update(f"\n{key} {sig}".encode())
    return f'W/"{h.hexdigest()[:32]}"'


def none_match(header: str | None, etag: str) -> bool:
    """Whether ``If-None-Match: header`` matches ``etag`` (weak comparison: ``W/`` is ignored on
    both sides; ``*`` matches any current answer). A malformed header matches nothing."""
    if not header:
        return False
    opaque = etag.removeprefix("W/")
    for item in header.split(","):
        tag = item.strip()
        if tag == "*" or (tag and tag.removeprefix("W/") == opaque):
            return True
    return False


@dataclass(frozen=True)
class Answer:
    """A hit (``body``, ``etag``) or an explained miss (``miss``)."""

    digest: str
    generation: int
    body: bytes = b""
    etag: str = ""
    miss: dict[str, Any] | None = None  # NoMatchError's message, hint, details

    def raise_miss(self) -> None:
        if self.miss is not None:
            raise NoMatchError(self.miss["message"], hint=self.miss["hint"], details=self.miss["details"])


class AnswerCache:
    """Question -> Answer, least recently used out first; thread-safe (sync routes run on a pool)."""

    def __init__(self, size: int = ANSWERS_MAX):
        self.size = size
        self.items: OrderedDict[tuple[Any, ...], Answer] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[Any, ...], digest: str, generation: int) -> Answer | None:
        with self.lock:
            hit = self.items.get(key)
            if hit is None:
                return None
            if hit.digest != digest or hit.generation != generation:
                del self.items[key]
                return None
            self.items.move_to_end(key)
            return hit

    def holds(self, key: tuple[Any, ...]) -> bool:
        """Whether an answer is kept for ``key`` (of whatever generation)."""
        return key in self.items

    def put(self, key: tuple[Any, ...], answer: Answer) -> None:
        if len(answer.body) > BODY_MAX:
            return
        with self.lock:
            self.items[key] = answer
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def miss(self, key: tuple[Any, ...], digest: str, generation: int, exc: NoMatchError) -> None:
        self.put(key, Answer(digest, generation,
                             miss={"message": exc.message, "hint": exc.hint, "details": exc.details}))
