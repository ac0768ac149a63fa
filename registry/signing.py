"""ed25519 signatures over manifest digests (``cryptography``), attached to the artifact by subject.

The signed message is ``b"ctxfarm-manifest-v1\\n" + digest``: a signature for one artifact can't
be replayed for another, and the manifest digest covers every file digest.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from farm.core.errors import ConfigError, MissingExtraError, SignatureError, UnsignedError

DOMAIN = b"ctxfarm-manifest-v1\n"


def _crypto():  # type: ignore[no-untyped-def]
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError:
        from farm.core.extras import install_hint

        raise MissingExtraError("signing needs the cryptography package", hint=install_hint("sign")) from None
    return serialization, ed25519


def key_id(public_b64: str) -> str:
    try:
        raw = base64.b64decode(public_b64, validate=True)
    except ValueError:
        raw = public_b64.encode("utf-8", "replace")  # a garbage key still gets a stable id to show
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Signer:
    private_key: object
    public_b64: str

    @property
    def key_id(self) -> str:
        return key_id(self.public_b64)

    def sign(self, manifest_digest: str) -> str:
        sig: bytes = self.private_key.sign(DOMAIN + manifest_digest.encode())  # type: ignore[attr-defined]
        return base64.b64encode(sig).decode()


def create_key(path: Path) -> str:
    """Write a new private key (PEM, mode 0600) and return its public key (base64)."""
    serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = _public_b64(key)
    path.with_suffix(path.suffix + ".pub").write_text(pub + "\n")
    return pub


def _public_b64(key: object) -> str:
    serialization, _ = _crypto()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # type: ignore[attr-defined]
    return base64.b64encode(raw).decode()


def load_signer(path: str | Path) -> Signer:
    serialization, ed25519 = _crypto()
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"FARM_SIGNING_KEY {path}: cannot load an ed25519 private key ({exc})",
                          hint="create one with `farm keys create PATH`") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"FARM_SIGNING_KEY {path} is not an ed25519 key")
    return Signer(key, _public_b64(key))


def verify(public_b64: str, manifest_digest: str, signature_b64: str) -> bool:
    from cryptography.exceptions import InvalidSignature

    _, ed25519 = _crypto()
    try:
        pub = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(public_b64))
        pub.verify(base64.b64decode(signature_b64), DOMAIN + manifest_digest.encode())
        return True
    except (InvalidSignature, ValueError):
        return False


def check(manifest_digest: str, signatures: list[tuple[str, str]], trusted: list[str], *, required: bool) -> str | None:
    """Accept when a signature by a trusted key verifies. Returns the key id that verified.

    ``signatures``: (public key b64, signature b64) pairs attached to the artifact.
    """
    if not signatures:
        if required:
            raise UnsignedError(f"artifact {manifest_digest} carries no signature and one is required")
        return None
    trusted_set = set(trusted)
    for pub, sig in signatures:
        if pub in trusted_set and verify(pub, manifest_digest, sig):
            return key_id(pub)
    if required or trusted_set:
        ids = ", ".join(key_id(p) for p, _ in signatures)
        raise SignatureError(f"artifact {manifest_digest}: no signature verifies with a trusted key (signed by: {ids})")
    return None
