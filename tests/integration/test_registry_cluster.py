"""The registry on real services: PostgreSQL index + S3 (SeaweedFS) blobs, and the same tests on
SQLite + local blobs. Real QNN compiles of small models."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import pytest

from farm.core.errors import DigestMismatchError, NoMatchError, SignatureError, TagConflictError, UnsignedError
from farm.core.settings import Settings
from farm.pipeline.plan import build
from registry.index import Registry, find_artifact, record_verdict, resolve_model_ref, signatures_of
from registry.install import fetch_artifact
from registry.resolve import Device, resolve
from registry.verify import gc, verify
from tests.common.cli import farm
from tests.common.onnx_models import conv_relu_add, light
from tests.common.registry_state import snapshot
from tests.common.store import FailingBlobStore


def device(soc: str, runtime: str) -> Device:
    from farm.core.catalog import load_catalog

    return Device("qnn", load_catalog().get(soc, backend="qnn"), runtime)


def test_build_resolve_fetch_load(cluster_settings: Settings, cluster_env: dict[str, str], tmp_path: Path) -> None:
    out = json.loads(farm(cluster_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                          "--name", "squeezenet", "--tag", "stable", "--json").stdout)
    assert [b["state"] for b in out["builds"]] == ["built", "built"]
    again = json.loads(farm(cluster_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                            "--name", "squeezenet", "--tag", "stable", "--json").stdout)
    assert [b["state"] for b in again["builds"]] == ["cached", "cached"]
    got = json.loads(farm(cluster_env, "fetch", "--model", "squeezenet:stable", "--soc", "SM8750", "--qnn", "2.51.0",
                          "--out", str(tmp_path / "dev"), "--load-check", "--json").stdout)
    assert got["artifact"] == out["builds"][1]["artifact"] and got["load"]["load_seconds"] > 0
    if cluster_settings.store_url.startswith("s3://"):
        res = json.loads(farm(cluster_env, "resolve", "--model", "squeezenet:stable", "--soc", "SM8650",
                              "--qnn", "2.51.0", "--presign", "120", "--json").stdout)
        import urllib.request

        import zstandard

        from farm.core.keys import sha256_bytes

        for f in res["files"]:
            with urllib.request.urlopen(f["url"], timeout=10) as r:
                body, encoding = r.read(), r.headers.get("Content-Encoding")
            # The .bin is stored compressed (it shrinks ~70x): the URL serves the zstd frame and
            # says so, in the header and in the resolve answer.
            assert encoding == f.get("encoding")
            data = zstandard.ZstdDecompressor().decompress(body) if encoding == "zstd" else body
            assert len(data) == f["size"] and sha256_bytes(data) == f["digest"]
        assert [f.get("encoding") for f in res["files"] if f["name"].endswith(".bin")] == ["zstd"]
        # Without --json too: each file with its URL, and the manifest's.
        text = farm(cluster_env, "resolve", "--model", "squeezenet:stable", "--soc", "SM8650", "--qnn", "2.51.0",
                    "--presign", "120").stdout
        assert all(f["name"] in text and "http" in line for f in res["files"]
                   for line in text.splitlines() if f["name"] in line)
        assert "picked by probe: loaded under QNN 2.51.0" in text and "manifest  http" in text


def test_device_older_than_every_build_gets_the_build_it_needs(cluster_settings: Settings) -> None:
    build(cluster_settings, light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable")
    reg = Registry.open(cluster_settings)
    try:
        with reg.db.session() as s:
            digest = resolve_model_ref(s, "sq:stable")
            with pytest.raises(NoMatchError) as exc:
                resolve(s, digest, device("SM8650", "2.49.40"), model_label="sq:stable")
    finally:
        reg.close()
    assert "QNN 2.51.0, newer than the runtime 2.49.40" in (exc.value.hint or "")
    assert "a build for SM8650 with QNN <= 2.49.40" in (exc.value.hint or "")
    assert exc.value.details["nearest"][0]["toolchain"] == "2.51.0"


def test_probe_evidence_beats_the_rule(cluster_settings: Settings) -> None:
    (o,) = build(cluster_settings, light("squeezenet"), ["qnn:SM8650"], name="sq").outcomes
    reg = Registry.open(cluster_settings)
    try:
        with reg.db.session() as s:
            art = find_artifact(s, o.artifact or "")
            digest = art.model_digest
            _, v = resolve(s, digest, device("SM8650", "2.51.0"))
            # The executor loaded the fresh context under its own toolchain: evidence from the start.
            assert (v.loads, v.source) == (True, "probe")
            record_verdict(s, art.id, "qnn", "2.51.0", "fails", "probe", "QNN_CONTEXT_ERROR_INVALID_ARGUMENT")
        with reg.db.session() as s:
            with pytest.raises(NoMatchError) as exc:
                resolve(s, digest, device("SM8650", "2.51.0"))
            assert "probe: failed to load" in (exc.value.hint or "")
            record_verdict(s, art.id, "qnn", "2.51.0", "loads", "probe")
        with reg.db.session() as s:
            _, v = resolve(s, digest, device("SM8650", "2.51.0"))
            assert (v.loads, v.source) == (True, "probe")
    finally:
        reg.close()


def test_tags_move_digests_stay(cluster_settings: Settings, tmp_path: Path) -> None:
    from sqlalchemy import select

    from registry.models import TagEvent

    a = conv_relu_add(tmp_path / "a.onnx", seed=1)
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    b = conv_relu_add(b_dir / "a.onnx", seed=2)
    ra = build(cluster_settings, a, ["qnn:SM8650"], name="net", tag="stable")
    with pytest.raises(TagConflictError):  # a tag moves to another model only on purpose
        build(cluster_settings, b, ["qnn:SM8650"], name="net", tag="stable")
    rb = build(cluster_settings, b, ["qnn:SM8650"], name="net", tag="stable", force_tag=True)
    assert ra.model_digest != rb.model_digest
    assert rb.tag_moved == {"tag": "net:stable", "from": ra.model_digest, "to": rb.model_digest}
    reg = Registry.open(cluster_settings)
    try:
        with reg.db.session() as s:
            assert resolve_model_ref(s, "net:stable") == rb.model_digest
            assert resolve_model_ref(s, ra.model_digest) == ra.model_digest
            events = s.scalars(select(TagEvent).where(TagEvent.name == "net").order_by(TagEvent.id)).all()
            assert [(e.previous_digest, e.model_digest) for e in events] == [
                (None, ra.model_digest), (ra.model_digest, rb.model_digest)]
            art, _ = resolve(s, resolve_model_ref(s, "net:stable"), device("SM8650", "2.51.0"))
            assert art.digest == rb.outcomes[0].artifact
    finally:
        reg.close()


def test_signed_artifacts(cluster_settings: Settings, tmp_path: Path) -> None:
    from registry.signing import create_key

    pub = create_key(tmp_path / "release.key")
    other = create_key(tmp_path / "other.key")
    signed = dataclasses.replace(cluster_settings, signing_key=str(tmp_path / "release.key"))
    (o,) = build(signed, light("squeezenet"), ["qnn:SM8650"], name="sq").outcomes
    (u,) = build(cluster_settings, light("squeezenet"), ["qnn:SM8750"], name="sq").outcomes  # unsigned
    reg = Registry.open(cluster_settings)
    try:
        with reg.db.session() as s:
            art, unsigned = find_artifact(s, o.artifact or ""), find_artifact(s, u.artifact or "")
            sigs = signatures_of(s, art.digest)
            s.expunge_all()
        got = fetch_artifact(reg.store, art, tmp_path / "ok", signatures=sigs, trusted=[pub], require_signature=True)
        assert got.signed_by and got.ctx_model.exists()
        with pytest.raises(UnsignedError):
            fetch_artifact(reg.store, unsigned, tmp_path / "u", signatures=[], trusted=[pub], require_signature=True)
        with pytest.raises(SignatureError):
            fetch_artifact(reg.store, art, tmp_path / "o", signatures=sigs, trusted=[other], require_signature=True)
        forged = [(p, sig[:-4] + ("AAA=" if not sig.endswith("AAA=") else "BBB=")) for p, sig in sigs]
        with pytest.raises(SignatureError):
            fetch_artifact(reg.store, art, tmp_path / "f", signatures=forged, trusted=[pub], require_signature=True)
        assert not (tmp_path / "u").exists() or not any((tmp_path / "u").iterdir())
    finally:
        reg.close()


def _tamper(settings: Settings, reg: Registry, digest: str) -> None:
    """Replace a stored blob's bytes in place, behind the registry's back."""
    from registry.store.base import blob_key

    if settings.store_url.startswith("s3://"):
        store = reg.store
        store.client.put_object(Bucket=store.bucket, Key=store._key(blob_key(digest)),  # type: ignore[attr-defined]
                                Body=b"evil bytes")
    else:
        path = reg.store.path_of(digest)  # type: ignore[attr-defined]
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        path.write_bytes(bytes(data))


def test_tampering_is_caught_by_verify_and_fetch(cluster_settings: Settings, tmp_path: Path) -> None:
    (o,) = build(cluster_settings, light("squeezenet"), ["qnn:SM8650"], name="sq").outcomes
    reg = Registry.open(cluster_settings)
    try:
        with reg.db.session() as s:
            assert verify(s, reg.store).ok
            art = find_artifact(s, o.artifact or "")
            bin_digest = next(f.digest for f in art.files if f.role == "context")
            s.expunge_all()
        _tamper(cluster_settings, reg, bin_digest)
        with pytest.raises(DigestMismatchError):
            fetch_artifact(reg.store, art, tmp_path / "dev")
        assert not (tmp_path / "dev").exists(), "a failed fetch leaves nothing behind"
        with reg.db.session() as s:
            rep = verify(s, reg.store, repair=True)
        assert [(p.file, p.problem) for p in rep.problems] in (
            [("model_ctx_qnn.bin", "digest")], [("model_ctx_qnn.bin", "size")])
        assert rep.marked_broken == [art.digest]
        with reg.db.session() as s, pytest.raises(NoMatchError):
            resolve(s, art.model_digest, device("SM8650", "2.51.0"))
    finally:
        reg.close()


def test_crash_mid_publication_leaves_no_row_and_gc_sweeps(cluster_settings: Settings, tmp_path: Path) -> None:
    import dataclasses

    from farm.core.keys import sha256_file

    model = conv_relu_add(tmp_path / "m.onnx")
    once = dataclasses.replace(cluster_settings, max_attempts=1)  # no in-run retry: see the failure
    reg = Registry.open(cluster_settings)
    try:
        healthy = reg.store
        # put #1 stores the model snapshot; the artifact's blobs upload concurrently and one of
        # them (the 3rd put) fails: whatever the others stored is orphaned, nothing is indexed.
        reg.store = FailingBlobStore(healthy, fail_on_put=3)  # type: ignore[assignment]
        (o,) = build(once, model, ["qnn:SM8650"], registry=reg).outcomes
        assert (o.state, o.error_code) == ("failed", "storage-error")
        assert "injected failure" in (o.error_message or "")
        reg.store = healthy
        state = snapshot(cluster_settings)
        assert state["rows"]["artifacts"] == 0 and state["rows"]["artifact_files"] == 0
        snapshot_blob = sha256_file(model)[0]
        orphans = [b for b in state["blobs"] if b != snapshot_blob]
        assert snapshot_blob in state["blobs"] and orphans, "the blobs uploaded beside the failed one"
        with reg.db.session() as s:
            kept = gc(s, reg.store, grace=timedelta(hours=1))
            assert kept.deleted == [] and kept.kept_young == len(orphans), "a young orphan may be an upload in flight"
            swept = gc(s, reg.store, grace=timedelta(0))
            assert sorted(swept.deleted) == sorted(orphans), "the model snapshot is referenced by its row: kept"
        # storage trouble is an infrastructure failure: the next submission retries and publishes.
        (o2,) = build(cluster_settings, model, ["qnn:SM8650"], registry=reg).outcomes
        assert o2.state == "built" and o2.build_id == o.build_id
        with reg.db.session() as s:
            assert verify(s, reg.store).ok
            assert gc(s, reg.store, grace=timedelta(0)).deleted == []
    finally:
        reg.close()


def test_coverage_matrix_and_missing(cluster_settings: Settings, cluster_env: dict[str, str], tmp_path: Path) -> None:
    from tests.common.onnx_models import partly_unsupported

    build(cluster_settings, light("squeezenet"), ["qnn:SM8650", "qnn:SM8550"], name="sq", tag="stable")
    # A time limit no compile meets: a deterministic failure (resource-limit), answered from the index.
    build(dataclasses.replace(cluster_settings, compile_timeout=0.01), partly_unsupported(tmp_path / "p.onnx"),
          ["qnn:SM8650"], name="partial", tag="stable")
    cov = json.loads(farm(cluster_env, "coverage", "--json").stdout)
    cells = {(",".join(c["tags"]), c["target"], c["toolchain"]): c["state"] for c in cov["cells"]}
    assert cells == {("sq:stable", "qnn:SM8650", "2.51.0"): "built", ("sq:stable", "qnn:SM8550", "2.51.0"): "built",
                     ("partial:stable", "qnn:SM8650", "2.51.0"): "failed"}
    assert {c["model"] for c in cov["cells"]} == {m["digest"] for m in cov["models"]} and len(cov["models"]) == 2
    text = farm(cluster_env, "coverage").stdout
    assert "failed(resource-limit)" in text and "QNN 2.51.0" in text.upper()
    missing = farm(cluster_env, "coverage", "--missing", "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--json",
                   check=False)
    assert missing.returncode == 1
    rows = {(",".join(r["tags"]), r["target"]): r["state"] for r in json.loads(missing.stdout)}
    assert rows == {("sq:stable", "qnn:SM8750"): "missing", ("partial:stable", "qnn:SM8650"): "failed(resource-limit)",
                    ("partial:stable", "qnn:SM8750"): "missing"}


def test_migrations_match_models_on_this_database(cluster_settings: Settings) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from registry.db import SCHEMA_HEAD, Database, current_revision, metadata

    db = Database(cluster_settings.database_url)
    try:
        assert current_revision(db.engine) == SCHEMA_HEAD
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        assert diff == []
    finally:
        db.dispose()
