"""One frozen Settings object, read once from ``FARM_*`` environment variables and validated
when loaded: a bad value is ``error[bad-config]`` naming the variable, never a traceback later.

Embedded default (no servers): ``FARM_HOME`` holds a SQLite index and a local blob dir, and
builds run in this process (compiles in child processes). Cluster mode sets
``FARM_DATABASE_URL``, ``FARM_STORE_URL`` and ``FARM_BROKER_URL``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from farm.core.errors import ConfigError

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})

# Measured compile peaks (QNN 2.51.0, x86_64): VmPeak 0.8 GiB (squeezenet), 1.4 GiB (resnet50),
# 2.5 GiB (vgg19; RSS 1.6 GiB). The default address-space cap leaves 2.4x the largest of those.
DEFAULT_COMPILE_MEMORY_MB = 6144


def parse_bool(name: str, raw: str | None, default: bool = False) -> bool:
    """Strict booleans: an unknown word is an error, never a silent False (fail closed)."""
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False if word else default
    raise ConfigError(f"{name}={raw!r} is not a boolean", hint="use one of: 1, 0, true, false, yes, no, on, off")


def _default_home(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "ctxfarm"


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    store_url: str
    broker_url: str | None = None
    compile_timeout: float = 1800.0
    # Address-space cap (RLIMIT_AS) of each compile child, in MiB; 0 = none. Unless
    # FARM_COMPILE_MEMORY_MB is set (``compile_memory_auto`` False), each compile's cap is
    # derived from its predicted peak (farm.pipeline.memory), with this as its floor.
    compile_memory_mb: int = DEFAULT_COMPILE_MEMORY_MB
    compile_memory_auto: bool = True
    signing_key: str | None = None
    trusted_keys: tuple[str, ...] = field(default_factory=tuple)
    require_signature: bool = False
    # With trusted keys configured, unsigned artifacts are refused unless this is set.
    allow_unsigned: bool = False
    # The build row lease is renewed every lease/3 s while an executor works, so a dead
    # executor's build is free again at most lease_seconds after its last renewal.
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 10.0
    max_attempts: int = 3
    # A build whose attempt died is queued again after this many seconds, doubled each attempt (at
    # most 300): a crashing SDK or a lost worker is not asked again at once.
    retry_backoff_seconds: float = 5.0
    # Redis redelivers a task unacked this long: keep it above the longest compile (the DB lease
    # still guards against a second delivery running twice).
    visibility_timeout: float = 0.0
    debug: bool = False
    # HTTP service: the largest model bundle an upload may carry (and an archive expand to).
    max_upload_mb: int = 4096
    # Executors keep fetched model snapshots by digest under FARM_HOME/cache/bundles, up to this
    # many MiB (least recently used go first); 0 = fetch every build's bundle from the store.
    bundle_cache_mb: int = 2048
    # Read by the compile hosts from the environment (workers.childproc.prefault_limit_mb); here so
    # that a bad value is refused where settings are read.
    prefault_mb: int = 1024
    # Embedded `farm build`: start the first compiles before the pipeline is imported and the
    # builds are recorded; each claimed build adopts its own (farm.pipeline.early).
    early_compile: bool = True
    # Evidence (docs/evidence.md). FARM_ACCURACY: "gate" runs the simulator accuracy
    # check only for requests with --min-psnr; "after" also after every QNN build (a follow-up
    # task on the probe queue, off the answer's path); "off" never (a gated request then says
    # accuracy-unverified). Each run gets FARM_ACCURACY_BUDGET seconds.
    accuracy: str = "gate"
    accuracy_budget: float = 300.0
    # Device reports: per token and minute; an artifact failing on this many distinct devices of a
    # runtime, and loading on none, is not served to that runtime again.
    reports_per_minute: int = 600
    report_fail_devices: int = 3
    # Per-token quotas of the HTTP service (docs/security.md): open upload sessions, the bytes they hold,
    # and releases with builds still queued or running; upload sessions untouched this long expire.
    quota_uploads: int = 4
    quota_upload_mb: int = 8192
    quota_releases: int = 64
    upload_ttl_s: float = 86400.0
    # The device lab: a verification job's lease (the agent renews it at a third of this while it
    # runs the job); one that ran out goes to the next agent.
    device_lease_s: int = 600
    # Resolve: among the artifacts the compatibility rule serves a device, pick the one enrolled
    # devices of its SoC measured fastest (median p50) instead of the rule's first; off by default.
    resolve_prefer_fastest: bool = False
    # The CPU reference outputs kept with a model's samples for device agents to compare against
    # (docs/device-lab.md): per model, at most this many bytes; over it, agents compute their own.
    reference_max_bytes: int = 16 * 1024 * 1024
    # Device-lab leases and reports a service process handles at once (0: no limit): agents wait,
    # a device's resolve does not wait behind them.
    device_lab_concurrency: int = 1

    @property
    def worker_stale_after(self) -> float:
        """A worker not heard from for three heartbeats is dead."""
        return 3 * self.heartbeat_seconds

    @property
    def resend_after(self) -> float:
        """A queued build whose message is in no broker list for this long is sent again (the
        worker that took it died before claiming the row, or the broker lost it)."""
        return max(3 * self.heartbeat_seconds, 2.0)

    @property
    def effective_visibility_timeout(self) -> float:
        return self.visibility_timeout or max(3600.0, 2 * self.compile_timeout + 300)

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: builds run in this process."""
        return not self.broker_url

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        raw_home = env.get("FARM_HOME", "")
        if "\x00" in raw_home:
            raise ConfigError("FARM_HOME contains a NUL byte")
        home = Path(raw_home).expanduser() if raw_home else _default_home(env)
        if home.exists() and not home.is_dir():
            raise ConfigError(f"FARM_HOME={str(home)!r} exists and is not a directory",
                              hint="point FARM_HOME at a directory (it is created when missing)")

        def number(name: str, default: float, *, minimum: float = 0.0, allow_zero: bool = False) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {raw!r}") from None
            if not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {raw!r}")
            if value < minimum or (value == 0 and not allow_zero) or value > 10**9:
                raise ConfigError(f"{name} is out of range: {raw!r}",
                                  hint=f"use a number > {minimum:g}" + (" (or 0)" if allow_zero else ""))
            return value

        def integer(name: str, default: int, *, allow_zero: bool = False) -> int:
            value = number(name, default, allow_zero=allow_zero)
            if value != int(value):
                raise ConfigError(f"{name} must be a whole number, got {env.get(name)!r}")
            return int(value)

        database_url = env.get("FARM_DATABASE_URL") or f"sqlite:///{home / 'index.db'}"
        check_database_url(database_url)
        store_url = env.get("FARM_STORE_URL") or f"file://{home / 'blobs'}"
        check_store_url(store_url)
        broker_url = env.get("FARM_BROKER_URL") or None
        if broker_url is not None:
            check_broker_url(broker_url)
        trusted = parse_trusted_keys(env.get("FARM_TRUSTED_KEYS", ""))
        return cls(
            home=home,
            database_url=database_url,
            store_url=store_url,
            broker_url=broker_url,
            compile_timeout=number("FARM_COMPILE_TIMEOUT", 1800.0),
            compile_memory_mb=integer("FARM_COMPILE_MEMORY_MB", DEFAULT_COMPILE_MEMORY_MB, allow_zero=True),
            compile_memory_auto=not env.get("FARM_COMPILE_MEMORY_MB", "").strip(),
            signing_key=env.get("FARM_SIGNING_KEY") or None,
            trusted_keys=trusted,
            require_signature=parse_bool("FARM_REQUIRE_SIGNATURE", env.get("FARM_REQUIRE_SIGNATURE")),
            allow_unsigned=parse_bool("FARM_ALLOW_UNSIGNED", env.get("FARM_ALLOW_UNSIGNED")),
            lease_seconds=number("FARM_LEASE_SECONDS", 60.0),
            heartbeat_seconds=number("FARM_HEARTBEAT_SECONDS", 10.0),
            max_attempts=integer("FARM_MAX_ATTEMPTS", 3),
            retry_backoff_seconds=number("FARM_RETRY_BACKOFF_SECONDS", 5.0, allow_zero=True),
            visibility_timeout=number("FARM_VISIBILITY_TIMEOUT", 0.0, allow_zero=True),
            debug=parse_bool("FARM_DEBUG", env.get("FARM_DEBUG")),
            max_upload_mb=integer("FARM_MAX_UPLOAD_MB", 4096),
            bundle_cache_mb=integer("FARM_BUNDLE_CACHE_MB", 2048, allow_zero=True),
            prefault_mb=integer("FARM_PREFAULT_MB", 1024, allow_zero=True),
            early_compile=parse_bool("FARM_EARLY_COMPILE", env.get("FARM_EARLY_COMPILE"), default=True),
            accuracy=_choice("FARM_ACCURACY", env.get("FARM_ACCURACY"), ("gate", "after", "off"), "gate"),
            accuracy_budget=number("FARM_ACCURACY_BUDGET", 300.0),
            reports_per_minute=integer("FARM_REPORTS_PER_MINUTE", 600),
            report_fail_devices=integer("FARM_REPORT_FAIL_DEVICES", 3),
            quota_uploads=integer("FARM_QUOTA_UPLOADS", 4),
            quota_upload_mb=integer("FARM_QUOTA_UPLOAD_MB", 8192),
            quota_releases=integer("FARM_QUOTA_RELEASES", 64),
            upload_ttl_s=number("FARM_UPLOAD_TTL_S", 86400.0),
            device_lease_s=integer("FARM_DEVICE_LEASE_S", 600),
            resolve_prefer_fastest=parse_bool("FARM_RESOLVE_PREFER_FASTEST", env.get("FARM_RESOLVE_PREFER_FASTEST")),
            reference_max_bytes=integer("FARM_REFERENCE_MAX_BYTES", 16 * 1024 * 1024, allow_zero=True),
            device_lab_concurrency=integer("FARM_DEVICE_LAB_CONCURRENCY", 1, allow_zero=True),
        )


