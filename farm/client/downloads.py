"""Downloads by digest: a manifest or a package record (capped at its declared size, checked to
hash to its digest) and blobs into a partial file named by their digest, resuming what an
earlier try kept; a large blob in ranges over several connections at once (as S3 clients do:
boto3's transfer manager asks 8 MiB parts over 10 connections), a smaller one in one stream.
Every blob is verified (size, sha256) before anyone uses it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from farm.client.ranges import (
    RangeState,
    check_range,
    covered,
    drop_ranges,
    kept_prefix,
    load_ranges,
    plan_ranges,
    range_start,
)
from farm.client.transport import (
    CHUNK,
    HINT_RESUME,
    HINT_SERVER,
    WIRE_ERRORS,
    Transport,
    check_length,
    read_capped,
)
from farm.core.errors import DigestMismatchError, FarmError, ManifestError, ServerError
from farm.core.placement import file_lock
from farm.core.untrusted import clean_text

# Read here, where a download is planned (tests make them small to exercise ranges).
RANGE_PART = 8 << 20
RANGED_FROM = 2 * RANGE_PART
CONNECTIONS = 4
MAX_CONNECTIONS = 16
HINT_DIGEST = ("the downloaded copy was discarded and nothing was installed; run the install again, and if it fails "
               "the same way tell the service's operators (their copy may be corrupt)")


def remove(path: Path) -> None:
    """Whatever is at ``path``: a file, a symlink (not followed) or a directory tree."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


