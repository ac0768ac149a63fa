"""ORT model packages in a cluster whose service can't make them: a worker makes them.

A package is written and checked by onnxruntime >= 1.32 (``workers.ortpackage``); a cluster's API
image has none, its QNN 2.49.40 / 2.51.0 workers pin 1.32.0. So ``POST /v1/packages`` on such a
service, for inputs the index does not hold yet, sends ``PACKAGE_TASK`` (NAME:TAG and the inputs
key) to the probe queue of a live worker whose onnxruntime is new enough; the worker runs the
same ``make_package`` (the same index and store) and publishes. The service then answers from the
index, as for any package made before.

What the two sides share besides the index is a ``PackageBoard`` (Redis, the broker, in a
cluster; no Celery result backend, on purpose):

- a **claim** per inputs key (``SET NX`` with a TTL): one message per inputs key at a time,
  however many requests ask; the worker drops it when done, its TTL when the worker died;
- a **failure** per inputs key, kept ``FAILED_TTL_S``: the worker's error (code, message, hint),
  which every request of these inputs is answered with meanwhile (the same code and status as a
  service that made it itself would give); after that a request tries again.

``step`` is one look, short reads only: the answer when the package is in the index, None while
it is being made (after sending it when nobody had); the route repeats it until its wait ends.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry

log = logging.getLogger("ctxfarm.packages")

FAILED_TTL_S = 60  # a worker's failure answers every request of its inputs this long
CLAIM_MARGIN_S = 120  # a claim outlives the worker's time limit for a package (compile_timeout) by this
RETRY_AFTER_S = 5  # what a 202 tells the client to wait before asking again
KEY_PREFIX = "ctxfarm:packages:"
_KEY = re.compile(r"^[0-9a-f]{64}$")


class PackageBoard(Protocol):
    """Where the service and the worker making a package meet, by inputs key."""

    def claim(self, key: str, ttl: float) -> bool:
        """True for the one caller that may send the package's message (until ``finish`` or ``ttl``)."""

    def making(self, key: str) -> bool:
        """Whether a claim on ``key`` is held."""

    def failure(self, key: str) -> dict[str, Any] | None:
        """The error a worker recorded for ``key`` (``FarmError.to_dict``) while it is kept."""

    def finish(self, key: str, error: dict[str, Any] | None, ttl: float) -> None:
        """Drop the claim; with ``error``, record it for ``ttl`` seconds (one step: a reader never
        sees the claim gone and the error not there yet)."""


class RedisPackageBoard:
    """The board on the broker's Redis (its database number: one farm per database)."""

    def __init__(self, url: str):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    @staticmethod
    def _keys(key: str) -> tuple[str, str]:
        if not _KEY.match(key):
            raise E.UsageError("a package inputs key is 64 hex digits")
        return f"{KEY_PREFIX}making:{key}", f"{KEY_PREFIX}failed:{key}"

    def claim(self, key: str, ttl: float) -> bool:
        return bool(self.client.set(self._keys(key)[0], b"1", nx=True, ex=max(1, int(ttl))))

    def making(self, key: str) -> bool:
        return bool(self.client.exists(self._keys(key)[0]))

    def failure(self, key: str) -> dict[str, Any] | None:
        raw = self.client.get(self._keys(key)[1])
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def finish(self, key: str, error: dict[str, Any] | None, ttl: float) -> None:
        making, failed = self._keys(key)
        pipe = self.client.pipeline(transaction=True)
        if error is not None:
            pipe.set(failed, json.dumps(error).encode(), ex=max(1, int(ttl)))
        pipe.delete(making)
        pipe.execute()

    def close(self) -> None:
        self.client.close()


def error_of(doc: dict[str, Any]) -> E.FarmError:
    """A recorded failure as the error it was (its documented code; internal-error for a code
    this version does not know)."""
    by_code = {c.code: c for c in E.documented()}
    code, message = str(doc.get("code") or ""), str(doc.get("message") or "")[:4000]
    hint = doc.get("hint")
    cls = by_code.get(code)
    if cls is None or cls is E.FarmError:
        return E.InternalError(f"a worker failed to make the package: [{code[:40]}] {message}")
    return cls(message, hint=str(hint)[:2000] if isinstance(hint, str) else None)