_DB_SCHEME = re.compile(r"(sqlite|postgresql)(\+[a-z0-9_]+)?")


def _choice(name: str, raw: str | None, choices: tuple[str, ...], default: str) -> str:
    value = (raw or "").strip().lower() or default
    if value not in choices:
        raise ConfigError(f"{name}={str(raw)[:40]!r} is not one of {', '.join(choices)}")
    return value


def parse_trusted_keys(raw: str) -> tuple[str, ...]:
    """FARM_TRUSTED_KEYS: comma-separated ed25519 public keys, each base64 of 32 bytes or the
    path of a file holding one. Checked here, so a bad entry fails every command by name."""
    import base64

    keys = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        try:
            p = Path(entry)
            text = p.read_text(encoding="ascii").strip() if p.is_file() else entry
            if len(base64.b64decode(text, validate=True)) != 32:
                raise ValueError
        except (ValueError, OSError):
            raise ConfigError(f"FARM_TRUSTED_KEYS: {entry[:80]!r} is not a base64 ed25519 public key or a file "
                              "with one", hint="`farm keys public KEY` prints a key's public half") from None
        keys.append(text)
    return tuple(keys)


def check_database_url(url: str) -> None:
    """FARM_DATABASE_URL must be a sqlite:// or postgresql:// URL with a numeric port (checked
    without importing SQLAlchemy: `farm --help` and `farm targets` stay light)."""
    try:
        parsed = urlparse(url)
    except ValueError as exc:
        raise ConfigError(f"FARM_DATABASE_URL={url[:120]!r} is not a URL ({exc})") from None
    if not _DB_SCHEME.fullmatch(parsed.scheme or ""):
        raise ConfigError(f"FARM_DATABASE_URL={url[:120]!r} is not a sqlite:// or postgresql:// URL",
                          hint="e.g. sqlite:////path/index.db or postgresql://user@host:5432/db")
    try:
        _ = parsed.port
    except ValueError:
        raise ConfigError(f"FARM_DATABASE_URL={url[:120]!r} has a port that is not a number") from None
    if "\x00" in url:
        raise ConfigError("FARM_DATABASE_URL contains a NUL byte")
    if parsed.scheme.startswith("postgresql") and not parsed.hostname and "host=" not in parsed.query:
        raise ConfigError(f"FARM_DATABASE_URL={url[:120]!r} names no host")