class Downloads(Transport):
    """The download requests of ``farm.client.Client``."""

    def manifest_bytes(self, digest: str, size: int) -> bytes:
        """An artifact's manifest, fetched by its digest: at most ``size`` bytes read, then
        checked to hash to ``digest`` (bad-manifest otherwise). ``digest`` and ``size`` must
        already be checked."""
        with self._request("GET", f"/v1/blobs/{digest}", headers={"Accept": "*/*"}) as resp:
            check_length(resp, size, digest)
            data = read_capped(resp, size, f"manifest {digest[7:19]}", deadline=time.monotonic() + 2 * self.timeout,
                                stop=True)
        if len(data) < size:
            raise ServerError(f"manifest {digest[7:19]}: the service sent {len(data)} of {size} bytes",
                              hint="run the install again")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ManifestError(f"manifest {digest[7:19]} does not match its digest: it is not the manifest the "
                                "service named", hint=HINT_SERVER)
        return data

    def download(self, digest: str, dest: Path, *, size: int, connections: int = 1) -> int:
        """Fetch blob ``digest`` into ``dest``, resuming what an earlier call kept there, reading
        no byte past ``size``; verify size and sha256. Returns the bytes that were already there
        (resumed). ``digest`` and ``size`` must already be checked; ``dest`` is named by the digest.

        A blob of at least ``RANGED_FROM`` bytes with ``connections`` > 1 comes in ranges of
        ``RANGE_PART`` bytes over that many connections at once (``_download_ranged``); a smaller
        one, or one from a service that ignores ``Range``, in one stream."""
        # Two installs into one place share the partial directory: one writes a blob at a time.
        lock = dest.with_name(dest.name + ".lock")
        if lock.is_symlink():
            lock.unlink()
        with file_lock(lock):
            if dest.is_symlink() or (dest.exists() and not dest.is_file()):
                remove(dest)
            if connections > 1 and size >= RANGED_FROM:
                return self._download_ranged(digest, dest, size=size, connections=min(connections, MAX_CONNECTIONS))
            return self._download_stream(digest, dest, size=size)

    def _download_stream(self, digest: str, dest: Path, *, size: int) -> int:
        """One stream, resumed from the contiguous bytes kept at the start of ``dest``."""
        have = kept_prefix(dest, size)
        h = hashlib.sha256()
        if have:
            with open(dest, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
        resumed = have
        if have < size:
            headers = {"Accept": "*/*", **({"Range": f"bytes={have}-"} if have else {})}
            self._count(0, request=True)
            with self._request("GET", f"/v1/blobs/{digest}", headers=headers) as resp:
                if have and not (resp.status == 206 and range_start(resp) == have):
                    h, have, resumed = hashlib.sha256(), 0, 0  # the whole blob (or a range we did not ask): start over
                if resp.status not in (200, 206) or (resp.status == 206 and not resumed):
                    raise ServerError(f"blob {digest[7:19]}: unexpected HTTP {resp.status}", hint=HINT_SERVER)
                check_length(resp, size - have, digest)
                with open(dest, "ab" if have else "wb") as out:
                    left = size - have
                    try:
                        while left > 0 and (chunk := resp.read(min(CHUNK, left))):
                            h.update(chunk)
                            out.write(chunk)
                            left -= len(chunk)
                            self._count(len(chunk))
                    except WIRE_ERRORS as exc:
                        raise ServerError(f"blob {digest[7:19]}: the download broke off "
                                          f"({clean_text(str(exc) or type(exc).__name__, 200)})",
                                          hint=HINT_RESUME) from None
        got = dest.stat().st_size
        if got < size:
            raise ServerError(f"blob {digest[7:19]}: the service sent {got} of {size} bytes", hint=HINT_RESUME)
        if "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            if resumed:  # the bytes kept from before may be the bad ones: once more, from scratch
                return self._download_stream(digest, dest, size=size)
            raise DigestMismatchError(f"blob {digest[7:19]}: downloaded content does not match its digest "
                                      f"({got} of {size} bytes)", hint=HINT_DIGEST)
        return resumed

    def _download_ranged(self, digest: str, dest: Path, *, size: int, connections: int) -> int:
        """The missing ranges of ``dest`` (``plan_ranges``: those an earlier call recorded as
        written in ``dest``'s ``.ranges`` file are kept) over ``connections`` connections, each
        range asked with ``Range`` and accepted only as a 206 whose ``Content-Range`` is exactly
        that range of exactly ``size`` bytes, read up to its end and no further. The first range
        goes to the service; where it redirected (a presigned S3 URL), the other ranges go
        straight there, without the token. Meanwhile this thread hashes the file in order as its
        prefix fills. What was written is recorded as it lands, so an interruption (a cut
        connection, a refused answer, a kill) loses no range already written. A service that
        answers the first range with the whole blob (200: it ignores ``Range``) gets one stream."""
        done = load_ranges(dest, size)
        resumed = covered(done)
        plan = plan_ranges(size, done, RANGE_PART)
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            state = RangeState(dest, size, done)
            if plan:
                state.save()  # before the first byte: holes in the file are never taken for data
                url = self.server + f"/v1/blobs/{digest}"
                first = plan[0]
                resp = self._get_range(url, True, first)
                if resp.status == 200:  # Range ignored: the whole blob in one stream, from scratch
                    resp.close()
                    os.close(fd)
                    fd = -1
                    drop_ranges(dest)
                    dest.unlink(missing_ok=True)
                    return self._download_stream(digest, dest, size=size)
                try:
                    check_range(resp, first, size, digest)
                except BaseException:
                    resp.close()
                    raise
                final = resp.url
                state.direct = final if final != url else None
                self._run_ranges(digest, url, fd, state, resp, plan, connections)
            state.hash_upto(fd, size)
            h = state.h
        finally:
            if fd >= 0:
                os.close(fd)
        if "sha256:" + h.hexdigest() != digest:
            drop_ranges(dest)
            dest.unlink(missing_ok=True)
            if resumed:  # the bytes kept from before may be the bad ones: once more, from scratch
                return self._download_ranged(digest, dest, size=size, connections=connections)
            raise DigestMismatchError(f"blob {digest[7:19]}: downloaded content does not match its digest "
                                      f"({size} bytes in {len(plan)} ranges)", hint=HINT_DIGEST)
        drop_ranges(dest)
        return resumed

    def _run_ranges(self, digest: str, url: str, fd: int, state: RangeState, first: Any,
                    plan: list[tuple[int, int]], connections: int) -> None:
        """Workers take the planned ranges in order (the first one's answer already open); the
        first failure stops them all, what each wrote is recorded, and that failure is raised."""
        import queue

        todo: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        for r in plan[1:]:
            todo.put(r)

        def work(resp: Any, rng: tuple[int, int] | None) -> None:
            try:
                while not state.stop.is_set():
                    if rng is None:
                        try:
                            rng = todo.get_nowait()
                        except queue.Empty:
                            return
                        resp = self._range_answer(url, state, rng, size=state.size, digest=digest)
                    with resp:
                        self._copy_range(resp, fd, rng, state, digest)
                    state.finished(rng)
                    rng, resp = None, None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                if resp is not None:
                    resp.close()
                state.fail(exc)
            finally:
                state.leave()

        threads = [threading.Thread(target=work, args=(first, plan[0]), daemon=True, name="ctxfarm-range-0")]
        threads += [threading.Thread(target=work, args=(None, None), daemon=True, name=f"ctxfarm-range-{i}")
                    for i in range(1, min(connections, len(plan)))]
        state.enter(len(threads))
        for t in threads:
            t.start()
        try:
            state.hash_while_running(fd)
        finally:
            state.stop.set()  # all written by now, or a failure (or an interrupt here): the rest stop
            for t in threads:
                t.join()
            state.save()
        if state.error is not None:
            raise state.error

    def _range_answer(self, url: str, state: RangeState, rng: tuple[int, int], *, size: int, digest: str) -> Any:
        """A checked 206 for ``rng``: straight from where the service redirected the first range
        when it did; a refusal there (a presigned URL that expired) is asked once more of the
        service, which redirects afresh."""
        direct = state.direct
        try:
            resp = self._get_range(direct or url, direct is None, rng)
        except FarmError:
            if direct is None:
                raise
            resp = self._get_range(url, True, rng)
            final = resp.url
            state.direct = final if final != url else None
        try:
            if resp.status != 206:
                raise ServerError(f"blob {digest[7:19]}: the service answered HTTP {resp.status} to a request for "
                                  f"bytes {rng[0]}-{rng[1] - 1}, not 206 (partial content)", hint=HINT_SERVER)
            check_range(resp, rng, size, digest)
        except BaseException:
            resp.close()
            raise
        return resp

    def _copy_range(self, resp: Any, fd: int, rng: tuple[int, int], state: RangeState, digest: str) -> None:
        """Bytes ``rng`` of ``resp`` to the same offsets of ``fd``, not one past the range's end,
        each piece recorded as written."""
        pos, end = rng
        buf = bytearray(min(CHUNK, end - pos))
        view = memoryview(buf)
        try:
            while pos < end and not state.stop.is_set():
                n = resp.readinto(view[:min(len(buf), end - pos)])
                if not n:
                    break
                os.pwrite(fd, view[:n], pos)
                state.wrote(pos, pos + n)
                self._count(n)
                pos += n
        except WIRE_ERRORS as exc:
            raise ServerError(f"blob {digest[7:19]}: the download broke off "
                              f"({clean_text(str(exc) or type(exc).__name__, 200)})", hint=HINT_RESUME) from None
        if pos < end and not state.stop.is_set():
            raise ServerError(f"blob {digest[7:19]}: the service sent {pos - rng[0]} of the {end - rng[0]} bytes "
                              f"asked at offset {rng[0]}", hint=HINT_RESUME)
