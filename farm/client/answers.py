"""What a device accepts as an answer to its question: the question itself (the model, the
backend, the SoC or GPU, the runtime it can load), a resolve answer held to its shape and bound
to that question, the manifest fetched by the answer's digest held to its shape, checked and
bound to the answer, and the signatures over that digest by a key the device trusts.

A malformed answer is ``server-error``; a malformed manifest, or one that is not for what the
answer said, is ``bad-manifest`` (the service sent a document this client refuses).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from farm.client import shapes
from farm.client.transport import HINT_SERVER, parse_json
from farm.core.errors import (
    ManifestError,
    MissingExtraError,
    ServerError,
    SignatureError,
    UnsignedError,
    UsageError,
)
from farm.core.keys import is_digest, parse_version
from farm.core.untrusted import (
    check_digest,
    check_manifest,
    check_size,
    check_target_name,
    check_version,
    shown,
)

MAX_MANIFEST_BYTES = shapes.MAX_MANIFEST_BYTES
MAX_SIGNATURES = shapes.MAX_SIGNATURES


@dataclass(frozen=True)
class Question:
    """What a device asked for; the answer must be for exactly this."""

    model: str
    backend: str
    target: str  # canonical name where the local catalog knows it, else as given
    runtime: str  # QNN SDK version, or TensorRT version
    platform: str | None = None  # TensorRT: the device's OS-CPU


def question(model: str, soc: str | None, qnn: str | None, gpu: str | None, trt: str | None,
              platform: str) -> Question:
    from farm.core.catalog import load_catalog
    from farm.core.errors import UnknownTargetError

    if not isinstance(model, str) or not model or len(model) > 300:
        raise UsageError("which model? give NAME:TAG, NAME or a model digest")
    backend, device, runtime = ("trt", gpu, trt) if (gpu or trt) else ("qnn", soc, qnn)
    if not device or not runtime:
        raise UsageError("a device is described by --soc and --qnn (or --gpu and --trt)",
                         hint="e.g. --soc SM8650 --qnn 2.51.0 (or --detect to read the QNN version installed here)")
    try:
        target = load_catalog().get(device, backend=backend).name
    except UnknownTargetError:
        target = device  # a SoC newer than this client's catalog: the service may know it
    return Question(model, backend, target, runtime, platform if backend == "trt" else None)


def check_answer(res: Any, q: Question) -> dict[str, Any]:
    """A resolve answer: every field used of its type and form (``shapes.RESOLVE_ANSWER``),
    and that it answers ``q``."""
    shapes.conform(res, shapes.RESOLVE_ANSWER, "the resolve answer", ServerError, HINT_SERVER)
    try:
        check_digest(res["artifact"], "the answer's artifact")
        check_digest(res["model"], "the answer's model")
        check_target_name(res["target"], "the answer's target")
        check_version(res["toolchain"], "the answer's toolchain")
        check_size(res["manifest_size"], "the answer's manifest_size", limit=MAX_MANIFEST_BYTES)
    except ManifestError as exc:
        raise ServerError(f"the resolve answer is malformed: {exc.message}", hint=HINT_SERVER) from None

    def refuse(what: str) -> ServerError:
        return ServerError(f"the service answered for {what}: not installing", hint=HINT_SERVER)

    if res["backend"] != q.backend:
        raise refuse(f"backend {shown(res['backend'])}, this device asked for {q.backend}")
    if is_digest(q.model) and res["model"] != q.model:
        raise refuse(f"model {res['model']}, this device asked for {q.model}")
    if q.backend == "qnn":
        # A QNN context serves the SoCs it was built for (several for a multi-SoC target), and
        # only a runtime at least as new as the SDK that built it.
        if q.target.lower() not in {s.lower() for s in res["target"].split("+")}:
            raise refuse(f"target {shown(res['target'])}, this device is {q.target}")
        if parse_version(res["toolchain"]) > parse_version(q.runtime):
            raise refuse(f"QNN {shown(res['toolchain'])}, newer than this device's runtime {q.runtime}")
    else:
        built, _, built_platform = res["toolchain"].partition("+")
        if parse_version(built) != parse_version(q.runtime) or (built_platform and built_platform != q.platform):
            raise refuse(f"TensorRT {shown(res['toolchain'])}, this device runs {q.runtime}+{q.platform}")
    return res


def checked_manifest(data: bytes, artifact: str) -> dict[str, Any]:
    """The manifest's bytes (already checked to hash to ``artifact``) as a manifest: JSON, of
    its shape (``shapes.MANIFEST``), every name, digest and size checked
    (``farm.core.untrusted.check_manifest``). Raises ManifestError."""
    doc = parse_json(data, f"manifest {artifact[7:19]}", ManifestError)
    shapes.conform(doc, shapes.MANIFEST, f"manifest {artifact[7:19]}", ManifestError, HINT_SERVER)
    try:
        return check_manifest(doc)
    except ManifestError as exc:
        raise ManifestError(exc.message, hint=HINT_SERVER) from None


def check_manifest_binding(manifest: dict[str, Any], res: dict[str, Any], q: Question) -> None:
    """The manifest (the signed document) says what the answer said, and for a TensorRT engine
    built for another GPU, that it was built hardware-compatible."""
    got = (manifest["model"], manifest["backend"], manifest["target"]["name"], manifest["toolchain"]["version"])
    want = (res["model"], res["backend"], res["target"], res["toolchain"])
    if got != want:
        diffs = [f"{k}: manifest {shown(g)} != answer {shown(w)}"
                 for k, g, w in zip(("model", "backend", "target", "toolchain"), got, want, strict=True) if g != w]
        raise ManifestError("the manifest is not for what the service answered (" + "; ".join(diffs) + ")",
                            hint=HINT_SERVER)
    if q.backend == "trt" and manifest["target"]["name"].lower() != q.target.lower():
        options = manifest.get("options") or {}
        if options.get("hardware_compatibility_level") != "ampere_plus":
            raise ManifestError(f"the engine is built for {shown(manifest['target']['name'])}, not for this "
                                f"device's {q.target}, and not hardware-compatible", hint=HINT_SERVER)


def check_signatures(artifact: str, sigs: Any, trusted: list[str], *, required: bool,
                     allow_unsigned: bool) -> str | None:
    """The signing key's short id when a signature in ``sigs`` (as the service sent them: held to
    ``shapes.SIGNATURES`` first, whatever the policy) verifies over ``artifact`` with a
    ``trusted`` key; None where none is asked for (no trusted key, not required) or unsigned
    artifacts are allowed. unsigned / signature-invalid otherwise."""
    shapes.conform(sigs, shapes.SIGNATURES, "the signatures", ServerError, HINT_SERVER)
    if not trusted and not required:
        return None
    if not sigs:
        if required or not allow_unsigned:
            raise UnsignedError(f"artifact {artifact} carries no signature",
                                hint="nothing was installed; ask the service's operators to sign it, or accept "
                                     "unsigned artifacts on this device (--allow-unsigned / FARM_ALLOW_UNSIGNED=1)")
        return None
    import base64

    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError:
        raise MissingExtraError("checking signatures needs the cryptography package",
                                hint="pip install cryptography") from None
    for s in sigs:
        if s.get("public_key") not in trusted:
            continue
        try:
            key = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(s["public_key"]))
            key.verify(base64.b64decode(s["signature"]), b"ctxfarm-manifest-v1\n" + artifact.encode())
        except (InvalidSignature, ValueError):
            continue
        return hashlib.sha256(base64.b64decode(s["public_key"])).hexdigest()[:16]
    raise SignatureError(f"artifact {artifact}: no signature verifies with a trusted key",
                         hint="nothing was installed: the artifact is not signed by a key this device trusts "
                              "(FARM_TRUSTED_KEYS)")