def check_store_url(url: str) -> None:
    if url.startswith("file://") or "://" not in url:
        if "\x00" in url:
            raise ConfigError("FARM_STORE_URL contains a NUL byte")
        return
    try:
        parsed = urlparse(url)
        endpoint_query = parse_qs(parsed.query)
    except ValueError as exc:
        raise ConfigError(f"FARM_STORE_URL={url[:120]!r} is not a URL ({exc})") from None
    if parsed.scheme != "s3":
        raise ConfigError(f"FARM_STORE_URL={url!r}: unsupported scheme {parsed.scheme!r}",
                          hint="use file:///path or s3://bucket/prefix?endpoint=http://host:port")
    if not parsed.netloc:
        raise ConfigError(f"FARM_STORE_URL={url!r} names no bucket", hint="s3://BUCKET/PREFIX?endpoint=http://...")
    q = endpoint_query
    endpoint = q.get("endpoint", [None])[0]
    if endpoint is not None:
        try:
            e = urlparse(endpoint)
            _ = e.port
        except ValueError:
            raise ConfigError(f"FARM_STORE_URL: endpoint {endpoint!r} is not a URL or has a bad port") from None
        if e.scheme not in ("http", "https") or not e.hostname:
            raise ConfigError(f"FARM_STORE_URL: endpoint {endpoint!r} is not an http(s) URL",
                              hint="e.g. s3://bucket/prefix?endpoint=http://127.0.0.1:8333")
    retries = q.get("retries", ["5"])[0]
    if not retries.isdigit() or not 1 <= int(retries) <= 100:
        raise ConfigError(f"FARM_STORE_URL: retries={retries!r} must be a whole number from 1 to 100")


def check_broker_url(url: str) -> None:
    try:
        parsed = urlparse(url)
        _ = parsed.port
    except ValueError:
        raise ConfigError(f"FARM_BROKER_URL={url!r} has a bad port") from None
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
        raise ConfigError(f"FARM_BROKER_URL={url!r} is not a redis:// URL",
                          hint="e.g. redis://127.0.0.1:6379/0")