def package_queue(settings: Settings, reg: Registry) -> str:
    """The probe queue of a live worker that can make packages (onnxruntime >= 1.32): the
    toolchain with the most such workers, then the newest. no-worker (503) when there is none."""
    from farm.core.capabilities import ORT_MODEL_PACKAGE, Capabilities
    from farm.core.keys import parse_version
    from farm.pipeline.queues import probe_queue
    from registry.index import live_workers
    from workers.ortpackage import MIN_ORT

    count: dict[tuple[str, str], int] = {}
    with reg.db.session() as s:
        for w in live_workers(s, stale_after=settings.worker_stale_after):
            queue = probe_queue(w.backend, w.toolchain)
            # What the worker announced it makes; a worker of an older ctxfarm by its onnxruntime.
            caps = Capabilities.from_extra(w.extra)
            able = ORT_MODEL_PACKAGE in caps.makes if caps is not None else parse_version(w.ort_version or "0") >= MIN_ORT
            if able and queue in (w.queues or []):
                count[(w.backend, w.toolchain)] = count.get((w.backend, w.toolchain), 0) + 1
    if not count:
        raise E.NoWorkerError(
            "no live worker can make ORT model packages (they need onnxruntime >= 1.32), and this service has none",
            hint="start a QNN 2.49.40 or 2.51.0 worker (they pin onnxruntime 1.32.0: infra/farm-up.sh, "
                 "docs/operations.md), or run `farm package NAME:TAG` where onnxruntime >= 1.32 is, with the "
                 "cluster's FARM_DATABASE_URL and FARM_STORE_URL")
    backend, toolchain = max(count, key=lambda bt: (count[bt], parse_version(bt[1]), bt))
    return probe_queue(backend, toolchain)


Dispatch = Callable[[list[Any], str], None]  # (task args, queue): sends PACKAGE_TASK


def celery_dispatch(settings: Settings) -> Dispatch:
    """Sends PACKAGE_TASK by name on this process's Celery app."""
    from farm.pipeline.queues import PACKAGE_TASK, send, shared_app

    def dispatch(args: list[Any], queue: str) -> None:
        send(shared_app(settings), PACKAGE_TASK, args, queue)

    return dispatch


class PackageJobs:
    """The service's side: one ``step`` per look at a package a worker makes."""

    def __init__(self, settings: Settings, reg: Registry, board: PackageBoard, dispatch: Dispatch):
        self.settings, self.reg, self.board, self.dispatch = settings, reg, board, dispatch

    def step(self, ref: str) -> dict[str, Any] | None:
        """The package of ``ref`` when the index holds it (``cached``: it was made earlier, here
        or by a worker); else the worker's recorded failure, raised; else None: it is being made
        (sent now when no one had). no-worker when no live worker can make it."""
        from farm.pipeline.packages import check_buildable, package_answer, package_inputs

        # Read again at every step: NAME:TAG may move, or a build be published, while it waits.
        inputs = package_inputs(self.reg, ref)
        if inputs.made is not None:
            return package_answer(self.reg, inputs.made, cached=True)
        check_buildable(inputs)
        failed = self.board.failure(inputs.key)
        if failed is not None:
            raise error_of(failed)
        if self.board.making(inputs.key):
            return None
        queue = package_queue(self.settings, self.reg)
        if self.board.claim(inputs.key, self.settings.compile_timeout + CLAIM_MARGIN_S):
            try:
                self.dispatch([f"{inputs.name}:{inputs.tag}", inputs.key], queue)
            except BaseException:
                self.board.finish(inputs.key, None, 0)  # not sent: the next request sends it
                raise
        return None

    def close(self) -> None:
        close = getattr(self.board, "close", None)
        if close is not None:
            close()


def make_for_service(settings: Settings, reg: Registry, ref: str, key: str, board: PackageBoard,
                     *, signer: Any = None) -> str:
    """The worker's side (``PACKAGE_TASK``): make the package of ``ref`` as ``farm package``
    does, record a failure under the inputs key the service asked for, drop the claim. The
    inputs are read again here: if NAME:TAG moved since, the package of what it is now is made
    (the service, reading again, sends another message when it still needs one)."""
    from farm.pipeline.packages import make_package

    error: dict[str, Any] | None = None
    outcome = "made"
    try:
        make_package(settings, reg, ref, signer=signer)
    except Exception as exc:  # every failure is told to the service, a bug as internal-error
        err = E.translate(exc)
        if not isinstance(exc, E.FarmError) and err.code == "internal-error":
            log.exception("making the package of %s failed", ref)
        error, outcome = err.to_dict(), err.code
        error.pop("details", None)  # a child's log stays in the worker's
    finally:
        board.finish(key, error, FAILED_TTL_S)
        _tell(settings.broker_url, outcome)
    return outcome


def _tell(broker_url: str | None, outcome: str) -> None:
    """Wake the service's waiting ``POST /v1/packages`` (farm.api.routes.packages): it reads the
    index now, not at its next fallback look. Never raises (``Publisher``)."""
    from farm.pipeline.events import PACKAGE_EVENT, Publisher

    publisher = Publisher(broker_url)
    try:
        publisher.publish(PACKAGE_EVENT, f"package {outcome}"[:64])
    finally:
        publisher.close()
