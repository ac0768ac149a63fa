"""What routes depend on, provided through ``app.state`` and FastAPI ``Depends``: the settings,
the registry, the metrics, the embedded runner, and the token checks (``read``, ``submit``,
``admin``). ``create_app`` fills ``app.state``; routes never reach for globals."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request

from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry

TOKEN_CACHE_S = 5.0  # a revoked token stops working within this many seconds
_MISS = object()


class TokenCache:
    """Token -> scope (or None for unknown), for a few seconds: a device's resolve and its blob
    GETs cost one token lookup, not one each. Keyed by the token's sha256, bounded in size."""

    def __init__(self, ttl: float, size: int = 10_000):
        self.ttl, self.size = ttl, size
        self.items: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()

    def get(self, token: str) -> Any:
        with self.lock:
            hit = self.items.get(self._key(token))
        if hit is None or hit[0] < time.monotonic():
            return _MISS
        return hit[1]

    def put(self, token: str, scope: str | None) -> None:
        with self.lock:
            self.items[self._key(token)] = (time.monotonic() + self.ttl, scope)
            if len(self.items) > self.size:
                self.items.popitem(last=False)


def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_registry(request: Request) -> Registry:
    return request.app.state.registry  # type: ignore[no-any-return]


def get_metrics(request: Request) -> Any:
    return request.app.state.metrics


def get_runner(request: Request) -> Any:
    """The embedded runner, or None when builds go to a broker."""
    return request.app.state.runner


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
MetricsDep = Annotated[Any, Depends(get_metrics)]
RunnerDep = Annotated[Any, Depends(get_runner)]


def token_scope(request: Request, raw: str) -> str | None:
    """The scope of token ``raw`` (None: unknown or revoked), cached a few seconds."""
    from registry.tokens import scope_of

    cache: TokenCache = request.app.state.tokens
    got = cache.get(raw)
    if got is _MISS:
        reg = get_registry(request)
        with reg.db.session() as s:
            got = scope_of(s, raw)
        cache.put(raw, got)
    return got  # type: ignore[no-any-return]


def scope(needed: str) -> Any:
    """A dependency that lets through a token of scope ``needed`` or above: none or unknown is
    401 ``unauthorized``, too weak is 403 ``forbidden``."""

    def check(request: Request, authorization: Annotated[str | None, Header()] = None,
              token: Annotated[str | None, Query(max_length=200, description="for browsers")] = None) -> str:
        from registry.tokens import allows

        raw = (authorization or "").removeprefix("Bearer ").strip() or (token or "")
        if not raw:
            raise E.UnauthorizedError("no token")
        got = token_scope(request, raw)
        if got is None:
            raise E.UnauthorizedError("unknown or revoked token")
        if not allows(got, needed):
            raise E.ForbiddenError(f"a {got} token can't do this (needs {needed})")
        return got

    return Depends(check)


read, submit, admin = scope("read"), scope("submit"), scope("admin")
