"""One frozen Settings object, read once from ``FARM_*`` environment variables.

Embedded default (no servers): ``FARM_HOME`` holds a SQLite index and a local blob dir, and
builds compile in-process (in a child process of the CLI). Cluster mode sets
``FARM_DATABASE_URL``, ``FARM_STORE_URL`` and ``FARM_BROKER_URL``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from farm.errors import ConfigError


def _default_home() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "ctxfarm"


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    store_url: str
    broker_url: str | None = None
    compile_timeout: float = 1800.0
    signing_key: str | None = None
    trusted_keys: tuple[str, ...] = field(default_factory=tuple)
    require_signature: bool = False
    # Cluster mode. The build row lease is renewed every lease/3 s while a worker compiles, so a
    # dead worker's build is free again after at most lease_seconds, however long compiles are.
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 10.0
    max_attempts: int = 3
    # Redis redelivers a task unacked this long: keep it above the longest compile (the DB lease
    # still guards against a second delivery running twice).
    visibility_timeout: float = 0.0
    # Queued builds whose message is older than this are sent again (a broker that lost its
    # queue after a restart); tasks are idempotent, so a duplicate costs nothing.
    requeue_after: float = 600.0

    @property
    def worker_stale_after(self) -> float:
        """A worker not heard from for three heartbeats is dead."""
        return 3 * self.heartbeat_seconds

    @property
    def effective_visibility_timeout(self) -> float:
        return self.visibility_timeout or max(3600.0, 2 * self.compile_timeout + 300)

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: builds run in this process's children."""
        return not self.broker_url

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = Path(env["FARM_HOME"]).expanduser() if env.get("FARM_HOME") else _default_home()
        timeout_raw = env.get("FARM_COMPILE_TIMEOUT", "1800")
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise ConfigError(
                f"FARM_COMPILE_TIMEOUT must be a number of seconds, got {timeout_raw!r}"
            ) from None
        if timeout <= 0:
            raise ConfigError(f"FARM_COMPILE_TIMEOUT must be positive, got {timeout_raw!r}")
        trusted = tuple(k for k in env.get("FARM_TRUSTED_KEYS", "").split(",") if k.strip())

        def number(name: str, default: float) -> float:
            raw = env.get(name, "")
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {raw!r}") from None
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {raw!r}")
            return value

        return cls(
            home=home,
            database_url=env.get("FARM_DATABASE_URL") or f"sqlite:///{home / 'index.db'}",
            store_url=env.get("FARM_STORE_URL") or f"file://{home / 'blobs'}",
            broker_url=env.get("FARM_BROKER_URL") or None,
            compile_timeout=timeout,
            signing_key=env.get("FARM_SIGNING_KEY") or None,
            trusted_keys=trusted,
            require_signature=env.get("FARM_REQUIRE_SIGNATURE", "").lower() in ("1", "true", "yes"),
            lease_seconds=number("FARM_LEASE_SECONDS", 60.0),
            heartbeat_seconds=number("FARM_HEARTBEAT_SECONDS", 10.0),
            max_attempts=int(number("FARM_MAX_ATTEMPTS", 3)),
            visibility_timeout=number("FARM_VISIBILITY_TIMEOUT", 0.0) if env.get("FARM_VISIBILITY_TIMEOUT") else 0.0,
            requeue_after=number("FARM_REQUEUE_AFTER", 600.0),
        )
