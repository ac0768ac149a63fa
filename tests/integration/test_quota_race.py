"""Hostile cases: the bytes quota (FARM_QUOTA_UPLOAD_MB, 1 MiB here) against bodies that come at
once to a real `farm serve` (threads; SQLite: one process, PostgreSQL: two sharing the port), and
against bodies that fail. The room a body may fill is taken before it is read, under the token's
lock: what is admitted never holds more than the quota together, a refused body is 429
``quota-upload-bytes`` with nothing stored, and a failed one gives its room back."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from infra.devfarm.services import free_port
from tests.common.procs import at_once
from tests.common.service import serve, token

KIB = 1024
QUOTA = 1024 * KIB


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({"FARM_HOME": str(tmp_path / "home"), "FARM_QUOTA_UPLOAD_MB": "1", "FARM_MAX_UPLOAD_MB": "4",
                "FARM_QUOTA_UPLOADS": "8"})
    workers = 1
    if request.param == "postgres":
        env["FARM_DATABASE_URL"] = request.getfixturevalue("pg_url")
        workers = 2
    settings = Settings.from_env(env)
    tokens = {name: token(settings, name, "submit") for name in ("a", "b")}
    port = free_port()
    proc = serve(env, port, tmp_path / "serve.log", workers=workers)
    try:
        yield {"port": port, "tokens": tokens, "settings": settings}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def request(port: int, tok: str, method: str, path: str, body: bytes | None = None, *, chunked: bool = False,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sent: Any = body
        if chunked and body is not None:
            sent = iter([body[i:i + 64 * KIB] for i in range(0, len(body), 64 * KIB)])
        conn.request(method, path, body=sent, headers={"Authorization": f"Bearer {tok}", **(headers or {})},
                     encode_chunked=chunked)
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else {}
    finally:
        conn.close()


def put(port: int, tok: str, data: bytes, *, digest: str | None = None, chunked: bool = False) -> tuple[int, str]:
    status, body = request(port, tok, "PUT", f"/v1/blobs/{digest or digest_of(data)}", data, chunked=chunked)
    return status, body.get("error", {}).get("code", "")


def stored(port: int, tok: str, data: bytes) -> bool:
    return request(port, tok, "HEAD", f"/v1/blobs/{digest_of(data)}")[0] == 200


def held(settings: Settings, name: str) -> int:
    """What token ``name``'s bytes quota counts now: its blob rows and its sessions' sizes."""
    from sqlalchemy import func, select

    from registry.db import Database
    from registry.models import ApiToken, BlobPut, UploadSession

    db = Database(settings.database_url)
    try:
        with db.session() as s:
            tid = s.scalar(select(ApiToken.id).where(ApiToken.name == name))
            blobs = s.scalar(select(func.coalesce(func.sum(BlobPut.size), 0)).where(BlobPut.token_id == tid))
            pieces = s.scalar(select(func.coalesce(func.sum(UploadSession.size), 0))
                              .where(UploadSession.owner_token_id == tid))
            return int(blobs or 0) + int(pieces or 0)
    finally:
        db.dispose()


def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not seen in {timeout} s: {what}"
        time.sleep(0.05)


def session(port: int, tok: str) -> str:
    status, body = request(port, tok, "POST", "/v1/uploads")
    assert status == 201, body
    return str(body["upload"])


def offset(port: int, tok: str, upload: str) -> int:
    return int(request(port, tok, "GET", f"/v1/uploads/{upload}")[1]["offset"])


def test_blob_puts_at_once_never_hold_more_than_the_quota(served: dict[str, Any]) -> None:
    """Six PUTs of 400 KiB at once against 1 MiB: exactly two stored (800 KiB), four refused
    whole (the route once read the free room before the body came and counted the blob after:
    all six were stored, 2.4 MiB held)."""
    port, a = served["port"], served["tokens"]["a"]
    blobs = [os.urandom(400 * KIB) for _ in range(6)]
    got = at_once(6, lambda i: put(port, a, blobs[i]))
    admitted = [i for i, (status, _code) in enumerate(got) if status == 200]
    assert len(admitted) == 2, got
    assert all(answer == (429, "quota-upload-bytes") for i, answer in enumerate(got) if i not in admitted), got
    assert [i for i in range(6) if stored(port, a, blobs[i])] == admitted  # nothing of the refused ones
    assert held(served["settings"], "a") == 800 * KIB <= QUOTA
    assert put(port, served["tokens"]["b"], blobs[admitted[0]] + b"b")[0] == 200  # another token's quota is its own


def test_pieces_and_blobs_at_once_share_one_quota(served: dict[str, Any]) -> None:
    """Three session pieces and three blob PUTs of 400 KiB at once: two admitted in all; a
    refused piece leaves its session as it was."""
    port, a = served["port"], served["tokens"]["a"]
    uploads = [session(port, a) for _ in range(3)]
    bodies = [os.urandom(400 * KIB) for _ in range(6)]

    def one(i: int) -> tuple[int, str]:
        if i % 2:
            return put(port, a, bodies[i])
        status, body = request(port, a, "PATCH", f"/v1/uploads/{uploads[i // 2]}", bodies[i],
                               headers={"Upload-Offset": "0"})
        return status, body.get("error", {}).get("code", "")

    got = at_once(6, one)
    assert sorted(status for status, _code in got) == [200, 200, 429, 429, 429, 429], got
    assert {code for status, code in got if status == 429} == {"quota-upload-bytes"}
    pieces = [offset(port, a, u) for u in uploads]
    blobs = [stored(port, a, bodies[i]) for i in (1, 3, 5)]
    assert all(piece in (0, 400 * KIB) for piece in pieces), pieces  # a refused piece left nothing
    assert sum(pieces) + 400 * KIB * sum(blobs) == 800 * KIB == held(served["settings"], "a")


def test_bodies_without_a_length_take_what_is_free_and_give_back_the_rest(served: dict[str, Any]) -> None:
    """A chunked PUT declares no size: it takes what is free (up to the upload cap) before its
    body is read, and gives back what it did not bring. While one comes, two more are refused."""
    port, a, settings = served["port"], served["tokens"]["a"], served["settings"]
    first, others = os.urandom(300 * KIB), [os.urandom(100 * KIB) for _ in range(2)]
    head = (f"PUT /v1/blobs/{digest_of(first)} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {a}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + f"{64 * KIB:x}\r\n".encode() + first[:64 * KIB] + b"\r\n")
        until(lambda: held(settings, "a") == QUOTA, "the free room taken by a body of unknown size")
        assert [put(port, a, data) for data in others] == [(429, "quota-upload-bytes")] * 2
        rest = first[64 * KIB:]
        sock.sendall(f"{len(rest):x}\r\n".encode() + rest + b"\r\n0\r\n\r\n")
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        assert answer.status == 200, answer.read()
    assert held(settings, "a") == 300 * KIB and not any(stored(port, a, data) for data in others)
    assert put(port, a, os.urandom(600 * KIB), chunked=True)[0] == 200  # the rest was given back
    more = os.urandom(200 * KIB)  # 124 KiB are free: refused when it outgrows them
    assert put(port, a, more, chunked=True) == (429, "quota-upload-bytes")
    assert not stored(port, a, more) and held(settings, "a") == 900 * KIB


def test_a_failed_body_gives_its_room_back(served: dict[str, Any]) -> None:
    """A body that hashes to another digest, a blob cut short, a session's piece cut short: the
    room taken for each is free again (a cut piece keeps what arrived); nothing is stored."""
    port, a, settings = served["port"], served["tokens"]["a"], served["settings"]
    data = os.urandom(900 * KIB)
    status, code = put(port, a, data, digest=digest_of(b"something else"))
    assert (status, code) == (400, "usage") and held(settings, "a") == 0

    def cut(path: str, declared: int, sent: bytes, extra: str = "") -> None:
        """Send ``declared`` as the size, then ``sent``, then close once the room is taken."""
        head = (f"{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {a}\r\n{extra}"
                f"Content-Length: {declared}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head + sent)
            until(lambda: held(settings, "a") >= declared, "the room taken while the body comes")

    cut(f"PUT /v1/blobs/{digest_of(data)}", len(data), data[:300 * KIB])
    until(lambda: held(settings, "a") == 0, "the cut blob's room given back")
    assert not stored(port, a, data)

    upload = session(port, a)
    cut(f"PATCH /v1/uploads/{upload}", len(data), data[:300 * KIB], extra="Upload-Offset: 0\r\n")
    until(lambda: held(settings, "a") <= 300 * KIB, "the cut piece's room given back, but what arrived")
    kept = offset(port, a, upload)
    assert kept <= 300 * KIB and held(settings, "a") == kept
    rest = os.urandom(QUOTA - 300 * KIB)  # fits only if nothing but what arrived is held
    assert put(port, a, rest)[0] == 200
    assert held(settings, "a") == kept + len(rest) <= QUOTA


def test_sessions_of_many_tokens_at_once_open_at_most_the_service_cap(served: dict[str, Any]) -> None:
    """The service opens at most MAX_SESSIONS upload sessions in all: with 4 places left, 8 tokens
    asking at once (each well under its own quota) open exactly 4; the rest are 429
    ``rate-limited``. Each token's lock once guarded only its own count: tokens at once could all
    pass the service's."""
    from farm.api.routes.upload_sessions import MAX_SESSIONS
    from registry.db import Database
    from registry.tokens import create_token

    port, settings = served["port"], served["settings"]
    db = Database(settings.database_url)
    try:
        with db.session() as s:
            many = [create_token(s, f"t{i}", "submit") for i in range(16)]
    finally:
        db.dispose()
    for i in range(MAX_SESSIONS - 4):  # FARM_QUOTA_UPLOADS=8 each
        session(port, many[i // 8])
    got = at_once(8, lambda i: request(port, many[8 + i], "POST", "/v1/uploads"))
    assert sorted(status for status, _body in got) == [201] * 4 + [429] * 4, got
    assert {body["error"]["code"] for status, body in got if status == 429} == {"rate-limited"}
