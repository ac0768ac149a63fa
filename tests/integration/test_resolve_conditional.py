"""Conditional device polls: the resolve answer's weak ETag changes exactly when what the device
should install changes (another artifact, new signatures, a tag moved), not when only the answer's
wording does (a probe verdict on the same artifact); If-None-Match (the tag, its strong form, a
list, ``*``) gets 304; a cached answer is reused only while the model's generation holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from farm.api.answers import etag_of, none_match
from farm.api.app import create_app
from farm.core.settings import Settings
from registry.index import Registry, add_signature, record_verdict, set_tag
from registry.models import Artifact
from registry.tokens import create_token
from tests.common.index_rows import add_artifact, add_model

Q = "/v1/resolve?model=m:stable&soc=SM8650&qnn=2.51.0&manifest=false"


@pytest.fixture(params=["sqlite", "postgres"])
def svc(request: pytest.FixtureRequest, tmp_path) -> Iterator[dict[str, Any]]:
    env = {"FARM_HOME": str(tmp_path / "home")}
    if request.param == "postgres":
        # The service reads resolve over its own autocommit connections there (no ping per checkout).
        env["FARM_DATABASE_URL"] = request.getfixturevalue("pg_url")
    settings = Settings.from_env(env)
    reg = Registry.open(settings)
    with reg.db.session() as s:
        m = add_model(s, "m", name="m").digest
        other = add_model(s, "other", name="m").digest
        set_tag(s, "m", "stable", m)
        first = add_artifact(s, m, toolchain="2.50.0").id
        add_artifact(s, other, toolchain="2.50.0")
        token = create_token(s, "reader", "read")
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield {"c": client, "reg": reg, "m": m, "other": other, "first": first}
    reg.close()


def _poll(c: TestClient, etag: str | None, path: str = Q) -> Any:
    return c.get(path, headers={"If-None-Match": etag} if etag else {})


def test_etag_and_304(svc: dict[str, Any]) -> None:
    c = svc["c"]
    r = c.get(Q)
    assert r.status_code == 200, r.text
    etag = r.headers["etag"]
    assert etag.startswith('W/"') and r.headers["cache-control"] == "no-cache"
    for header in (etag, etag.removeprefix("W/"), f'"nope", {etag}', "*", f' {etag} '):
        r2 = _poll(c, header)
        assert r2.status_code == 304, header
        assert r2.content == b"" and r2.headers["etag"] == etag
    for header in ('"nope"', "W/", "garbage,,", 'W/"' + "0" * 32 + '"'):
        assert _poll(c, header).status_code == 200, header


def test_etag_changes_exactly_when_what_to_install_changes(svc: dict[str, Any]) -> None:
    c, reg, m = svc["c"], svc["reg"], svc["m"]
    r = c.get(Q)
    etag, body = r.headers["etag"], r.json()
    assert body["source"] == "rule"

    # A newer build: another artifact to install.
    with reg.db.session() as s:
        newer = add_artifact(s, m, toolchain="2.51.0")
        newer_digest, newer_id = newer.digest, newer.id
    r = _poll(c, etag)
    assert r.status_code == 200 and r.json()["artifact"] == newer_digest
    etag2 = r.headers["etag"]
    assert etag2 != etag and _poll(c, etag2).status_code == 304

    # A probe verdict on the same artifact: new wording (picked by probe), same thing to install.
    with reg.db.session() as s:
        record_verdict(s, newer_id, "qnn", "2.51.0", "loads", "probe")
    assert _poll(c, etag2).status_code == 304
    assert c.get(Q).json()["source"] == "probe"

    # A signature over it: the device's verification changes.
    with reg.db.session() as s:
        add_signature(s, newer_digest, "A" * 43 + "=", "B" * 86 + "==")
    r = _poll(c, etag2)
    assert r.status_code == 200
    etag3 = r.headers["etag"]
    assert etag3 != etag2

    # Marked broken: back to the first artifact (and its tag).
    with reg.db.session() as s:
        s.execute(update(Artifact).where(Artifact.id == newer_id).values(status="broken"))
    r = _poll(c, etag3)
    assert r.status_code == 200 and r.headers["etag"] == etag

    # The tag moves to another model: another answer, although no artifact changed.
    with reg.db.session() as s:
        set_tag(s, "m", "stable", svc["other"], force=True)
    r = _poll(c, etag)
    assert r.status_code == 200 and r.json()["model"] == svc["other"]
    assert r.headers["etag"] != etag


def test_misses_are_explained_cached_and_invalidated(svc: dict[str, Any]) -> None:
    c, reg = svc["c"], svc["reg"]
    q = Q.replace("SM8650", "SM8750")
    for _ in range(2):
        r = _poll(c, "*", q)
        assert r.status_code == 404 and r.json()["error"]["code"] == "no-match"
        assert "etag" not in r.headers
    with reg.db.session() as s:
        add_artifact(s, svc["m"], target="SM8750", toolchain="2.50.0")
    assert _poll(c, "*", q).status_code == 304
    assert c.get(q).status_code == 200
    # An unknown tag is not cached (and explained each time).
    assert c.get(Q.replace("m:stable", "m:nope")).json()["error"]["code"] == "not-found"


def test_a_repeated_question_is_answered_from_the_cache(svc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import registry.resolve

    calls = []
    real = registry.resolve.resolve

    def counting(*a: Any, **kw: Any) -> Any:
        calls.append(a[1])
        return real(*a, **kw)

    monkeypatch.setattr(registry.resolve, "resolve", counting)
    c, reg = svc["c"], svc["reg"]
    first = c.get(Q)
    for _ in range(3):
        assert c.get(Q).content == first.content
    assert len(calls) == 1
    assert c.get(Q.replace("2.51.0", "2.52.0")).status_code == 200  # another question
    assert len(calls) == 2
    with reg.db.session() as s:
        record_verdict(s, svc["first"], "qnn", "2.51.0", "fails", "probe", "crash")
    r = c.get(Q)
    assert len(calls) == 3 and r.status_code == 404  # the only artifact now fails under 2.51.0


def test_none_match_parsing() -> None:
    etag = etag_of("sha256:" + "a" * 64, [])
    assert none_match(etag, etag) and none_match("*", etag) and none_match(etag.removeprefix("W/"), etag)
    assert not none_match(None, etag) and not none_match("", etag) and not none_match(",", etag)
    assert etag_of("sha256:" + "a" * 64, [("k", "s")]) != etag
    assert etag_of("sha256:" + "a" * 64, [("k", "s"), ("j", "t")]) == etag_of("sha256:" + "a" * 64,
                                                                              [("j", "t"), ("k", "s")])


def test_polls_survive_the_database_dropping_connections(svc: dict[str, Any]) -> None:
    """PostgreSQL: the resolve connections are not pinged on checkout; one the server dropped is
    found dead by the first statement and the request runs again on a fresh one."""
    if svc["reg"].db.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    from sqlalchemy import text

    c = svc["c"]
    etag = c.get(Q).headers["etag"]
    with svc["reg"].db.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    assert _poll(c, etag).status_code == 304
    assert c.get(Q).status_code == 200


@pytest.mark.parametrize("header", ["W/" * 3000, '"' * 5000, "\u00e9t\u00e9", ", " * 2000, "*, *"])
def test_hostile_if_none_match_is_a_clear_answer(svc: dict[str, Any], header: str) -> None:
    """Oversized or odd If-None-Match: a 200/304/400 with the error shape, never a 500."""
    try:
        r = svc["c"].get(Q, headers={"If-None-Match": header})
    except UnicodeEncodeError:
        return  # the client itself refuses non-latin-1 header bytes
    assert r.status_code in (200, 304, 400), (r.status_code, r.text[:200])
    if r.status_code == 400:
        assert r.json()["error"]["code"] == "usage"


def test_the_fast_route_checks_the_query_as_the_documented_route_declares(svc: dict[str, Any]) -> None:
    """GET /v1/resolve is served by a plain route ahead of FastAPI: its query and
    header are checked by hand, against the documented route's declaration, each bad one 400
    ``usage`` naming the parameter; a body, a token in the URL, no token: 413, 401, 401."""
    c = svc["c"]
    base = "/v1/resolve?soc=SM8650&qnn=2.51.0"
    for path, where in ((base, "query.model: Field required"),
                        (f"{base}&model={'m' * 301}", "query.model: String should have at most 300"),
                        (f"/v1/resolve?model=m:stable&soc={'S' * 65}&qnn=2.51.0", "query.soc: String should"),
                        (f"{base}&model=m:stable&platform={'p' * 65}", "query.platform"),
                        (f"{Q.replace('manifest=false', 'manifest=maybe')}", "query.manifest: Input should be a valid "
                                                                              "boolean")):
        r = c.get(path)
        assert r.status_code == 400 and r.json()["error"]["code"] == "usage", (path, r.text)
        assert r.json()["error"]["message"].startswith(where), r.text
    r = c.get(Q, headers={"If-None-Match": "x" * 4097})
    assert r.status_code == 400 and "header.if-none-match" in r.json()["error"]["message"]
    for spelled in ("true", "1", "yes", "on", "TRUE", "false", "0", "no", "off"):  # pydantic's booleans
        r = c.get(Q.replace("manifest=false", f"manifest={spelled}"))
        # These rows have no blobs: an answer that reads its manifest says so; one without reads none.
        wants = spelled.lower() in ("true", "1", "yes", "on")
        got = (r.status_code, r.json()["error"]["code"] if r.status_code != 200 else r.json()["manifest"])
        assert got == ((404, "blob-not-found") if wants else (200, None)), (spelled, r.text)
    assert c.get(f"{Q}&model=nosuch:v1").status_code == 404  # the last of a repeated parameter counts
    assert c.get(f"{Q}&unknown=1").status_code == 200
    assert c.request("GET", Q, content=b"x" * 10).status_code == 413
    r = c.get(f"{Q}&token={c.headers['Authorization'].split()[1]}")
    assert r.status_code == 401 and "in the URL" in r.json()["error"]["message"]
    r = c.get(Q, headers={"Authorization": ""})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_a_miss_names_the_nearest_without_reading_other_targets(svc: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With five or more of the SoC's own artifacts to name, a QNN miss counts the others without
    reading them: the answer is the one reading them all would give (nearest, count, what's needed)."""
    from farm.core.catalog import load_catalog
    from farm.core.errors import NoMatchError
    from registry.lite import SessionRows
    from registry.resolve import Device, resolve

    reg, m = svc["reg"], svc["m"]
    with reg.db.session() as s:
        for tc in ("2.49.40", "2.51.0", "2.52.0", "2.53.0", "2.54.0"):
            add_artifact(s, m, target="SM8650", toolchain=tc)
        for soc in ("SM8750", "SM8550"):
            add_artifact(s, m, target=soc, toolchain="2.40.0")
    device = Device("qnn", load_catalog().get("SM8650", backend="qnn"), "2.45.0")
    with reg.db.session() as s:
        with pytest.raises(NoMatchError) as fast:
            resolve(SessionRows(s), m, device, model_label="m:stable")
    import dataclasses

    import registry.resolve as R

    real = R.candidates
    # No count with the SoC's own candidates: the miss reads every target's, as it did before the count.
    monkeypatch.setattr(R, "candidates", lambda *a, **k: [dataclasses.replace(c, total=None) for c in real(*a, **k)])
    with reg.db.session() as s, pytest.raises(NoMatchError) as full:
        resolve(SessionRows(s), m, device, model_label="m:stable")
    assert (fast.value.message, fast.value.hint) == (full.value.message, full.value.hint)
    assert fast.value.details == full.value.details and len(fast.value.details["nearest"]) == 5
    assert "none of the 8 qnn artifact(s)" in fast.value.message  # 6 of SM8650, one each of the others


