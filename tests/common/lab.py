"""Device lab evidence made in a test through the registry's own path: a device enrolled with a
real Ed25519 key (``registry.devices``), a job leased (``registry.verification.lease``) and its
report signed with that key and accepted (``registry.verification.accept``: the signature, the
body's shape, the lease's nonce, the enrolled SoC are all checked as for an agent's POST)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session


@dataclass
class LabDevice:
    name: str
    row: Any  # registry.models.Device
    key: Any  # the Ed25519 private key it enrolled the public half of
    bearer: str


def key_pair() -> tuple[Any, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, base64.b64encode(raw).decode()


def enroll_device(s: Session, name: str, soc: str = "SM8650", arch: str = "aarch64") -> LabDevice:
    from registry.devices import create_enrollment, enroll

    key, pub = key_pair()
    row, bearer = enroll(s, create_enrollment(s, name).token, pub, soc, {"arch": arch})
    return LabDevice(name, row, key, bearer)


def signed(dev: LabDevice, lease: Any, **over: Any) -> tuple[str, str]:
    """The canonical body of a report on ``lease`` and its signature by ``dev``'s key."""
    from farm.core.signed_reports import canonical, message

    body = {"job": lease.job_id, "nonce": lease.nonce, "device": dev.name, "artifact": lease.artifact,
            "soc": lease.soc, "outcome": "ok", "runs": 5, **over}
    text = canonical({k: v for k, v in body.items() if v is not None})
    return text, base64.b64encode(dev.key.sign(message(text))).decode()


def report_next(s: Session, dev: LabDevice, figures: dict[str, dict[str, Any]], socs: list[str] | None = None
                ) -> tuple[str, Any]:
    """``dev`` leases its next job and reports on it with ``figures[the job's artifact]`` (as a
    device does: what it measured depends on what it was given). Returns (artifact, row)."""
    from registry.verification import accept, lease

    got = lease(s, dev.row, socs)
    assert got is not None, f"no job for {dev.name}"
    text, sig = signed(dev, got, **figures[got.artifact])
    row, created = accept(s, dev.row, got.job_id, text, sig)
    assert created
    return got.artifact, row
