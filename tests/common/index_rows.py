"""Builders for index rows (models, builds, artifacts) with valid digests, for tests that need a
populated index without running a compile."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from farm.core.catalog import parse_target
from farm.core.keys import build_key, options_digest, sha256_bytes
from farm.core.options import normalize
from farm.pipeline import states
from farm.pipeline.states import BuildSpec
from registry.index import insert_artifact, record_model
from registry.models import Artifact, Model

_seq = itertools.count()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def digest(label: str) -> str:
    return sha256_bytes(label.encode())


def default_options(backend: str, target: str) -> tuple[dict[str, Any], str]:
    opts = normalize(backend, {}, parse_target(f"{backend}:{target}"))
    return opts, options_digest(opts)


def add_model(session: Session, label: str = "model", name: str = "model") -> Model:
    d = digest(label)
    return record_model(session, digest=d, onnx_digest=digest(label + ".onnx"), size=1,
                        files=[{"path": f"{name}.onnx", "digest": digest(label + ".onnx"), "size": 1}], name=name)


def spec(model_digest: str, *, backend: str = "qnn", target: str = "SM8650", toolchain: str = "2.51.0",
         options: dict[str, Any] | None = None) -> BuildSpec:
    opts = normalize(backend, options or {}, parse_target(f"{backend}:{target}"))
    od = options_digest(opts)
    return BuildSpec(build_key(model_digest, backend, target, toolchain, od), model_digest, backend, target,
                     toolchain, opts, od)


def add_artifact(session: Session, model_digest: str, *, target: str = "SM8650", toolchain: str = "2.51.0",
                 options: dict[str, Any] | None = None, created_at: datetime | None = None,
                 status: str = "active", backend: str = "qnn") -> Artifact:
    """Queue, claim and publish a build the way the executor does, minus the compile and blobs."""
    s = spec(model_digest, backend=backend, target=target, toolchain=toolchain, options=options)
    build_id, queued = states.enqueue(session, s, None)
    assert queued
    claim = states.claim(session, build_id, owner="test", lease_seconds=60, max_attempts=3)
    assert claim.action == "run" and claim.lease is not None, claim
    n = next(_seq)
    art = insert_artifact(
        session, build_id, manifest_digest=digest(f"manifest-{n}"), manifest_size=10, ctx_model="m_ctx.onnx",
        files=[{"name": "m_ctx.onnx", "role": "ctx-model", "digest": digest(f"ctx-{n}"), "size": 100,
                "mediaType": "application/octet-stream"}],
        ep_sdk_version=toolchain, compile_seconds=1.0, nodes_ep=1, nodes_cpu=0)
    states.succeed(session, claim.lease, log="ok")
    art.created_at = created_at or (T0 + timedelta(minutes=n))
    art.status = status
    session.flush()
    return art