def test_a_kept_answer_is_read_on_the_event_loop(svc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a question asked again goes to no thread (its generation read on the event loop,
    ``LoopReader``) while the generation holds; a change goes to the threads and is answered; a
    dropped connection answers from the threads and the loop reads on a new one after."""
    if svc["reg"].db.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    from sqlalchemy import text

    from farm.api.routes import resolve as route

    threads = []
    real = route._answer

    def counting(*a: Any, **kw: Any) -> Any:
        threads.append(a[2])
        return real(*a, **kw)

    monkeypatch.setattr(route, "_answer", counting)
    c, reg = svc["c"], svc["reg"]
    first = c.get(Q)
    etag = first.headers["etag"]
    assert len(threads) == 1  # first asked: the threads
    for _ in range(3):
        assert c.get(Q).content == first.content and _poll(c, etag).status_code == 304
    assert len(threads) == 1  # asked again: the loop
    with reg.db.session() as s:
        record_verdict(s, svc["first"], "qnn", "2.51.0", "fails", "probe", "crash")
    r = c.get(Q)
    assert len(threads) == 2 and r.status_code == 404  # the generation moved: the threads
    assert c.get(Q).status_code == 404 and len(threads) == 2  # the kept miss, from the loop

    with reg.db.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    assert c.get(Q).status_code == 404 and len(threads) == 3  # the loop's connection was dead: the threads
    assert c.get(Q).status_code == 404 and len(threads) == 3  # and a new one reads on the loop


def test_resolve_connections_are_open_before_the_first_question(svc: dict[str, Any]) -> None:
    """PostgreSQL: at start the service opens one resolve connection per resolve thread (each has
    planned every table's read) and the loop's own; a device's first questions open none."""
    if svc["reg"].db.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    from farm.api.routes import resolve as route

    state = svc["c"].app.state
    assert state.resolve_reader.pool.checkedin() == route.RESOLVE_THREADS
    assert state.resolve_loop_reader.conn is not None and not state.resolve_loop_reader.conn.closed
    opened = state.resolve_reader.pool.checkedin()
    for _ in range(3):
        assert svc["c"].get(Q).status_code == 200
    assert state.resolve_reader.pool.checkedin() == opened  # none opened by the questions
